"""Learned voice activity detection: Silero VAD's ONNX model run through onnxruntime, and its segmentation.

Holds the model file lookup, the one per-process inference session (`_SESSION`, the documented holder: the
model is stateless between calls, the recurrent state is passed in and out), the streaming pass over 32 ms
windows that gives one speech probability per window, and the hysteresis that turns probabilities into
speech segments.  The model file (MIT, Silero Team) comes from the `silero-vad` wheel's data folder; that
package itself imports torch, so it is located with `importlib.util.find_spec` and never imported here.
Must not decode media nor know about shots: callers pass mono float32 samples.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

RATE = 16000  # the model's sample rate (8 kHz also exists; the pipeline decodes dialogue at 16 kHz)
WINDOW = 512  # samples per inference step at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees in front of each window
HOP_S = WINDOW / RATE

_SESSION: dict[str, object] = {}  # {"session": onnxruntime.InferenceSession}, created on first use
_LOCK = threading.Lock()


def model_path() -> Path:
    """`silero_vad.onnx` inside the installed silero-vad wheel (found without importing the package)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("silero-vad is not installed: pip install silero-vad (its ONNX model is used)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise RuntimeError(f"{path}: Silero VAD model file missing from the silero-vad package")
    return path


def _session():
    with _LOCK:
        if "session" not in _SESSION:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1  # one core; several thread pools on 2 cores slow everything down
            opts.inter_op_num_threads = 1
            _SESSION["session"] = ort.InferenceSession(
                str(model_path()), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        return _SESSION["session"]


class StreamingVad:
    """Speech probabilities of a signal fed in pieces of any size (the recurrent state carries over)."""

    def __init__(self) -> None:
        self._sess = _session()
        self._state = np.zeros((2, 1, 128), np.float32)
        self._buf = np.zeros(CONTEXT, np.float32)  # context of the next window + not yet consumed samples
        self._rate = np.array(RATE, dtype=np.int64)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """Probabilities of the windows completed by ``samples`` (mono float32, 16 kHz)."""
        buf = np.concatenate([self._buf, np.asarray(samples, np.float32).ravel()])
        n = (len(buf) - CONTEXT) // WINDOW
        out = np.empty(n, np.float32)
        for i in range(n):
            chunk = buf[i * WINDOW : i * WINDOW + CONTEXT + WINDOW][None]  # (1, 576): context + window
            prob, self._state = self._sess.run(None, {"input": chunk, "state": self._state, "sr": self._rate})
            out[i] = prob[0, 0]
        self._buf = buf[n * WINDOW :]
        return out

    def finish(self) -> np.ndarray:
        """Probability of the last, zero-padded window (empty if nothing is pending)."""
        pending = len(self._buf) - CONTEXT
        if pending <= 0:
            return np.zeros(0, np.float32)
        return self.feed(np.zeros(WINDOW - pending, np.float32))


def speech_probs(audio: np.ndarray, sr: int = RATE) -> np.ndarray:
    """Speech probability of each 32 ms window of a mono float32 signal at 16 kHz: (ceil(n / 512),).

    Window i covers samples [512 i, 512 (i + 1)); the last one is zero-padded.
    """
    if sr != RATE:
        raise ValueError(f"the VAD runs at {RATE} Hz, got {sr} Hz (resample first)")
    x = np.asarray(audio, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"VAD needs mono audio (1-D), got shape {x.shape}")
    vad = StreamingVad()
    return np.concatenate([vad.feed(x), vad.finish()])


def at_frames(probs: np.ndarray, n_frames: int, fps: float, offset_s: float = 0.0) -> np.ndarray:
    """Speech probability at each video frame's time (``offset_s`` + t / fps), from window probabilities."""
    if len(probs) == 0:
        return np.zeros(n_frames, np.float32)
    idx = ((offset_s + np.arange(n_frames) / fps) / HOP_S).astype(np.int64)
    return probs[np.clip(idx, 0, len(probs) - 1)]


@dataclass(frozen=True)
class VadSettings:
    """Hysteresis of the segmentation (the `speaker:` section's vad_* keys)."""

    threshold: float  # a window at or above this starts / continues speech
    min_speech_s: float  # shorter bursts are dropped
    min_silence_s: float  # shorter pauses are bridged
    pad_s: float  # each segment grows by this on both sides


def segments(probs: np.ndarray, settings: VadSettings, duration_s: float) -> list[tuple[float, float]]:
    """Speech segments ``[(start_s, end_s)]`` from window probabilities (silero's hysteresis rule).

    Speech starts at a window >= threshold and ends at the first window below threshold - 0.15.
    """
    on, off = settings.threshold, max(0.01, settings.threshold - 0.15)
    runs: list[list[int]] = []
    start = -1
    for i, p in enumerate(probs):
        if start < 0 and p >= on:
            start = i
        elif start >= 0 and p < off:
            runs.append([start, i])
            start = -1
    if start >= 0:
        runs.append([start, len(probs)])
    merged: list[list[int]] = []
    gap = settings.min_silence_s / HOP_S
    for a, b in runs:
        if merged and a - merged[-1][1] < gap:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    out = []
    for a, b in merged:
        if (b - a) * HOP_S < settings.min_speech_s:
            continue
        s0 = max(0.0, a * HOP_S - settings.pad_s)
        s1 = min(duration_s, b * HOP_S + settings.pad_s)
        if out and s0 <= out[-1][1]:
            out[-1] = (out[-1][0], s1)
        else:
            out.append((s0, s1))
    return [(round(a, 3), round(b, 3)) for a, b in out]


def resample_to_vad(audio: np.ndarray, sr: int) -> np.ndarray:
    """Mono float32 at the VAD's rate (polyphase resampling when `sr` differs)."""
    x = np.asarray(audio, dtype=np.float32)
    if sr == RATE:
        return x
    from math import gcd

    from scipy.signal import resample_poly

    g = gcd(RATE, sr)
    return resample_poly(x, RATE // g, sr // g).astype(np.float32)


__all__ = [
    "HOP_S",
    "RATE",
    "StreamingVad",
    "VadSettings",
    "at_frames",
    "model_path",
    "resample_to_vad",
    "segments",
    "speech_probs",
]
