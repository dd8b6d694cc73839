"""wav2vec2 audio features for InfiniteTalk: per video frame, every transformer layer's hidden state.

Official feature path (`get_embedding`): 16 kHz mono, loudness normalised to -23 LUFS, zero-mean /
unit-variance waveform, conv feature encoder, conv features linearly interpolated (align_corners)
to the video frame count, then feature projection and the transformer; the result stacks the
outputs of all transformer layers: (frames, layers, hidden) = (n, 12, 768) for chinese-wav2vec2-base.
The official code assumes 25 fps; here the frame rate is a parameter.

Long audio is processed in windows of video frames, each run with context margins on both sides
and only its centre kept. Everything before the transformer is computed exactly as for the whole
track (the waveform normalisation and the first conv layer's GroupNorm use whole-track statistics,
the interpolation uses whole-track positions), so only the self-attention's reach is limited to
window + margins. A track shorter than one window gives the whole-track result.

The official `Wav2Vec2Model` subclass sets `config.output_attentions = True` inside `forward`, which
newer transformers reject with the SDPA backend; nothing here asks for attention maps, so the stock
model runs with whatever attention backend transformers picks.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2Model

from model.checkpoint import CheckpointError

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
TARGET_LUFS = -23.0
_LOUDNESS_BLOCK_S = 0.4  # pyloudnorm's gating block; shorter audio has no defined loudness


def loudness_normalize(
    wave: np.ndarray, sr: int = SAMPLE_RATE, target_lufs: float = TARGET_LUFS
) -> np.ndarray:
    """Scale to `target_lufs` integrated loudness (BS.1770); silent or too-short audio is returned as is."""
    import pyloudnorm  # only the audio path needs it

    if len(wave) < _LOUDNESS_BLOCK_S * sr:
        log.info("audio of %d samples is shorter than one loudness block; not normalised", len(wave))
        return wave
    loudness = pyloudnorm.Meter(sr).integrated_loudness(wave)
    if abs(loudness) > 100:  # -inf for silence: nothing to scale (official rule)
        return wave
    return pyloudnorm.normalize.loudness(wave, loudness, target_lufs).astype(wave.dtype, copy=False)


@dataclass(frozen=True)
class AudioWindowing:
    """Transformer windows in seconds: `window_s` kept per window, `margin_s` extra context each side."""

    window_s: float = 60.0
    margin_s: float = 10.0


def frame_count(n_samples: int, fps: float, sr: int = SAMPLE_RATE) -> int:
    """Video frames covered by the audio, truncated (official: int(len / sr * 25))."""
    return int(n_samples / sr * fps)


class AudioEncoder:
    """Waveform (16 kHz mono) -> (frames, layers, hidden) float features for the DiT's audio adapter."""

    def __init__(self, model: Wav2Vec2Model, do_normalize: bool = True, sample_rate: int = SAMPLE_RATE):
        cfg = model.config
        if cfg.do_stable_layer_norm:
            raise ValueError("only post-norm wav2vec2 encoders (do_stable_layer_norm=False) are supported")
        self.model = model.eval().requires_grad_(False)
        self.do_normalize = do_normalize
        self.sample_rate = sample_rate
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.stride = math.prod(cfg.conv_stride)  # waveform samples per conv frame
        rf, step = cfg.conv_kernel[0], cfg.conv_stride[0]
        for k, s in zip(cfg.conv_kernel[1:], cfg.conv_stride[1:], strict=True):
            rf, step = rf + (k - 1) * step, step * s
        self.receptive_field = rf  # waveform samples seen by one conv frame
        self.num_layers = cfg.num_hidden_layers
        self.hidden = cfg.hidden_size

    # -- stage 1: waveform -> conv features (exact for any sample range) --

    def normalize(self, wave: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Zero mean / unit variance over the whole waveform (feature extractor rule, 1e-7 in the sqrt)."""
        x = torch.as_tensor(np.asarray(wave, dtype=np.float32))
        if x.ndim != 1:
            raise ValueError(f"expected a mono waveform (n,), got shape {tuple(x.shape)}")
        if not self.do_normalize:
            return x
        mean = x.double().mean()
        var = ((x.double() - mean) ** 2).mean()
        return ((x - mean.float()) / torch.sqrt(var + 1e-7).float()).float()

    def _first_conv_stats(self, x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Whole-track per-channel mean / variance of the first conv layer (its GroupNorm is global)."""
        layer = self.model.feature_extractor.conv_layers[0]
        if not isinstance(getattr(layer, "layer_norm", None), torch.nn.GroupNorm):
            return None  # layer-norm conv stacks are local: nothing global to precompute
        k, s = layer.conv.kernel_size[0], layer.conv.stride[0]
        n_out = (x.numel() - k) // s + 1
        total = torch.zeros(layer.conv.out_channels, dtype=torch.float64, device=self.device)
        total_sq = torch.zeros_like(total)
        for f0 in range(0, n_out, chunk):
            f1 = min(n_out, f0 + chunk)
            seg = x[f0 * s : (f1 - 1) * s + k].to(self.device, self.dtype)
            y = layer.conv(seg[None, None]).double()[0]  # (C, f1 - f0)
            total += y.sum(dim=1)
            total_sq += (y * y).sum(dim=1)
        mean = total / n_out
        var = (total_sq / n_out - mean * mean).clamp_min(0.0)
        return mean, var

    def conv_features(
        self, x: torch.Tensor, start: int, stop: int, stats: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """Conv frames [start, stop) of the normalised waveform x -> (stop - start, C), in the model dtype."""
        seg = x[start * self.stride : (stop - 1) * self.stride + self.receptive_field]
        h = seg.to(self.device, self.dtype)[None, None]  # (1, 1, samples)
        layers = self.model.feature_extractor.conv_layers
        first = layers[0]
        if stats is None:
            h = first(h)
        else:
            norm = first.layer_norm
            mean, var = (t.to(self.dtype).view(1, -1, 1) for t in stats)
            h = first.conv(h)
            h = (h - mean) * torch.rsqrt(var + norm.eps) * norm.weight.view(1, -1, 1) + norm.bias.view(
                1, -1, 1
            )
            h = first.activation(h)
        for layer in layers[1:]:
            h = layer(h)
        return h[0].transpose(0, 1)  # (frames, C)

    def track_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Whole-track statistics the conv stack needs (the first layer's GroupNorm), or None."""
        return self._first_conv_stats(x, chunk=1 << 16)

    def frame_features(
        self, x: torch.Tensor, n: int, start: int, stop: int, stats: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """Conv features linearly interpolated to video frames [start, stop) of an n-frame track -> (stop-start, C).

        Frame j sits at conv position j * (n_conv - 1) / (n - 1) (F.interpolate linear, align_corners=True).
        """
        if x.numel() < self.receptive_field:
            raise ValueError(f"audio of {x.numel()} samples is shorter than one wav2vec2 frame")
        n_conv = (x.numel() - self.receptive_field) // self.stride + 1
        scale = (n_conv - 1) / (n - 1) if n > 1 else 0.0
        pos = torch.arange(start, stop, dtype=torch.float64) * scale
        lo = pos.floor().long().clamp_max(n_conv - 1)
        hi = (lo + 1).clamp_max(n_conv - 1)
        first = int(lo[0])
        feats = self.conv_features(x, first, int(hi[-1]) + 1, stats)  # (conv frames, C)
        frac = (pos - lo).to(self.device, feats.dtype)[:, None]
        lo, hi = (lo - first).to(self.device), (hi - first).to(self.device)
        return feats[lo] * (1 - frac) + feats[hi] * frac  # (stop - start, C)

    # -- stage 2: conv features -> per-frame transformer hidden states --

    def _encode(self, feats: torch.Tensor) -> torch.Tensor:
        """(L, C) conv features at video frames -> (L, layers, hidden), all transformer layer outputs."""
        enc = self.model.encoder
        h, _ = self.model.feature_projection(feats[None])  # (1, L, D)
        h = enc.layer_norm(h + enc.pos_conv_embed(h))
        outs = []
        for layer in enc.layers:
            h = layer(h)
            h = h[0] if isinstance(h, tuple) else h  # transformers 4.x returns a tuple
            outs.append(h[0])
        return torch.stack(outs, dim=1)  # (L, layers, D)

    @torch.no_grad()
    def embed(
        self,
        wave: np.ndarray | torch.Tensor,
        fps: float = 25.0,
        n_frames: int | None = None,
        windowing: AudioWindowing | None = None,
        out_dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Mono 16 kHz waveform -> (n_frames, layers, hidden) on CPU.

        `n_frames` defaults to the frames the audio covers at `fps`. Loudness normalisation is the
        caller's step (`loudness_normalize`), as in the official pipeline.
        """
        windowing = windowing or AudioWindowing()
        x = self.normalize(wave)
        n = frame_count(x.numel(), fps, self.sample_rate) if n_frames is None else n_frames
        out = torch.empty(n, self.num_layers, self.hidden, dtype=out_dtype)
        if n == 0:
            return out
        if x.numel() < self.receptive_field:
            raise ValueError(f"audio of {x.numel()} samples is shorter than one wav2vec2 frame")
        stats = self.track_stats(x)
        win = max(1, round(windowing.window_s * fps))
        margin = max(0, round(windowing.margin_s * fps))
        for a in range(0, n, win):
            b = min(n, a + win)
            ca, cb = max(0, a - margin), min(n, b + margin)  # window plus context margins
            feats = self.frame_features(x, n, ca, cb, stats)  # (cb - ca, C)
            out[a:b] = self._encode(feats)[a - ca : b - ca].to("cpu", out_dtype)
        return out


def load_wav2vec(
    model_dir: Path | str, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> AudioEncoder:
    """Load a local HF wav2vec2 directory (e.g. chinese-wav2vec2-base); missing weights are an error."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir / 'config.json'}: wav2vec2 config not found")
    try:
        model, info = Wav2Vec2Model.from_pretrained(
            str(model_dir), local_files_only=True, dtype=dtype, output_loading_info=True
        )
        extractor = Wav2Vec2FeatureExtractor.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{model_dir}: cannot load wav2vec2 ({e})") from e
    bad = [*info.get("missing_keys", []), *(str(m) for m in info.get("mismatched_keys", []))]
    if bad:
        raise CheckpointError(f"{model_dir}: weights missing or mis-shaped: {', '.join(sorted(bad)[:6])}")
    sr = extractor.sampling_rate
    if sr != SAMPLE_RATE:
        raise CheckpointError(
            f"{model_dir}: feature extractor expects {sr} Hz, dubflow feeds {SAMPLE_RATE} Hz"
        )
    log.info(
        "loaded wav2vec2 %s (%d layers, %s, %s)", model_dir, model.config.num_hidden_layers, dtype, device
    )
    return AudioEncoder(model.to(device), do_normalize=extractor.do_normalize, sample_rate=sr)
