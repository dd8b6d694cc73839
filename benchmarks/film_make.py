"""The multi-shot test film of `benchmarks/film_gpu.py`, composed from the committed real talking heads.

Shots (`SHOTS`, 10 shots, 64 s at full length): dialogue shots with real faces (`tests/data/talking`, five
people with their own recorded speech: a close-up of one speaker, or a speaker next to a listener whose
lips rest), two shots without a face (the seeds' background, panned) and a voice-over shot (two listeners;
speech on the track, nobody on screen speaking). 23.976 fps (24000/1001), H.264 with a fixed keyframe
interval of `GOP` frames and no scene-cut keyframes, so the cuts fall between keyframes (checked from the
packets' flags), the speakers' own speech as the film's AAC track. The dub track (16 kHz mono WAV of the
film's exact length) carries other people's speech (another seed's voice) in the dialogue and voice-over
shots and silence in the faceless ones, so the product's own planning should dub the dialogue shots and
copy the faceless and voice-over ones (`expect` per shot).

`make_film(dest, size, n_shots, film_s)` writes `film.mp4` + `dub.wav` and returns the manifest (shots,
cuts, keyframes). Frames are composed in numpy and streamed to the bundled ffmpeg, one frame at a time.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from tasks.media.ffmpeg import ffmpeg_exe, read_lines  # noqa: E402
from tasks.media.probe import parse_framecrc  # noqa: E402
from tests.speaker_cases import QUIET, seed_audio, seed_frames  # noqa: E402

FPS = Fraction(24000, 1001)
SEED_FPS = 25
SR = 16000
GOP = 96  # frames between keyframes (~4 s): a cut on a multiple of it is moved by one frame

# (kind, seconds, speaker seed, other seed): close = one speaker; left/right = the speaker on that side
# next to a listener (other); voice_over = two listeners (speaker, other), speech off screen; faceless.
SHOTS: list[tuple[str, float, int, int]] = [
    ("left", 7.0, 2, 1),
    ("faceless", 5.0, 3, 0),
    ("close", 8.0, 4, 0),
    ("voice_over", 6.0, 1, 5),
    ("right", 7.0, 3, 5),
    ("close", 6.5, 5, 0),
    ("close", 6.5, 1, 0),
    ("faceless", 4.0, 2, 0),
    ("left", 7.0, 3, 1),
    ("close", 7.0, 2, 0),
]
DUB_VOICE = {1: 3, 2: 4, 3: 5, 4: 1, 5: 2}  # the dub's speaker: another person's voice for each seed


@dataclass(frozen=True)
class FilmShot:
    index: int
    kind: str
    start_frame: int
    frames: int
    start_s: float
    end_s: float
    expect: str  # "dub" (a face speaks and the dub has speech) | "copy" (no face, or nobody on screen speaks)


def _pingpong(n_src: int, k: int) -> int:
    period = max(1, 2 * n_src - 2)
    k %= period
    return k if k < n_src else period - k


def _seed_index(i: int, t: float, listener: bool) -> int:
    """The seed frame shown at shot time t: talking frames back and forth, or the seed's quiet stretch."""
    if listener:
        a, b = QUIET[i]
        return a + _pingpong(b - a, round(t * SEED_FPS))
    return _pingpong(len(seed_frames(i)), round(t * SEED_FPS))


def _resized(img: np.ndarray, side: int) -> np.ndarray:
    import cv2  # the image's opencv (headless on the GPU device)

    return cv2.resize(img, (side, side), interpolation=cv2.INTER_LINEAR)


def _background(h: int, w: int, shot: int) -> np.ndarray:
    """A soft two-colour gradient per shot (neighbouring shots differ: every cut is a hard cut)."""
    rng = np.random.default_rng(100 + shot)
    a, b = rng.integers(30, 200, 3), rng.integers(30, 200, 3)
    ramp = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    return np.broadcast_to(a + (b - a) * ramp, (h, w, 3)).astype(np.uint8)


def compose(kind: str, speaker: int, other: int, t: float, shot: int, h: int, w: int) -> np.ndarray:
    """One film frame (h, w, 3) of a shot at shot time t."""
    frame = _background(h, w, shot).copy()
    if kind == "faceless":
        tile = seed_frames(speaker)[_seed_index(speaker, t, False), :64, :64]  # the corner: background only
        big = _resized(tile, w + w // 4)  # a slow pan across it
        x0 = round(w // 4 * min(1.0, t / 8.0))
        return np.ascontiguousarray(big[:h, x0 : x0 + w])
    if kind == "close":
        side = (round(0.8 * h) // 2) * 2
        faces = [(speaker, False, (w - side) // 2)]
    else:
        side = (round(0.47 * h) // 2) * 2
        xl, xr = round(0.28 * w) - side // 2, round(0.72 * w) - side // 2
        listening = kind == "voice_over"
        left = (speaker, listening or kind == "right", xl)
        right = (other, listening or kind == "left", xr)
        if kind == "right":
            left, right = (other, True, xl), (speaker, False, xr)
        faces = [left, right]
    y0 = (h - side) // 2
    for seed, still, x0 in faces:
        frame[y0 : y0 + side, x0 : x0 + side] = _resized(seed_frames(seed)[_seed_index(seed, t, still)], side)
    return frame


def _speech(seed: int, n: int, lead_s: float = 0.25) -> np.ndarray:
    """n samples of a seed's recorded speech, looped, after a short silence."""
    voice = seed_audio(seed)
    lead = min(n, round(lead_s * SR))
    reps = -(-(n - lead) // len(voice)) if n > lead else 0
    body = np.tile(voice, max(reps, 0))[: n - lead]
    return np.concatenate([np.zeros(lead, np.float32), body]).astype(np.float32)


def plan_shots(n_shots: int, film_s: float | None) -> list[tuple[str, int, int, int]]:
    """(kind, frames, speaker, other) of the first `n_shots` shots, scaled to `film_s` seconds; no cut on
    a keyframe (a multiple of GOP)."""
    chosen = SHOTS[:n_shots]
    scale = (film_s / sum(s for _, s, _, _ in chosen)) if film_s else 1.0
    out, start = [], 0
    for kind, seconds, speaker, other in chosen:
        frames = max(12, round(seconds * scale * FPS))
        if (start + frames) % GOP == 0:
            frames += 1
        out.append((kind, frames, speaker, other))
        start += frames
    return out


def keyframes(path: Path) -> list[int]:
    """Frame indices (presentation order) of the video's keyframes, from the packets' flags."""
    lines = list(read_lines(["-v", "error", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "framecrc", "-"],
                            path=path, what="reading packets"))  # fmt: skip
    _, pts, _, keys = parse_framecrc(lines)
    order = {p: i for i, p in enumerate(sorted(pts))}
    return sorted(order[p] for p, k in zip(pts, keys, strict=True) if k)


def make_film(
    dest: Path, size: tuple[int, int], n_shots: int = 10, film_s: float | None = None
) -> dict[str, Any]:
    """Write dest/film.mp4 (picture + the speakers' own speech) and dest/dub.wav; return the manifest."""
    import soundfile as sf

    w, h = size
    dest.mkdir(parents=True, exist_ok=True)
    plan = plan_shots(n_shots, film_s)
    total = sum(f for _, f, _, _ in plan)
    n_samples = round(total / FPS * SR)
    source_audio = np.zeros(n_samples, np.float32)
    dub = np.zeros(n_samples, np.float32)
    shots, start = [], 0
    for i, (kind, frames, speaker, _other) in enumerate(plan):
        a, b = round(start / FPS * SR), round((start + frames) / FPS * SR)
        if kind != "faceless":  # someone speaks: on screen (dialogue) or off screen (voice-over)
            source_audio[a:b] = _speech(speaker, b - a)
            dub[a:b] = _speech(DUB_VOICE[speaker], b - a)
        expect = "dub" if kind in ("close", "left", "right") else "copy"
        s0, s1 = float(start / FPS), float((start + frames) / FPS)
        shots.append(FilmShot(i, kind, start, frames, round(s0, 3), round(s1, 3), expect))
        start += frames
    src_wav = dest / "source_audio.wav"
    sf.write(src_wav, source_audio, SR, subtype="PCM_16")
    sf.write(dest / "dub.wav", dub, SR, subtype="PCM_16")
    film = dest / "film.mp4"
    cmd = [ffmpeg_exe(), "-nostdin", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-s", f"{w}x{h}", "-framerate", f"{FPS.numerator}/{FPS.denominator}", "-i", "-", "-i", str(src_wav),
           "-map", "0:v", "-map", "1:a", "-c:v", "libx264", "-preset", "veryfast", "-crf", "20",
           "-g", str(GOP), "-keyint_min", str(GOP), "-sc_threshold", "0", "-pix_fmt", "yuv420p",
           "-c:a", "aac", "-b:a", "96k", "-shortest", str(film)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
    try:
        for shot, (kind, frames, speaker, other) in zip(shots, plan, strict=True):
            for k in range(frames):
                proc.stdin.write(compose(kind, speaker, other, float(k / FPS), shot.index, h, w).tobytes())
        proc.stdin.close()
        if proc.wait() != 0:
            raise RuntimeError(f"ffmpeg failed to encode {film}")
    finally:
        if proc.poll() is None:
            proc.kill()
    src_wav.unlink()
    keys = keyframes(film)
    cuts = [s.start_frame for s in shots[1:]]
    return {
        "film": str(film),
        "dub": str(dest / "dub.wav"),
        "size": f"{w}x{h}",
        "fps": f"{FPS.numerator}/{FPS.denominator}",
        "frames": total,
        "film_s": round(float(total / FPS), 3),
        "shots": [asdict(s) for s in shots],
        "cuts": cuts,
        "keyframes": keys,
        "cuts_on_keyframes": sorted(set(cuts) & set(keys)),
        "dialogue_s": round(sum(s.end_s - s.start_s for s in shots if s.expect == "dub"), 3),
    }
