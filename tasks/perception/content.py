"""Content-level speaker evidence: do this face's mouth shapes say the sounds of the source's audio?

Rhythm (mouth motion against loudness, Light-ASD's lead) cannot tell which of two moving mouths says the
words; the *shape* of the mouth can (lips close on m/b/p, round on oo, open on ah).  This module holds the
audio side and the link, pure numpy:

- `audio_features`: per video frame, 40 log-mel bands of the source's audio in a 40 ms window at the frame's
  time, with +-3 frames of context (280 values), z-scored over the shot;
- `ContentMap`: a ridge map audio features -> expected mouth shapes (`tasks.perception.mouth_shapes`'s
  features, z-scored per track), fitted on single-speaker material (`fit`), its shipped prior fitted on the
  committed talking heads (`load_prior`, `scripts/fit_content_prior.py`), and `calibrated` towards a film's own
  confident single-face lines (ridge shrunk towards the prior, not towards zero);
- `content_rows` / `segment_scores`: how well each face's observed shapes follow the predicted ones (mean
  Pearson correlation over the shape features, best lag within +-``LAG`` frames), per frame from sliding
  windows and per segment.

Must not decode media nor decide who speaks (`tasks.perception.content_fusion` does).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

N_MELS = 40
CONTEXT = 3  # frames of context either side
WIN_S = 0.040  # analysis window of one frame's audio
N_FFT = 1024
LAG = 4  # frames of lag searched either side (the mouth may lead or trail the sound)
PRIOR_PATH = (
    Path(__file__).resolve().parents[2] / "model" / "speaker" / "assets" / "content_prior.safetensors"
)


@cache
def _mel_bank(rate: int) -> np.ndarray:
    """(N_MELS, N_FFT // 2 + 1) triangular mel filters (HTK mel scale, 60 Hz .. min(7600, rate / 2))."""

    def mel(f):
        return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)

    def hz(m):
        return 700.0 * (10.0 ** (np.asarray(m, np.float64) / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(60.0), mel(min(7600.0, rate / 2)), N_MELS + 2))
    freqs = np.linspace(0.0, rate / 2, N_FFT // 2 + 1)
    bank = np.zeros((N_MELS, freqs.size))
    for i in range(N_MELS):
        lo, mid, hi = edges[i : i + 3]
        bank[i] = np.clip(np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)), 0.0, None)
    return bank


def log_mel(samples: np.ndarray, rate: int, n_frames: int, fps: float) -> np.ndarray:
    """(n_frames, N_MELS) log-mel energies of ``samples`` (mono) in a WIN_S window centred on each frame."""
    x = np.asarray(samples, np.float32)
    win = max(16, round(WIN_S * rate))
    centres = np.round((np.arange(n_frames) + 0.5) / fps * rate).astype(np.int64)
    padded = np.pad(x, (win, win))
    idx = centres[:, None] + np.arange(win)[None, :] + win - win // 2  # (T, win) into padded
    idx = np.clip(idx, 0, padded.size - 1)
    frames = padded[idx] * np.hanning(win).astype(np.float32)
    power = np.abs(np.fft.rfft(frames, N_FFT, axis=1)) ** 2  # (T, N_FFT/2+1)
    return np.log(power @ _mel_bank(rate).T + 1e-8).astype(np.float32)


def zscore(x: np.ndarray, axis: int = 0) -> np.ndarray:
    """``x`` minus its mean over ``axis``, over its std (NaN-aware; a flat column gives zeros)."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column (a face never measured): NaN
        mu = np.nanmean(x, axis=axis, keepdims=True)
        sd = np.nanstd(x, axis=axis, keepdims=True)
    return np.where(sd > 1e-6, (x - mu) / np.where(sd > 1e-6, sd, 1.0), 0.0)


def audio_features(samples: np.ndarray, rate: int, n_frames: int, fps: float) -> np.ndarray:
    """(n_frames, N_MELS * (2 * CONTEXT + 1)) z-scored log-mel bands with +-CONTEXT frames of context."""
    m = zscore(log_mel(samples, rate, n_frames, fps))
    padded = np.pad(m, ((CONTEXT, CONTEXT), (0, 0)), mode="edge")
    return np.concatenate([padded[k : k + n_frames] for k in range(2 * CONTEXT + 1)], axis=1).astype(
        np.float32
    )


@dataclass(frozen=True)
class ContentMap:
    """A ridge map from audio features (D,) to expected mouth shapes (F,): ``y = x @ weight`` (both z-scored)."""

    weight: np.ndarray  # (D, F)
    lam: float  # ridge strength it was fitted (or calibrated) with

    def predict(self, feats: np.ndarray) -> np.ndarray:
        return feats @ self.weight

    def calibrated(self, x: np.ndarray, y: np.ndarray, strength: float | None = None) -> ContentMap:
        """This map refitted on a film's own pairs (x (N, D) audio features, y (N, F) z-scored shapes of the
        face that says them), shrunk towards this map instead of towards zero: with few pairs it stays the
        prior, with many it becomes the film's own (its speakers, language and microphones)."""
        lam = self.lam if strength is None else strength
        ok = np.isfinite(y).all(axis=1) & np.isfinite(x).all(axis=1)
        x, y = x[ok].astype(np.float64), y[ok].astype(np.float64)
        if len(x) == 0:
            return self
        a = x.T @ x + lam * np.eye(x.shape[1])
        w = np.linalg.solve(a, x.T @ y + lam * self.weight)
        return ContentMap(w.astype(np.float32), lam)


def fit(x: np.ndarray, y: np.ndarray, lam: float) -> ContentMap:
    """A ridge map fitted on pairs (x (N, D) audio features, y (N, F) mouth shapes; rows with NaN dropped)."""
    zero = ContentMap(np.zeros((x.shape[1], y.shape[1]), np.float32), lam)
    return zero.calibrated(x, y)


def load_prior(path: Path = PRIOR_PATH) -> ContentMap:
    """The shipped prior (`scripts/fit_content_prior.py`; fitted on tests/data/talking/head1-9, Apache-2.0)."""
    from safetensors.numpy import load_file  # only where a map is needed

    try:
        got = load_file(str(path))
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{path}: cannot read the content map's prior ({exc})") from exc
    return ContentMap(got["weight"], float(got["lam"][0]))


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Mean over columns of the Pearson correlation of a (N, F) and b (N, F); NaN when N < 3."""
    if len(a) < 3:
        return np.nan
    a = a - a.mean(axis=0)
    b = b - b.mean(axis=0)
    den = np.sqrt((a * a).sum(axis=0) * (b * b).sum(axis=0))
    ok = den > 1e-9
    if not ok.any():
        return np.nan
    return float(np.mean((a * b).sum(axis=0)[ok] / den[ok]))


def fit_score(pred: np.ndarray, shapes: np.ndarray, mask: np.ndarray, lag: int = LAG) -> float:
    """How well observed ``shapes`` (T, F) follow predicted ``pred`` (T, F) over the frames of ``mask`` (T,):
    the best mean correlation over lags in [-lag, lag] (the mouth at t + d against the sound at t);
    NaN where fewer than 8 frames have both."""
    best = np.nan
    n = len(pred)
    for d in range(-lag, lag + 1):
        lo, hi = max(0, -d), min(n, n - d)
        if hi - lo < 8:
            continue
        p, s = pred[lo:hi], shapes[lo + d : hi + d]
        m = mask[lo:hi] & np.isfinite(s).all(axis=1)
        if m.sum() < 8:
            continue
        c = _corr(p[m], s[m])
        if np.isfinite(c) and not c <= best:
            best = c
    return best


def track_shapes(shapes: np.ndarray) -> np.ndarray:
    """(n, T, F) mouth shapes z-scored per track over the frames it was measured in (identity and resting
    face removed)."""
    return np.stack([zscore(s) for s in shapes]) if len(shapes) else shapes


def content_rows(
    pred: np.ndarray, shapes: np.ndarray, speech: np.ndarray, fps: float, window_s: float = 2.0
) -> np.ndarray:
    """(n, T) per frame, each face's content fit: windows of ``window_s`` every half window over the shot's
    speech, each window's `fit_score` spread over its frames (the mean where windows overlap); NaN where the
    face was not measured or nothing was said.  pred (T, F); shapes (n, T, F) z-scored per track."""
    n, t_len = shapes.shape[:2]
    out = np.full((n, t_len), np.nan)
    win = max(8, round(window_s * fps))
    hop = max(1, win // 2)
    starts = list(range(0, max(1, t_len - win + 1), hop))
    if starts[-1] + win < t_len:
        starts.append(max(0, t_len - win))
    total = np.zeros((n, t_len))
    count = np.zeros((n, t_len))
    for s0 in starts:
        s1 = min(t_len, s0 + win)
        m = speech[s0:s1]
        if m.sum() < 8:
            continue
        for k in range(n):
            c = fit_score(pred[s0:s1], shapes[k, s0:s1], m)
            if np.isfinite(c):
                sel = slice(s0, s1)
                here = m & np.isfinite(shapes[k, sel]).all(axis=1)
                total[k, sel][here] += c
                count[k, sel][here] += 1
    ok = count > 0
    out[ok] = total[ok] / count[ok]
    return out


def segment_scores(pred: np.ndarray, shapes: np.ndarray, speech: np.ndarray, f0: int, f1: int) -> np.ndarray:
    """(n,) each face's `fit_score` over frames [f0, f1)'s speech (NaN: too little of it, or absent)."""
    m = np.asarray(speech[f0:f1], bool)
    return np.array([fit_score(pred[f0:f1], s[f0:f1], m) for s in shapes])


__all__ = [
    "LAG",
    "ContentMap",
    "audio_features",
    "content_rows",
    "fit",
    "fit_score",
    "load_prior",
    "log_mel",
    "segment_scores",
    "track_shapes",
    "zscore",
]
