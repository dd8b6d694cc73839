"""Speaker cases with a known truth, composed from the real talking-head seeds in tests/data/talking.

Each seed (256x256, 25 fps, 5-6 s) is a person talking with their own recorded audio.  A "listener" is a
seed's stretch without speech played back and forth (a real face, blinking and moving, lips at rest).
Cases are composed in numpy and encoded with the bundled ffmpeg (H.264 + AAC), so the pipeline decodes them
like any film: speaker + still listener (either side), a voice-over over listeners, two talking faces with
one's audio, turn-taking inside one shot, a poster next to a listener, and a multi-shot film of these with
a faceless shot.  Truth per case: the side that speaks (or None) per time span.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.media.audio import decode_audio
from tasks.media.ffmpeg import ffmpeg_exe

SEEDS = Path(__file__).parent / "data" / "talking"
FPS = 25
SR = 16000
SIZE = (360, 640)  # (h, w) of the composed frames; each face clip is 256x256
LEFT, RIGHT = 40, 344  # x of the left / right clip
TOP = 52
# per seed: frames without speech and with closed lips (listener material), from the seed's own VAD segments
# and a look at the frames (seed 5 opens her mouth from frame 79 on, before the VAD hears her again; seed 1's
# lips are still parted and closing until frame 121, after the VAD has stopped hearing him at 117)
QUIET = {1: (122, 150), 5: (70, 79)}


@functools.cache
def seed_frames(i: int) -> np.ndarray:
    raw = subprocess.run(
        [ffmpeg_exe(), "-v", "error", "-i", str(SEEDS / f"head{i}.mp4"), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    return np.frombuffer(raw, np.uint8).reshape(-1, 256, 256, 3)


@functools.cache
def seed_audio(i: int) -> np.ndarray:
    return decode_audio(SEEDS / f"head{i}.mp4", sample_rate=SR, channels=1)[:, 0]


def listener(i: int, n: int) -> np.ndarray:
    """n frames of seed i's quiet stretch played back and forth."""
    a, b = QUIET[i]
    seq = list(range(a, b)) + list(range(b - 2, a, -1))
    return seed_frames(i)[[seq[k % len(seq)] for k in range(n)]]


def two_up(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    n = min(len(left), len(right))
    out = np.full((n, *SIZE, 3), 60, np.uint8)
    out[:, TOP : TOP + 256, LEFT : LEFT + 256] = left[:n]
    out[:, TOP : TOP + 256, RIGHT : RIGHT + 256] = right[:n]
    return out


def faceless(n: int) -> np.ndarray:
    """A shot without a face: the seeds' backgrounds (top corners of a clip), panned."""
    src = seed_frames(3)[:, :80, :80]
    out = np.empty((n, *SIZE, 3), np.uint8)
    for t in range(n):
        tile = np.roll(src[t % len(src)], t, axis=1)
        out[t] = np.kron(tile, np.ones((5, 8, 1), np.uint8))[: SIZE[0], : SIZE[1]]
    return out


@dataclass(frozen=True)
class Case:
    name: str
    frames: np.ndarray  # (T, H, W, 3)
    audio: np.ndarray  # (S,) float32 at SR
    truth: tuple[tuple[float, float, str | None], ...]  # (start_s, end_s, "left" | "right" | None)
    ambiguous: bool = False  # two talking faces: "uncertain" is an accepted answer


def _audio(i: int, n_frames: int, start_frame: int = 0) -> np.ndarray:
    a = seed_audio(i)[round(start_frame / FPS * SR) :]
    want = round(n_frames / FPS * SR)
    return np.pad(a, (0, max(0, want - len(a))))[:want].astype(np.float32)


def cases() -> dict[str, Case]:
    h = {i: seed_frames(i) for i in range(1, 6)}
    n = 120  # 4.8 s
    out = [
        Case("speaker_left", two_up(h[2], listener(1, n)), _audio(2, n), ((0, 4.8, "left"),)),
        Case("speaker_right", two_up(listener(1, n), h[3]), _audio(3, n), ((0, 4.8, "right"),)),
        Case("voice_over", two_up(listener(1, n), listener(5, n)), _audio(3, n), ((0, 4.8, None),)),
        Case(
            "poster_and_listener",
            two_up(np.repeat(h[2][30:31], n, 0), listener(1, n)),
            _audio(2, n),
            ((0, 4.8, None),),
        ),  # fmt: skip
        Case("two_talking_left", two_up(h[2], h[3]), _audio(2, n), ((0, 4.8, "left"),), ambiguous=True),
        Case("two_talking_right", two_up(h[4], h[1]), _audio(1, n), ((0, 4.8, "right"),), ambiguous=True),
    ]
    # turn-taking: the left person (seed 1) talks for 62 frames, then listens; the right one (seed 3) answers
    a_side = np.concatenate([h[1][:62], listener(1, 63)])
    b_side = np.concatenate([listener(5, 62), h[3][:63]])
    audio = np.concatenate([_audio(1, 62), _audio(3, 63)])
    out.append(Case("turn_taking", two_up(a_side, b_side), audio, ((0, 2.48, "left"), (2.48, 5.0, "right"))))
    return {c.name: c for c in out}


def encode(path: Path, frames: np.ndarray, audio: np.ndarray) -> Path:
    """Write frames (RGB) + mono audio as H.264/AAC mp4 at 25 fps."""
    wav = path.with_suffix(".f32")
    wav.write_bytes(np.ascontiguousarray(audio, np.float32).tobytes())
    h, w = frames.shape[1:3]
    subprocess.run(
        [ffmpeg_exe(), "-nostdin", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}",
         "-r", str(FPS), "-i", "-", "-f", "f32le", "-ar", str(SR), "-ac", "1", "-i", str(wav),
         "-c:v", "libx264", "-preset", "veryfast", "-crf", "20", "-pix_fmt", "yuv420p", "-g", "50",
         "-c:a", "aac", "-b:a", "64k", "-shortest", str(path)],
        input=np.ascontiguousarray(frames).tobytes(), check=True, capture_output=True,
    )  # fmt: skip
    wav.unlink()
    return path


def side_of(box: tuple[int, int, int, int] | list[int]) -> str:
    """Which clip a display-pixel box lies over."""
    return "left" if (box[0] + box[2]) / 2 < SIZE[1] / 2 else "right"


def turn_coverage(case: Case, dubbed: list[tuple[int, int, str]]) -> list[float]:
    """Per true speaker turn of ``case``: the fraction of its frames inside a dubbed (start, end, side) span
    on the truth's side."""
    out = []
    for t0, t1, side in case.truth:
        if side is None:
            continue
        f0, f1 = round(t0 * FPS), min(case.frames.shape[0], round(t1 * FPS))
        hit = np.zeros(f1 - f0, bool)
        for a, b, s in dubbed:
            if s == side:
                hit[max(0, a - f0) : max(0, min(f1, b) - f0)] = True
        out.append(float(hit.mean()))
    return out


__all__ = [
    "FPS",
    "SR",
    "Case",
    "cases",
    "encode",
    "faceless",
    "listener",
    "seed_audio",
    "seed_frames",
    "side_of",
    "turn_coverage",
]
