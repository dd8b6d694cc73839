"""Audio-visual agreement: how well a face track's mouth motion follows the source's speech, per step.

A moving mouth is not a speaking one: a listener smiles, nods, chews or mouths words, and a reaction shot
shows lips that move under someone else's voice.  What tells a speaker is *agreement*: the lips open and
close with the syllables of the speech on the track.  Holds the two signals and their comparison, pure
numpy on per-frame rows (no media, no models):

- the speech envelope of the source's audio at each video frame: log energy over a 40 ms window around
  the frame's middle, and its onsets (the rises of that energy, smoothed over three frames);
- the mouth motion of each track (`tasks.perception.lips.MouthMeter`'s frame-to-frame mouth change,
  smoothed over three frames);
- `agreement`: per track and decision step, the Pearson correlation of the motion with the envelope and
  with its onsets (their mean), at the track's best lag within +-``lag_s`` over the shot's speech (the
  mouth may lead or trail the sound a little, a film's sound may be a frame or two off), over a window of ``window_s`` around the step that
  stays inside the step's stretch of speech (plus ``margin_s`` either side, where lips open before a line
  and close after it), so a turn's score is not mixed with the neighbouring turn's.  Scores are compared
  across the tracks on screen by `tasks.perception.speaker.find_av_speakers`.
Must not decode media nor decide who speaks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ENERGY_WINDOW_S = 0.04  # the envelope's analysis window around each frame's middle
FLOOR = 1e-7  # energy floor (about -70 dBFS): silence reads flat, not as noise


@dataclass(frozen=True)
class SyncSettings:
    """The agreement measure's windows (the `speaker:` section's av_* keys)."""

    lag_s: float  # the lag search covers +-lag_s
    window_s: float  # correlation window around each step
    margin_s: float  # the window may reach this far outside the step's stretch of speech
    min_window_s: float  # shorter windows (a short line) are widened to this, inside the shot


def speech_envelope(samples: np.ndarray, sr: int, n_frames: int, fps: float) -> np.ndarray:
    """(2, n_frames): log energy at each video frame's middle and its onsets (positive rises), from mono
    float32 ``samples`` that start at frame 0."""
    x = np.asarray(samples, np.float64).ravel()
    half = max(1, round(ENERGY_WINDOW_S * sr / 2))
    sq = np.concatenate([[0.0], np.cumsum(x * x)])
    centre = np.round((np.arange(n_frames) + 0.5) * sr / fps).astype(np.int64)
    a, b = np.clip(centre - half, 0, len(x)), np.clip(centre + half, 0, len(x))
    energy = np.where(b > a, (sq[b] - sq[a]) / np.maximum(1, b - a), 0.0)
    env = np.log(energy + FLOOR)
    rise = _mean3(np.diff(env, prepend=env[:1]))
    return np.stack([env, np.maximum(0.0, rise)])


def _mean3(x: np.ndarray) -> np.ndarray:
    """Three-frame running mean along the last axis (edges averaged over what exists; NaN stays NaN)."""
    pad = np.concatenate([x[..., :1], x, x[..., -1:]], axis=-1)
    return (pad[..., :-2] + pad[..., 1:-1] + pad[..., 2:]) / 3.0


def mouth_motion(change: np.ndarray) -> np.ndarray:
    """(n_tracks, T) mouth motion: the frame-to-frame mouth change smoothed over three frames (NaN: absent)."""
    return _mean3(np.asarray(change, np.float64))


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    d = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    return float(np.dot(a, b) / d) if d > 1e-12 else 0.0


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[(start, end)] of the True runs of a bool row."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def windows(
    speech: np.ndarray, step: int, fps: float, settings: SyncSettings
) -> list[tuple[int, int] | None]:
    """Per decision step: the frames [a, b) its agreement is measured over (None: a step without speech)."""
    n = len(speech)
    n_steps = -(-n // step)
    run_of = np.full(n, -1)
    runs = _runs(speech)
    for i, (a, b) in enumerate(runs):
        run_of[a:b] = i
    half, margin = round(settings.window_s * fps / 2), round(settings.margin_s * fps)
    least = round(settings.min_window_s * fps)
    out: list[tuple[int, int] | None] = []
    for s in range(n_steps):
        sl = slice(s * step, min(n, (s + 1) * step))
        hits = run_of[sl][run_of[sl] >= 0]
        if not len(hits):
            out.append(None)
            continue
        r0, r1 = runs[int(np.bincount(hits).argmax())]
        centre = (sl.start + sl.stop) // 2
        a, b = max(r0 - margin, centre - half), min(r1 + margin, centre + half)
        if b - a < least:  # a short line: widen it (symmetrically, inside the shot)
            grow = least - (b - a)
            a, b = a - grow // 2, b + grow - grow // 2
            a, b = (0, min(n, b - a)) if a < 0 else (a, b)
            a, b = (max(0, n - (b - a)), n) if b > n else (a, b)
        out.append((max(0, a), min(n, b)))
    return out


def _shifted(row: np.ndarray, d: int) -> np.ndarray:
    """row[t + d] at each t (NaN where t + d falls outside)."""
    out = np.full(len(row), np.nan)
    if d >= 0:
        out[: len(row) - d] = row[d:]
    else:
        out[-d:] = row[:d]
    return out


def _agree(m: np.ndarray, env: np.ndarray, onset: np.ndarray, frames: np.ndarray, least: float) -> float:
    """Mean correlation of motion ``m`` with the envelope and the onsets over ``frames`` (NaN: too few)."""
    ok = frames[~np.isnan(m[frames])]
    if len(ok) < least:
        return np.nan
    return 0.5 * (_corr(m[ok], env[ok]) + _corr(m[ok], onset[ok]))


def best_lag(motion: np.ndarray, envelope: np.ndarray, speech: np.ndarray, fps: float, lag_s: float) -> int:
    """The lag (frames, the mouth at t + lag against the sound at t) within +-lag_s at which one track's
    motion agrees best with the speech over all of the shot's speech frames (0 when it cannot tell)."""
    frames = np.flatnonzero(speech)
    lag = max(0, round(lag_s * fps))
    best, at = -np.inf, 0
    for d in range(-lag, lag + 1):
        v = _agree(_shifted(motion, d), envelope[0], envelope[1], frames, 0.6 * fps)
        if np.isfinite(v) and v > best:
            best, at = v, d
    return at


def agreement(
    motion: np.ndarray,
    envelope: np.ndarray,
    speech: np.ndarray,
    fps: float,
    step: int,
    settings: SyncSettings,
) -> np.ndarray:
    """(n_tracks, n_steps) agreement in [-1, 1] of each track's mouth motion with the speech, NaN where the
    step has no speech or the track is visible in less than 60 % (or 0.6 s) of the step's window.

    Each track's lag is searched once over the shot's speech (`best_lag`: a face that speaks keeps its
    lag, one that agrees by chance would find a different one in every window).
    motion (n_tracks, T): `mouth_motion`; envelope (2, T): `speech_envelope`; speech (T,) bool.
    """
    n_tracks, n = motion.shape
    speech = np.asarray(speech, bool)
    wins = windows(speech, step, fps, settings)
    out = np.full((n_tracks, len(wins)), np.nan)
    env, onset = envelope
    for k in range(n_tracks):
        m = _shifted(motion[k], best_lag(motion[k], envelope, speech, fps, settings.lag_s))
        for s, win in enumerate(wins):
            if win is not None:
                a, b = win
                out[k, s] = _agree(m, env, onset, np.arange(a, b), max(0.6 * (b - a), 0.6 * fps))
    return out


__all__ = ["SyncSettings", "agreement", "best_lag", "mouth_motion", "speech_envelope", "windows"]
