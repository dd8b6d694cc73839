"""MFCCs as Light-ASD was trained on them: 13 cepstra per 10 ms of 16 kHz audio (pure numpy).

The reference features are `python_speech_features.mfcc(signal, 16000, numcep=13, winlen=0.025,
winstep=0.01)` on int16-scaled samples; this is the same computation written out (tested against that
package in tests/test_light_asd.py): pre-emphasis 0.97; 25 ms rectangular frames every 10 ms, the last
one zero-padded; the power spectrum over a 512-point FFT (|X|^2 / 512); 26 triangular mel filters from 0
Hz to Nyquist, their edges on FFT bins floor(513 * hz / sr); the log filter energies through an
orthonormal DCT-II, first 13 kept, liftered with 1 + 11 sin(pi n / 22); the first cepstrum replaced by
the log of the frame's total power.  Must not import tasks/.
"""

from __future__ import annotations

import numpy as np

SR = 16000
WIN_S, HOP_S = 0.025, 0.010
N_FFT, N_FILTERS, N_CEPS, LIFTER, PREEMPH = 512, 26, 13, 22, 0.97
INT16_SCALE = 32768.0  # the reference reads 16-bit PCM as integers


def _mel(hz: np.ndarray) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + hz / 700.0)


def _hz(mel: np.ndarray) -> np.ndarray:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filters(sr: int = SR) -> np.ndarray:
    """(26, 257) triangular mel filter bank over the rfft bins."""
    edges = np.floor(
        (N_FFT + 1) * _hz(np.linspace(_mel(np.array(0.0)), _mel(np.array(sr / 2)), N_FILTERS + 2)) / sr
    )
    edges = edges.astype(np.int64)
    bank = np.zeros((N_FILTERS, N_FFT // 2 + 1))
    for j in range(N_FILTERS):
        lo, mid, hi = edges[j], edges[j + 1], edges[j + 2]
        up = np.arange(lo, mid)
        bank[j, up] = (up - lo) / max(1, mid - lo)
        down = np.arange(mid, hi)
        bank[j, down] = (hi - down) / max(1, hi - mid)
    return bank


def _dct_ortho(x: np.ndarray, n_out: int) -> np.ndarray:
    """Orthonormal DCT-II along the last axis, the first ``n_out`` coefficients."""
    n = x.shape[-1]
    k = np.arange(n_out)[:, None]
    basis = np.cos(np.pi * k * (2 * np.arange(n)[None, :] + 1) / (2 * n)) * np.sqrt(2.0 / n)
    basis[0] /= np.sqrt(2.0)
    return x @ basis.T


def mfcc(samples: np.ndarray, sr: int = SR) -> np.ndarray:
    """(n_frames, 13) float32 MFCCs of mono float ``samples`` in [-1, 1] at ``sr`` (16 kHz), 100 per second;
    n_frames = 1 + ceil((len - 400) / 160) (at least 1)."""
    x = np.asarray(samples, np.float64).ravel() * INT16_SCALE
    x = np.append(x[:1], x[1:] - PREEMPH * x[:-1]) if len(x) else np.zeros(1)
    win, hop = round(WIN_S * sr), round(HOP_S * sr)
    n = 1 if len(x) <= win else 1 + int(np.ceil((len(x) - win) / hop))
    x = np.pad(x, (0, (n - 1) * hop + win - len(x)))
    idx = np.arange(win)[None, :] + hop * np.arange(n)[:, None]
    power = np.abs(np.fft.rfft(x[idx], N_FFT)) ** 2 / N_FFT  # (n, 257)
    eps = np.finfo(np.float64).eps
    energy = power.sum(axis=1)
    energy = np.where(energy == 0, eps, energy)
    fb = power @ mel_filters(sr).T
    fb = np.where(fb == 0, eps, fb)
    ceps = _dct_ortho(np.log(fb), N_CEPS)
    ceps *= 1.0 + (LIFTER / 2.0) * np.sin(np.pi * np.arange(N_CEPS) / LIFTER)
    ceps[:, 0] = np.log(energy)
    return ceps.astype(np.float32)


__all__ = ["SR", "mel_filters", "mfcc"]
