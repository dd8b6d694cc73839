"""Does the dub track speak during a shot?  A small energy + spectral-shape voice activity detector.

Shots whose dub audio is silent (or only room tone, hum, music stings of pure tones) are passed through
untouched, which saves the expensive generation and avoids mouth motion without speech.  The detector is
deliberately simple and explainable (the shot table shows its reason):

1. 25 ms frames every 10 ms; frame level in dBFS (RMS re. a full-scale square wave, so a full-scale sine
   reads about -3 dBFS).
2. A frame is speech-like when it is loud enough (above an absolute floor and above the slice's noise floor),
   most of its power lies in the 300-3400 Hz telephone band, the band's spectrum is not flat (white/pink noise
   is flat; voiced speech has harmonics and formants) and not a single spectral line (a steady tone).
3. Runs shorter than ``min_speech_s`` are dropped, then runs are extended by a hangover and close gaps merged;
   long runs whose level never moves (a hum, a held tone) are dropped: speech is modulated at syllable rate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

_EPS = 1e-12


@dataclass(frozen=True)
class SpeechConfig:
    """Thresholds of the speech detector (times in seconds, levels in dB)."""

    frame_s: float = 0.025
    hop_s: float = 0.010
    band_hz: tuple[float, float] = (300.0, 3400.0)
    abs_floor_db: float = -50.0  # frames quieter than this never count as speech
    above_noise_db: float = 8.0  # ... nor frames less than this above the slice's noise floor (10th pct.)
    min_band_ratio: float = 0.15  # fraction of frame power inside the band (voiced F0 often lies below it)
    max_flatness: float = 0.35  # spectral flatness of the band (geometric / arithmetic mean power)
    max_peak_ratio: float = 0.9  # largest in-band line / in-band power; above this the frame is a pure tone
    min_speech_s: float = 0.10  # shorter speech-like bursts are clicks
    hangover_s: float = 0.20  # speech continues this long after the last speech-like frame
    min_modulation_db: float = 3.0  # a run longer than 0.5 s must vary its level this much (std of dB)
    min_total_s: float = 0.2  # the slice has speech when its speech-like frames (no hangover) add up to this

    def __post_init__(self) -> None:
        if not 0 < self.hop_s <= self.frame_s:
            raise ValueError(f"SpeechConfig needs 0 < hop_s <= frame_s, got {self.hop_s}, {self.frame_s}")
        if not 0 <= self.band_hz[0] < self.band_hz[1]:
            raise ValueError(f"SpeechConfig.band_hz must be an increasing pair, got {self.band_hz}")


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


@dataclass(frozen=True)
class FrameFeatures:
    """Per-frame features of a slice (all arrays have one value per analysis frame)."""

    level_db: np.ndarray  # RMS level, dBFS
    band_ratio: np.ndarray  # in-band power / total power
    flatness: np.ndarray  # in-band spectral flatness, 0 (lines) .. 1 (white)
    peak_ratio: np.ndarray  # largest in-band bin / in-band power
    hop: int  # samples between frames


def frame_features(audio: np.ndarray, sr: int, cfg: SpeechConfig) -> FrameFeatures:
    """Short-time level and spectral shape of a mono float signal."""
    n = max(16, round(cfg.frame_s * sr))
    hop = max(1, round(cfg.hop_s * sr))
    x = np.asarray(audio, dtype=np.float32)
    if len(x) < n:
        x = np.pad(x, (0, n - len(x)))
    frames = np.lib.stride_tricks.sliding_window_view(x, n)[::hop]  # (F, n)
    rms2 = np.mean(frames.astype(np.float64) ** 2, axis=1)
    level_db = 10 * np.log10(rms2 + _EPS)
    spec = np.abs(np.fft.rfft(frames * np.hanning(n).astype(np.float32), axis=1)) ** 2  # (F, n//2+1)
    freqs = np.fft.rfftfreq(n, 1.0 / sr)
    lo, hi = cfg.band_hz[0], min(cfg.band_hz[1], sr / 2)
    band = spec[:, (freqs >= lo) & (freqs <= hi)].astype(np.float64) + _EPS  # (F, B)
    total = spec[:, 1:].sum(axis=1) + _EPS  # without DC
    band_sum = band.sum(axis=1)
    flatness = np.exp(np.mean(np.log(band), axis=1)) / np.mean(band, axis=1)
    # a windowed sinusoid spreads over ~3 bins: sum neighbours before taking the peak
    smeared = band[:, :-2] + band[:, 1:-1] + band[:, 2:] if band.shape[1] > 2 else band
    peak_ratio = smeared.max(axis=1) / band_sum
    return FrameFeatures(level_db, np.minimum(1.0, band_sum / total), flatness, peak_ratio, hop)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Half-open index runs where ``mask`` is true."""
    padded = np.concatenate([[False], mask.astype(bool), [False]])
    edges = np.flatnonzero(np.diff(padded.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def detect_speech(audio: np.ndarray, sr: int, cfg: SpeechConfig | None = None) -> SpeechInfo:
    """Speech segments of a mono float32 slice (``[-1, 1]`` full scale) at sample rate ``sr``."""
    cfg = cfg or SpeechConfig()
    audio = np.asarray(audio)
    if audio.ndim != 1:
        raise ValueError(f"speech detection needs mono audio (1-D), got shape {audio.shape}")
    if sr <= 0:
        raise ValueError(f"sample rate must be positive, got {sr}")
    duration = len(audio) / sr
    if len(audio) == 0:
        return SpeechInfo(False, 0.0, (), "empty audio slice")
    f = frame_features(audio, sr, cfg)
    hop_s = f.hop / sr
    peak_db = float(f.level_db.max())
    if peak_db < cfg.abs_floor_db:
        return SpeechInfo(False, 0.0, (), f"no speech in dub track (silent, peak {peak_db:.0f} dBFS)")
    noise_db = float(np.percentile(f.level_db, 10))
    loud = (f.level_db >= cfg.abs_floor_db) & (f.level_db >= noise_db + cfg.above_noise_db)
    if noise_db + cfg.above_noise_db > peak_db:  # no quiet part in the slice: judge by the absolute floor
        loud = f.level_db >= cfg.abs_floor_db
    voiced = (
        loud
        & (f.band_ratio >= cfg.min_band_ratio)
        & (f.flatness <= cfg.max_flatness)
        & (f.peak_ratio <= cfg.max_peak_ratio)
    )
    min_len = max(1, round(cfg.min_speech_s / hop_s))
    keep = np.zeros_like(voiced)
    for a, b in _runs(voiced):
        if b - a >= min_len:
            keep[a:b] = True
    hang = round(cfg.hangover_s / hop_s)
    segments: list[tuple[int, int]] = []
    for a, b in _runs(keep):
        a2, b2 = a, min(len(keep), b + hang)
        if segments and a2 <= segments[-1][1]:
            segments[-1] = (segments[-1][0], b2)
        else:
            segments.append((a2, b2))
    steady = round(0.5 / hop_s)
    segments = [
        (a, b)
        for a, b in segments
        if (b - a) < steady or float(np.std(f.level_db[a:b][keep[a:b]])) >= cfg.min_modulation_db
    ]
    frame_n = round(cfg.frame_s * sr)
    seg_s = tuple(
        (round(a * hop_s, 3), round(min(duration, (b - 1) * hop_s + frame_n / sr), 3)) for a, b in segments
    )
    total = sum(b - a for a, b in seg_s)
    ratio = min(1.0, total / duration) if duration > 0 else 0.0
    core_s = sum(int(keep[a:b].sum()) for a, b in segments) * hop_s  # speech-like time without hangover
    if core_s >= cfg.min_total_s:
        return SpeechInfo(True, ratio, seg_s, f"speech {total:.1f} s ({ratio:.0%})")
    if not voiced.any():
        why = "noise or tones only" if loud.any() else "too quiet"
        return SpeechInfo(False, ratio, seg_s, f"no speech in dub track ({why})")
    if total == 0:
        return SpeechInfo(False, 0.0, (), "no speech in dub track (steady or short sounds only)")
    return SpeechInfo(False, ratio, seg_s, f"no speech in dub track (only {core_s:.2f} s speech-like)")


__all__ = ["FrameFeatures", "SpeechConfig", "SpeechInfo", "detect_speech", "frame_features"]
