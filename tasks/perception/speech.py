"""Does an audio slice speak, and when?  The learned VAD (`tasks.perception.vad`, Silero) turned into a shot's verdict.

Shots whose dub audio has no speech (silence, room tone, music, effects) are passed through untouched,
which saves the generation and avoids mouth motion without speech.  The same VAD gives the source's
speech timeline for the active-speaker decision (`tasks.perception.face_analysis`).  `SpeechInfo` is what the shot
record keeps: whether there is speech, how much, its segments and a reason for the shot table.
Must not decode media (callers pass samples).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tasks.config.speaker import SpeakerConfig
from tasks.perception.vad import VadSettings, resample_to_vad, segments, speech_probs


@dataclass(frozen=True)
class SpeechInfo:
    """Speech found in one audio slice; times are relative to the slice start."""

    has_speech: bool
    speech_ratio: float  # speech time / slice duration
    speech_segments_s: tuple[tuple[float, float], ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeechInfo:
        """Inverse of :meth:`to_dict`."""
        segs = tuple((float(a), float(b)) for a, b in d["speech_segments_s"])
        return cls(bool(d["has_speech"]), float(d["speech_ratio"]), segs, str(d["reason"]))


def vad_settings(cfg: SpeakerConfig) -> VadSettings:
    """The segmentation settings of the `speaker:` section."""
    return VadSettings(cfg.vad_threshold, cfg.vad_min_speech_s, cfg.vad_min_silence_s, cfg.vad_pad_s)


def detect_speech(audio: np.ndarray, sr: int, cfg: SpeakerConfig) -> SpeechInfo:
    """Speech segments of a mono float32 slice (``[-1, 1]`` full scale) at sample rate ``sr``."""
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"speech detection needs mono audio (1-D), got shape {audio.shape}")
    if sr <= 0:
        raise ValueError(f"sample rate must be positive, got {sr}")
    if len(audio) == 0:
        return SpeechInfo(False, 0.0, (), "empty audio slice")
    duration = len(audio) / sr
    peak = float(np.max(np.abs(audio)))
    if peak < 1e-4:  # -80 dBFS: nothing to listen to
        return SpeechInfo(False, 0.0, (), "no speech in dub track (silent)")
    segs = tuple(segments(speech_probs(resample_to_vad(audio, sr)), vad_settings(cfg), duration))
    total = sum(b - a for a, b in segs)
    ratio = min(1.0, total / duration)
    if total >= cfg.min_speech_s:
        return SpeechInfo(True, ratio, segs, f"speech {total:.1f} s ({ratio:.0%})")
    if not segs:
        return SpeechInfo(False, 0.0, (), "no speech in dub track (no voice found)")
    return SpeechInfo(False, ratio, segs, f"no speech in dub track (only {total:.2f} s)")


__all__ = ["SpeechInfo", "detect_speech", "vad_settings"]
