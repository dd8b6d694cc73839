"""Make the bundled sample film and dub track (`data/sample_film.mp4`, `data/sample_dub.wav`, `data/sample_film.json`).

The film: 23.976 fps (24000/1001), 320x180, H.264 + AAC (English speech, language tag `eng`), five shots
with hard cuts at known frames, each a slow pan/zoom: three over real talking heads with their own recorded
speech (`tests/data/talking/head{2,4,3}.mp4`, see tests/data/README.md: one person speaks in each), two over
public-domain photos shipped with scikit-image (the coffee cup and the rocket: no face, no dialogue),
including one very short shot. The dub: different speech (Spanish voice) of exactly the picture's
duration, 16 kHz mono WAV.

Requirements (for this script only, not runtime dependencies): scikit-image (the dev extra) and espeak-ng
(`apt-get install -y espeak-ng`) for the dub; without espeak-ng a formant-synthesised babble is used
instead. `--film-only` keeps the committed dub track. Run from the repository root:

    python data/make_sample.py [--film-only]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import soundfile as sf
from PIL import Image

OUT = Path(__file__).resolve().parent
TALKING = OUT.parent / "tests" / "data" / "talking"  # 256x256, 25 fps talking heads with their own audio
SEED_FPS = 25
FPS = Fraction(24000, 1001)
SIZE = (320, 180)  # width, height
SR = 16000

# (source, frames, start box, end box): boxes are (cx, cy, width) in source pixels; height follows 16:9.
# A "headN" source is a talking head played in real time (its frame at the film frame's time) with its audio.
SHOTS = [
    ("head2", 60, (128, 120, 256), (128, 110, 200)),  # slow zoom in on the speaker
    ("coffee", 70, (250, 200, 400), (350, 200, 400)),  # pan across a cup: no face
    ("rocket", 12, (213, 300, 300), (213, 280, 280)),  # a very short shot: no face
    ("head4", 68, (110, 120, 230), (146, 120, 230)),  # pan across the speaker
    ("head3", 78, (128, 118, 200), (128, 128, 256)),  # zoom out from a close-up
]

DUB_TEXT = (
    "Houston, aquí la tripulación. Esta noche vemos la costa con claridad. "
    "El café aquí arriba es malo, pero la vista lo compensa. Cambio y corto."
)


def _image(name: str) -> np.ndarray:
    import skimage.data

    img = getattr(skimage.data, name)()
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return img[..., :3].astype(np.uint8)


def _talking(name: str) -> tuple[np.ndarray, np.ndarray]:
    """A talking head's frames (N, 256, 256, 3) and its mono audio at SR."""
    ff = imageio_ffmpeg.get_ffmpeg_exe()
    path = str(TALKING / f"{name}.mp4")
    raw = subprocess.run([ff, "-v", "error", "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                         capture_output=True, check=True).stdout  # fmt: skip
    pcm = subprocess.run([ff, "-v", "error", "-i", path, "-ac", "1", "-ar", str(SR), "-f", "f32le", "-"],
                         capture_output=True, check=True).stdout  # fmt: skip
    return np.frombuffer(raw, np.uint8).reshape(-1, 256, 256, 3), np.frombuffer(pcm, np.float32)


def _frame(img: np.ndarray, cx: float, cy: float, width: float) -> np.ndarray:
    h_img, w_img = img.shape[:2]
    height = width * SIZE[1] / SIZE[0]
    x0 = min(max(cx - width / 2, 0), w_img - width)
    y0 = min(max(cy - height / 2, 0), h_img - height)
    box = (x0, y0, x0 + width, y0 + height)
    return np.asarray(Image.fromarray(img).resize(SIZE, Image.BICUBIC, box=box))


def render() -> tuple[list[np.ndarray], list[int], np.ndarray]:
    """The film's frames, its cut frames and its dialogue (the talking heads' own speech, silence elsewhere)."""
    frames, cuts, audio = [], [], []
    for name, n, a, b in SHOTS:
        clip, voice = _talking(name) if name.startswith("head") else (None, None)
        img = None if clip is not None else _image(name)
        cuts.append(len(frames))
        for i in range(n):
            t = i / max(n - 1, 1)
            t = t * t * (3 - 2 * t)  # ease in/out
            src = img if clip is None else clip[min(len(clip) - 1, round(i / FPS * SEED_FPS))]
            frames.append(_frame(src, *(pa + (pb - pa) * t for pa, pb in zip(a, b, strict=True))))
        start, stop = round(cuts[-1] / FPS * SR), round(len(frames) / FPS * SR)
        part = np.zeros(stop - start, np.float32)
        if voice is not None:
            got = voice[: stop - start]
            part[: len(got)] = got
        audio.append(part)
    return frames, cuts[1:], np.concatenate(audio)


def speak(text: str, voice: str, seconds: float) -> np.ndarray:
    """espeak-ng speech (or babble) as float32 mono at SR, padded/trimmed to exactly `seconds`."""
    n = round(seconds * SR)
    if shutil.which("espeak-ng"):
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "s.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", "140", "-w", str(wav), text], check=True)
            raw = Path(tmp) / "raw.wav"
            ff = imageio_ffmpeg.get_ffmpeg_exe()
            subprocess.run(
                [ff, "-v", "error", "-y", "-i", str(wav), "-ac", "1", "-ar", str(SR), str(raw)], check=True
            )
            x, _ = sf.read(raw, dtype="float32")
    else:
        x = _babble(seconds, seed=0 if voice.startswith("en") else 1)
    x = x[:n]
    lead = min(int(0.3 * SR), n - len(x)) if len(x) < n else 0
    out = np.zeros(n, np.float32)
    out[lead : lead + len(x)] = x
    peak = np.abs(out).max()
    return out * (0.7 / peak) if peak > 0 else out


def _babble(seconds: float, seed: int) -> np.ndarray:
    """Formant-synthesised syllables: a fallback when espeak-ng is missing."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    f0 = 120 + 20 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    src = sum(np.sin(k * phase) / k for k in range(1, 30))
    env = (np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)) > -0.2).astype(np.float32)
    return (src * env * 0.2).astype(np.float32)


def main(film_only: bool = False) -> None:
    frames, cuts, dialogue = render()
    n = len(frames)
    duration = float(n / FPS)
    ff = imageio_ffmpeg.get_ffmpeg_exe()
    with tempfile.TemporaryDirectory() as tmp:
        orig = Path(tmp) / "orig.wav"
        sf.write(orig, dialogue, SR, subtype="PCM_16")
        film = OUT / "sample_film.mp4"
        cmd = [ff, "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{SIZE[0]}x{SIZE[1]}"]
        cmd += ["-framerate", f"{FPS.numerator}/{FPS.denominator}", "-i", "-", "-i", str(orig)]
        cmd += ["-map", "0:v", "-map", "1:a", "-c:v", "libx264", "-crf", "20", "-preset", "slow"]
        cmd += [
            "-pix_fmt",
            "yuv420p",
            "-g",
            "48",
            "-c:a",
            "aac",
            "-b:a",
            "64k",
            "-metadata:s:a:0",
            "language=eng",
        ]
        cmd += ["-movflags", "+faststart", str(film)]
        subprocess.run(cmd, input=b"".join(f.tobytes() for f in frames), check=True)
    if not film_only:
        sf.write(OUT / "sample_dub.wav", speak(DUB_TEXT, "es", duration), SR, subtype="PCM_16")
    shots = []
    edges = [0, *cuts, n]
    for i, ((name, *_), a, b) in enumerate(zip(SHOTS, edges[:-1], edges[1:], strict=True)):
        shots.append(
            {"index": i, "start_frame": a, "end_frame": b, "image": name, "face": name.startswith("head")}
        )
    meta = {
        "film": "sample_film.mp4",
        "dub": "sample_dub.wav",
        "fps": str(FPS),
        "frame_count": n,
        "duration_s": duration,
        "width": SIZE[0],
        "height": SIZE[1],
        "cut_frames": cuts,
        "shots": shots,
        "audio": {
            "film": "AAC, the talking heads' own English speech in shots 0, 3, 4 (silence elsewhere), language eng",
            "dub": f"{SR} Hz mono WAV, Spanish speech",
        },
        "sources": "talking heads: tests/data/talking (OpenTalker/video-retalking examples, Apache-2.0); "
        "scikit-image sample images (public domain: coffee, rocket); dub speech by espeak-ng",
        "made_by": "data/make_sample.py",
    }
    (OUT / "sample_film.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{n} frames, cuts at {cuts}, {duration:.3f} s")


if __name__ == "__main__":
    main(film_only="--film-only" in sys.argv[1:])
