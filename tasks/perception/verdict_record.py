"""The speaker verdict's inputs of one shot, kept with its face analysis so the film can judge it again.

The expensive part of a shot's analysis (decoding, face detection, MediaPipe's mouth shapes, Light-ASD) ends
in `tasks.perception.verdict.VerdictInputs`; the verdict itself is cheap.  A film-level step
(`tasks.decision.film_speakers`: the content map calibrated on the film's own confident lines, voices bound to
characters) judges a shot again from what is kept here, without decoding a frame: the agreement route's
segments, the still test's rows, the speech probability, Light-ASD's scores and sync leads, each face's mouth
shapes (z-scored per track) and which faces content does not judge.  The source's sound is not kept (it is
decoded again, a fraction of a second per shot): the audio features and voices come from it.
Arrays travel as base64 (float64; the shapes float32) in the analysis's JSON (`tasks.decision.shot_decision` caches it).  Pure numpy.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.perception.content import ContentMap, audio_features
from tasks.perception.content_fusion import ContentEvidence
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.vad import RATE
from tasks.perception.verdict import VerdictInputs
from tasks.perception.voices import VoicesOf


def _pack(a: np.ndarray | None, dtype: type = np.float64) -> dict[str, Any] | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a, dtype)
    return {
        "shape": list(a.shape),
        "dtype": a.dtype.str,
        "data": base64.b64encode(a.tobytes()).decode("ascii"),
    }


def _unpack(d: dict[str, Any] | None) -> np.ndarray | None:
    if d is None:
        return None
    shape = tuple(int(v) for v in d["shape"])
    dtype = np.dtype(str(d["dtype"]))
    if dtype not in (np.dtype("<f4"), np.dtype("<f8")):
        raise ValueError(f"verdict record: dtype {dtype} is not float32 / float64")
    a = np.frombuffer(base64.b64decode(d["data"]), dtype)
    if a.size != int(np.prod(shape)):
        raise ValueError(f"verdict record: {a.size} values for shape {shape}")
    return a.reshape(shape).copy()


@dataclass(frozen=True)
class VerdictRecord:
    """One shot's verdict inputs (`VerdictInputs` less the sound-derived parts), JSON round trip."""

    n_frames: int
    fps: float
    agreed: tuple[SpeakerSegment, ...]
    change: np.ndarray  # (n_tracks, T)
    speech_prob: np.ndarray  # (T,)
    scores: np.ndarray | None  # (n_tracks, T) Light-ASD, NaN where unscored; None: not run
    lead: np.ndarray | None  # (n_tracks, T)
    shapes: np.ndarray | None  # (n_tracks, T, F) z-scored per track; None: the content route did not run
    unjudged: np.ndarray | None  # (n_tracks,) bool: content does not judge them (still, too small)

    @classmethod
    def of(cls, inp: VerdictInputs) -> VerdictRecord:
        c = inp.content
        return cls(
            inp.n_frames, float(inp.fps), tuple(inp.agreed), np.asarray(inp.change, np.float64),
            np.asarray(inp.speech_prob, np.float64), inp.scores, inp.lead,
            None if c is None else np.asarray(c.shapes, np.float32), None if c is None else np.asarray(c.still, bool),
        )  # fmt: skip

    def inputs(
        self, audio: np.ndarray | None, cmap: ContentMap | None, voices: VoicesOf | None
    ) -> VerdictInputs:
        """The shot's `VerdictInputs` again: the content evidence predicted by ``cmap`` from ``audio`` (the
        source's mono samples at RATE from the shot's first frame; None or no map: no content stage)."""
        content = None
        if self.shapes is not None and self.unjudged is not None and audio is not None and cmap is not None:
            feats = audio_features(np.asarray(audio, np.float32), RATE, self.n_frames, self.fps)
            content = ContentEvidence(
                cmap.predict(feats), self.shapes.astype(np.float64), self.speech_prob.astype(np.float64) >= 0.5,
                self.fps, self.unjudged,
            )  # fmt: skip
        return VerdictInputs(
            self.n_frames, self.fps, list(self.agreed), self.change.astype(np.float64),
            self.speech_prob.astype(np.float64), None if self.scores is None else self.scores.astype(np.float64),
            None if self.lead is None else self.lead.astype(np.float64), content, voices,
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_frames": self.n_frames, "fps": self.fps, "agreed": [s.to_dict() for s in self.agreed],
            "change": _pack(self.change), "speech_prob": _pack(self.speech_prob), "scores": _pack(self.scores),
            "lead": _pack(self.lead), "shapes": _pack(self.shapes, np.float32),
            "unjudged": None if self.unjudged is None else [bool(v) for v in self.unjudged],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VerdictRecord:
        change, speech = _unpack(d["change"]), _unpack(d["speech_prob"])
        if change is None or speech is None:
            raise ValueError("verdict record: no still-test rows or speech")
        un = d.get("unjudged")
        return cls(
            int(d["n_frames"]), float(d["fps"]), tuple(SpeakerSegment.from_dict(s) for s in d["agreed"]),
            change, speech, _unpack(d.get("scores")), _unpack(d.get("lead")), _unpack(d.get("shapes")),
            None if un is None else np.array(un, bool),
        )  # fmt: skip


__all__ = ["VerdictRecord"]
