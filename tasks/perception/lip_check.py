"""The output check: do a rendered shot's new lips say the dub's words?

The same measure that finds who speaks (`tasks.perception.content`: mouth shapes against the shapes the
audio's content predicts) is run on the *rendered* shot against the *dub* track: the dubbed face (the face
nearest to the box the decision dubbed, found by the project's detector) gets its mouth shapes
(`tasks.perception.mouth_shapes`), the dub's speech its audio features, and the shot a score: the fit over the
dub's speech at the best lag (`fit_score`).  A face never found, too little speech, or a fit below ``min_fit``
flags the shot for review: a dub whose lips do not say its words (TINY RANDOM WEIGHTS always do not).
Pure apart from the models it runs; frames come in as RGB arrays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tasks.perception.content import ContentMap, audio_features, fit_score, load_prior, track_shapes
from tasks.perception.faces import FaceDetector
from tasks.perception.mouth_shapes import MouthShapes
from tasks.perception.vad import RATE, StreamingVad, at_frames

MIN_SPEECH_FRAMES = 25  # less dub speech than this (1 s at 25 fps): nothing to check, flagged


@dataclass(frozen=True)
class LipCheck:
    """One rendered shot's check: ``fit`` None when it could not be measured (no face, too little speech)."""

    fit: float | None
    measured: float  # share of the dub's speech frames on which the dubbed face's mouth was measured
    flagged: bool
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"lip_fit": self.fit, "lip_measured": round(self.measured, 2), "lip_flag": self.flagged,
                "lip_why": self.why}  # fmt: skip


def _nearest(faces: list, box: np.ndarray) -> np.ndarray | None:
    if not faces:
        return None
    centre = (box[:2] + box[2:]) / 2

    def dist(f) -> float:
        b = np.asarray(f.box, np.float64)
        return float(np.sum(((b[:2] + b[2:]) / 2 - centre) ** 2))

    return np.asarray(min(faces, key=dist).box, np.float64)


def lip_check(
    frames: Iterable[np.ndarray],
    n_frames: int,
    fps: float,
    dub: np.ndarray,
    box: tuple[float, float, float, float],
    min_fit: float,
    cmap: ContentMap | None = None,
    detect_every: int = 4,
) -> LipCheck:
    """Check ``frames`` (RGB uint8, the rendered shot) against ``dub`` (mono float32 at RATE from the shot's
    first frame); ``box`` (x0, y0, x1, y1): the dubbed face in the frames' pixels."""
    cmap = load_prior() if cmap is None else cmap
    vad = StreamingVad()
    audio = np.asarray(dub, np.float32)
    speech = at_frames(np.concatenate([vad.feed(audio), vad.finish()]), n_frames, fps) >= 0.5
    if speech.sum() < MIN_SPEECH_FRAMES:
        return LipCheck(None, 0.0, True, "too little dub speech to check")
    detector = FaceDetector(0.5, 16)
    shapes = MouthShapes(n_frames, fps)
    target = np.asarray(box, np.float64)
    current: np.ndarray | None = None
    try:
        for t, frame in enumerate(frames):
            if t >= n_frames:
                break
            if t % detect_every == 0 or current is None:
                found = _nearest(detector(frame), target)
                if found is not None:
                    current = found
                    target = found
            if current is not None:
                shapes.feed(t, frame, {0: (None, current)})
    finally:
        shapes.close()
    observed = track_shapes(shapes.rows([0]))[0]
    measured = float(np.isfinite(observed).all(axis=1)[speech].mean())
    if measured < 0.5:
        return LipCheck(None, measured, True, "the dubbed face's mouth was not found")
    fit = fit_score(cmap.predict(audio_features(audio, RATE, n_frames, fps)), observed, speech)
    if not np.isfinite(fit):
        return LipCheck(None, measured, True, "the dubbed face's mouth was not found")
    fit = round(float(fit), 3)
    if fit < min_fit:
        return LipCheck(
            fit, measured, True, f"the lips do not say the dub's words (fit {fit:.2f} < {min_fit})"
        )
    return LipCheck(fit, measured, False, "the lips follow the dub's words")


__all__ = ["LipCheck", "lip_check"]
