"""A multi-shot film with known characters and per-character stems, composed from the real talking heads.

ANNA is seed 2, BEN seed 3, CARL seed 1 (in his quiet stretch: a listener).  Each shot has its own
background grey so the shot detector cuts between them (the same two faces swapped sides look alike):

* shot 0 (frames 0-100): ANNA left, BEN right, both talking; ANNA's stem speaks 0-50, BEN's 50-100;
* shot 1 (100-200): BEN left, ANNA right, both talking; the same stems' pattern (so: right, then left);
* shot 2 (200-300): ANNA left, BEN right; both stems speak the whole shot (two speakers at once);
* shot 3 (300-400): CARL alone, listening; ANNA's stem speaks (a voice-over).

The mixed dialogue track is the sum of the stems.  Stills of ANNA and BEN (a frame of their seed) name them.
"""

from __future__ import annotations

import functools
from pathlib import Path

import cv2
import numpy as np

from tests.speaker_cases import FPS, LEFT, RIGHT, SIZE, SR, TOP, encode, listener, seed_audio, seed_frames

N = 100  # frames per shot
HALF = 50
STILL_FRAME = 100  # the frame of each seed saved as its cast still


def side_by_side(left: np.ndarray | None, right: np.ndarray | None, grey: int) -> np.ndarray:
    out = np.full((N, *SIZE, 3), grey, np.uint8)
    if left is not None:
        out[:, TOP : TOP + 256, LEFT : LEFT + 256] = left[:N]
    if right is not None:
        out[:, TOP : TOP + 256, RIGHT : RIGHT + 256] = right[:N]
    return out


def alone(face: np.ndarray, grey: int) -> np.ndarray:
    out = np.full((N, *SIZE, 3), grey, np.uint8)
    x = (SIZE[1] - 256) // 2
    out[:, TOP : TOP + 256, x : x + 256] = face[:N]
    return out


def _voice(seed: int, start: int, end: int) -> np.ndarray:
    """N frames of audio: seed's own speech (from its start) placed in frames [start, end), silence around."""
    out = np.zeros(round(N / FPS * SR), np.float32)
    a, b = round(start / FPS * SR), round(end / FPS * SR)
    src = seed_audio(seed)[: b - a]
    out[a : a + len(src)] = src
    return out


@functools.cache
def film() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(frames, {NAME: stem samples at SR}) of the four shots."""
    anna, ben, carl = seed_frames(2), seed_frames(3), listener(1, N)
    frames = np.concatenate(
        [
            side_by_side(anna, ben, 40),
            side_by_side(ben, anna, 110),
            side_by_side(anna, ben, 180),
            alone(carl, 240),
        ]
    )
    stems = {
        "ANNA": np.concatenate([_voice(2, 0, HALF), _voice(2, 0, HALF), _voice(2, 0, N), _voice(2, 0, N)]),
        "BEN": np.concatenate([_voice(3, HALF, N), _voice(3, HALF, N), _voice(3, 0, N), _voice(3, 0, 0)]),
    }
    return frames, stems


def write_film(root: Path) -> dict[str, Path]:
    """The film (its own audio: the mix), the mix, both stems as wav and both stills, under ``root``."""
    import soundfile as sf

    frames, stems = film()
    mix = (stems["ANNA"] + stems["BEN"]).astype(np.float32)
    out = {"film": encode(root / "cast_film.mp4", frames, mix), "mix": root / "mix.wav"}
    sf.write(out["mix"], mix, SR, subtype="FLOAT")
    for name, samples in stems.items():
        out[name] = root / f"{name.lower()}.wav"
        sf.write(out[name], samples, SR, subtype="FLOAT")
    return {**out, **stills(root)}


def stills(root: Path) -> dict[str, Path]:
    """{"ANNA_still", "BEN_still": a frame of their seed as PNG} under ``root``."""
    out = {}
    for name, seed in (("ANNA", 2), ("BEN", 3)):
        out[f"{name}_still"] = root / f"{name.lower()}.png"
        cv2.imwrite(
            str(out[f"{name}_still"]), cv2.cvtColor(seed_frames(seed)[STILL_FRAME], cv2.COLOR_RGB2BGR)
        )
    return out


def write_short_film(root: Path, frames: int = 40) -> dict[str, Path]:
    """Shots 0 and 2 of the film, ``frames`` long each (ANNA, then both at once), with their stems."""
    import soundfile as sf

    full, stems = film()
    keep = np.r_[0:frames, 2 * N : 2 * N + frames]
    per = round(N / FPS * SR)
    cut = round(frames / FPS * SR)
    stems = {k: np.concatenate([v[:cut], v[2 * per : 2 * per + cut]]) for k, v in stems.items()}
    mix = (stems["ANNA"] + stems["BEN"]).astype(np.float32)
    out = {"film": encode(root / "short_film.mp4", full[keep], mix), "mix": root / "short_mix.wav"}
    sf.write(out["mix"], mix, SR, subtype="FLOAT")
    for name, samples in stems.items():
        out[name] = root / f"short_{name.lower()}.wav"
        sf.write(out[name], samples, SR, subtype="FLOAT")
    return {**out, **stills(root)}


__all__ = ["HALF", "N", "film", "write_film", "write_short_film"]
