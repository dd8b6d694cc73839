"""A speaker-identity embedding of speech (GE2E, Wan et al., ICASSP 2018): whose voice a stretch of dialogue is.

The network is Resemblyzer's voice encoder (Apache-2.0; three LSTM layers of 256 over 40 mel bands, a linear
layer, ReLU, unit length), written here from its checkpoint's keys; its weights, converted once to float16 by
`scripts/convert_voice_encoder.py`, are `model/speaker/assets/ge2e_voice.safetensors` (docs/models.md: source, licence).  An
utterance is cut into 1.6 s partials (160 mel frames, 1.3 partials a second, the last kept when at least 75 %
covered, zero-padded), each embedded, and the mean brought back to unit length: two stretches of one voice
score a cosine of about 0.7-0.9 at 2 s, two voices about 0.5 (benchmarks/RESULTS.md).  Must not import tasks/.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from model.checkpoint import read_safetensors, strict_assign

WEIGHTS = Path(__file__).parent / "assets" / "ge2e_voice.safetensors"
RATE = 16000  # Hz, the audio the encoder takes
N_MELS = 40
WINDOW = 400  # samples (25 ms) per mel frame ...
HOP = 160  # ... every 10 ms
PARTIAL = 160  # mel frames of one partial utterance (1.6 s)
PARTIALS_PER_S = 1.3
MIN_COVERAGE = 0.75  # the last partial counts when at least this share of it is audio
HIDDEN = 256
LAYERS = 3


class VoiceEncoder(nn.Module):
    """(partials, PARTIAL, N_MELS) power mel frames -> (partials, HIDDEN) unit-length embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, HIDDEN, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)  # hidden: (LAYERS, partials, HIDDEN)
        out = torch.relu(self.linear(hidden[-1]))
        return out / out.norm(dim=1, keepdim=True).clamp_min(1e-12)


# Slaney's mel scale (librosa's default, which the encoder was trained with): linear below BREAK_HZ, logarithmic above
MEL_HZ = 200.0 / 3  # Hz per mel below the break
BREAK_HZ = 1000.0
LOG_STEP = float(np.log(6.4) / 27.0)  # natural-log Hz per mel above it


def _to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, np.float64)
    above = BREAK_HZ / MEL_HZ + np.log(np.maximum(hz, BREAK_HZ) / BREAK_HZ) / LOG_STEP
    return np.where(hz >= BREAK_HZ, above, hz / MEL_HZ)


def _to_hz(mel: np.ndarray) -> np.ndarray:
    brk = BREAK_HZ / MEL_HZ
    return np.where(mel >= brk, BREAK_HZ * np.exp(LOG_STEP * (mel - brk)), MEL_HZ * mel)


def mel_bank() -> np.ndarray:
    """(N_MELS, WINDOW // 2 + 1) triangular filters spread evenly in mel from 0 Hz to Nyquist, each scaled to
    unit area in Hz (Slaney's normalisation)."""
    edges = _to_hz(np.linspace(0.0, float(_to_mel(np.array(RATE / 2))), N_MELS + 2))  # (N_MELS + 2,) Hz
    bins = np.linspace(0.0, RATE / 2, WINDOW // 2 + 1)  # (201,) Hz of each rfft bin
    width = np.diff(edges)
    rise = (bins[None, :] - edges[:-2, None]) / width[:-1, None]
    fall = (edges[2:, None] - bins[None, :]) / width[1:, None]
    tri = np.maximum(0.0, np.minimum(rise, fall))  # (N_MELS, 201)
    return (tri * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


def mel_frames(wav: np.ndarray) -> np.ndarray:
    """(frames, N_MELS) power mel spectrogram of mono float audio at RATE: `len // HOP + 1` frames of WINDOW
    samples centred on every HOP (zero-padded at the ends), a periodic Hann window, |rfft|^2 through `mel_bank`.
    This is what the encoder's training features were (librosa.feature.melspectrogram with these sizes,
    tests/test_voices.py checks it); numpy alone, so no first call waits on librosa's import and numba."""
    x = np.pad(np.asarray(wav, np.float32), WINDOW // 2)
    n = 1 + (len(x) - WINDOW) // HOP
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WINDOW) / WINDOW)).astype(np.float32)
    idx = np.arange(WINDOW)[None, :] + HOP * np.arange(n)[:, None]  # (frames, WINDOW)
    power = np.abs(np.fft.rfft(x[idx] * window, axis=1)) ** 2  # (frames, 201)
    return (power @ mel_bank().T).astype(np.float32)


def partial_starts(n_samples: int) -> list[int]:
    """Start mel frame of each partial utterance covering ``n_samples`` of audio."""
    step = int(round(RATE / PARTIALS_PER_S / HOP))
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    starts = list(range(0, max(1, n_frames - PARTIAL + step + 1), step))
    last = starts[-1] * HOP
    if len(starts) > 1 and (n_samples - last) / (PARTIAL * HOP) < MIN_COVERAGE:
        starts.pop()
    return starts


def embed(encoder: VoiceEncoder, wav: np.ndarray) -> np.ndarray:
    """(HIDDEN,) unit-length voice embedding of mono float audio at RATE (any length; short audio is padded)."""
    return embed_many(encoder, [wav])[0]


def embed_many(encoder: VoiceEncoder, wavs: Sequence[np.ndarray]) -> np.ndarray:
    """(len(wavs), HIDDEN) `embed` of each stretch, their partials through the network in one batch (the
    LSTM's steps are small matrix products: one batch of 18 stretches took a third of the CPU of 18 calls)."""
    parts, owner = [], []
    for k, wav in enumerate(wavs):
        wav = np.asarray(wav, np.float32)
        starts = partial_starts(len(wav))
        need = (starts[-1] + PARTIAL) * HOP
        if need > len(wav):
            wav = np.pad(wav, (0, need - len(wav)))
        mel = mel_frames(wav)  # (frames, N_MELS)
        parts += [mel[s : s + PARTIAL] for s in starts]
        owner += [k] * len(starts)
    if not parts:
        return np.zeros((0, HIDDEN), np.float32)
    # one thread: the LSTM's small steps gain nothing from more, and on 2 cores the pool's spin-waits cost 13x
    # the CPU time (measured: 0.87 vs 0.07 CPU-s for 2 s of speech)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            each = encoder(torch.from_numpy(np.stack(parts))).numpy()  # (partials, HIDDEN)
    finally:
        torch.set_num_threads(threads)
    owners = np.asarray(owner)
    means = np.stack([each[owners == k].mean(axis=0) for k in range(len(wavs))])  # (stretches, HIDDEN)
    return means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)


def load_voice_encoder(path: Path | str = WEIGHTS) -> VoiceEncoder:
    """The encoder with the weights of ``path`` (safetensors), float32 CPU, eval mode (about 50 ms of CPU: once per shot that needs it).

    A missing, unreadable or foreign file raises `CheckpointError` naming it.
    """
    path = Path(path)
    state = read_safetensors(path, dtype=torch.float32)
    with torch.device("meta"):
        net = VoiceEncoder()
    return strict_assign(net, state, source=path, device="cpu").eval()  # type: ignore[return-value]


__all__ = [
    "RATE",
    "WEIGHTS",
    "VoiceEncoder",
    "embed",
    "embed_many",
    "load_voice_encoder",
    "mel_frames",
    "partial_starts",
]
