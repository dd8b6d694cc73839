"""The Wan2.1 causal 3D VAE as a bare network (official `WanVAE_` parameter names): its config, the causal
convolution cache that streams a clip 4 frames at a time, the residual/attention/resampling blocks, the
encoder, the decoder and `CausalVAE` on unscaled latents. `model.network.vae.WanVAE` adds the latent statistics,
tiling and loading.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

TIME_STRIDE = 4


@dataclass(frozen=True)
class VAEConfig:
    """Architecture of the Wan2.1 VAE (`dim` is the base channel width)."""

    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temporal_downsample: tuple[bool, ...] = (False, True, True)


VAE_CONFIGS: dict[str, VAEConfig] = {
    "wan2.1": VAEConfig(),
    "tiny": VAEConfig(dim=8),
}


@dataclass
class CausalCache:
    """Streaming state of one encode or decode stream: trailing frames per causal conv, by module name.

    A fresh (empty) cache starts a new clip; passing the same cache to the next call continues it.
    """

    frames: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def started(self) -> bool:
        return bool(self.frames)


@dataclass
class ZeroTailMemo:
    """Encoder step outputs of a reference-plus-zeros clip that do not depend on the reference frame
    (`CausalVAE.encode_reference_clip`), kept by time chunk: {chunk: (step index, output)}. One per shot:
    filled by its first chunk's conditioning encode, reused by the others (`key` = model, shape, dtype).
    Size: outputs from half resolution on only, ~0.8 GB for an 81-frame 896x448 clip in bfloat16."""

    key: tuple | None = None
    steps: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# building blocks


class CausalConv3d(nn.Conv3d):
    """3D conv that pads only the past in time; with a cache, the past is the previous chunk's frames."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pt, ph, pw = self.padding
        self.time_pad = 2 * pt
        self.space_pad = (pw, pw, ph, ph)
        self.padding = (0, 0, 0)
        self.cache_key = ""  # set by CausalVAE to the module's name

    def forward(self, x: torch.Tensor, cache: CausalCache | None = None) -> torch.Tensor:
        if self.time_pad and cache is not None:
            prev = cache.frames.get(self.cache_key)
            if prev is not None:
                x = torch.cat([prev.to(x.dtype), x], dim=2)  # (B, C, P+T, H, W)
            cache.frames[self.cache_key] = x[:, :, -self.time_pad :].clone()
            front = self.time_pad - (0 if prev is None else prev.shape[2])
        else:
            front = self.time_pad
        x = F.pad(x, (*self.space_pad, front, 0))
        return super().forward(x)


class RMSNorm(nn.Module):
    """Channel-first RMS norm: L2-normalise over channels, times sqrt(C) and a learned gain."""

    def __init__(self, dim: int, images: bool = False) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


def _frames_to_batch(x: torch.Tensor) -> torch.Tensor:
    b, c, t, h, w = x.shape
    return x.transpose(1, 2).reshape(b * t, c, h, w)  # (B*T, C, H, W)


def _batch_to_frames(x: torch.Tensor, b: int) -> torch.Tensor:
    bt, c, h, w = x.shape
    return x.reshape(b, bt // b, c, h, w).transpose(1, 2)  # (B, C, T, H, W)


class Resample(nn.Module):
    """2x spatial up/down-sampling per frame, optionally with 2x causal temporal up/down-sampling."""

    def __init__(self, dim: int, mode: str) -> None:
        super().__init__()
        self.mode = mode
        if mode.startswith("upsample"):
            self.resample = nn.Sequential(
                nn.Upsample(scale_factor=2.0, mode="nearest-exact"), nn.Conv2d(dim, dim // 2, 3, padding=1)
            )
        elif mode.startswith("downsample"):
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        else:
            raise ValueError(f"unknown resample mode {mode!r}")
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        b = x.shape[0]
        if self.mode == "upsample3d":
            x = self._time_upsample(x, cache)
        x = _batch_to_frames(self.resample(_frames_to_batch(x)), b)
        if self.mode == "downsample3d":
            x = self._time_downsample(x, cache)
        return x

    def _time_upsample(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        key = self.time_conv.cache_key
        if key not in cache.frames:
            # The clip's first latent frame stays one frame; later frames see zeros as their past.
            b, c, _, h, w = x.shape
            cache.frames[key] = x.new_zeros(b, c, self.time_conv.time_pad, h, w)
            return x
        b, c, t, h, w = x.shape
        y = self.time_conv(x, cache)  # (B, 2C, T, H, W)
        return y.reshape(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)

    def _time_downsample(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        key = self.time_conv.cache_key
        prev = cache.frames.get(key)
        cache.frames[key] = x[:, :, -1:].clone()
        if prev is None:  # the clip's first frame passes through
            return x
        return self.time_conv(torch.cat([prev.to(x.dtype), x], dim=2))  # (B, C, T/2, H, W)


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(in_dim),
            nn.SiLU(),
            CausalConv3d(in_dim, out_dim, 3, padding=1),
            RMSNorm(out_dim),
            nn.SiLU(),
            nn.Dropout(0.0),
            CausalConv3d(out_dim, out_dim, 3, padding=1),
        )
        self.shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        return _run(self.residual, x, cache) + self.shortcut(x)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the positions of each frame separately."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, cache: CausalCache | None = None) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = self.to_qkv(self.norm(_frames_to_batch(x)))  # (B*T, 3C, H, W)
        q, k, v = y.flatten(2).transpose(1, 2).unsqueeze(1).chunk(3, dim=-1)  # (B*T, 1, HW, C) each
        y = F.scaled_dot_product_attention(q, k, v)  # (B*T, 1, HW, C)
        y = y.squeeze(1).transpose(1, 2).reshape(b * t, c, h, w)
        return _batch_to_frames(self.proj(y), b) + x


def _run(layers: Iterable[nn.Module], x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
    """Apply a sequence, handing the cache to the layers that keep causal state."""
    for layer in layers:
        x = layer(x, cache) if isinstance(layer, CausalConv3d | ResidualBlock | Resample) else layer(x)
    return x


class Encoder3d(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        dims = [cfg.dim * m for m in (1, *cfg.dim_mult)]
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)
        blocks: list[nn.Module] = []
        scale = 1.0
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResidualBlock(in_dim, out_dim))
                if scale in cfg.attn_scales:
                    blocks.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if i < len(cfg.dim_mult) - 1:
                blocks.append(
                    Resample(out_dim, "downsample3d" if cfg.temporal_downsample[i] else "downsample2d")
                )
                scale /= 2.0
        self.downsamples = nn.Sequential(*blocks)
        top = dims[-1]
        self.middle = nn.Sequential(ResidualBlock(top, top), AttentionBlock(top), ResidualBlock(top, top))
        self.head = nn.Sequential(RMSNorm(top), nn.SiLU(), CausalConv3d(top, cfg.z_dim * 2, 3, padding=1))

    def steps(self) -> list[nn.Module]:
        """The encoder as one flat sequence of layers (what `forward` runs, in order)."""
        return [self.conv1, *self.downsamples, *self.middle, *self.head]

    def forward(
        self, x: torch.Tensor, cache: CausalCache, lo: int = 0, hi: int | None = None
    ) -> torch.Tensor:
        """Steps [lo, hi) of `steps()` (default: all) on one time chunk."""
        return _run(self.steps()[lo:hi], x, cache)

    def chunk_reach(self) -> list[int]:
        """Per step: how many time chunks after chunk 0 (a clip's first frame) its output may still depend
        on that frame, counted conservatively per chunk (a call whose input or causal cache holds anything
        derived from frame 0 counts as dependent): a causal conv of time padding p at f frames per chunk
        reaches ceil(p / f) chunks further, a temporal downsampler one (it keeps one frame), the rest none."""
        reach, per_chunk, out = 0, TIME_STRIDE, []
        for step in self.steps():
            if isinstance(step, Resample) and step.mode == "downsample3d":
                reach, per_chunk = reach + 1, per_chunk // 2
            else:
                convs = [m for m in step.modules() if isinstance(m, CausalConv3d) and m.time_pad]
                reach += sum(-(-c.time_pad // per_chunk) for c in convs)  # in sequence (shortcuts are 1x1x1)
            out.append(reach)
        return out


class Decoder3d(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        mult = cfg.dim_mult
        dims = [cfg.dim * m for m in (mult[-1], *mult[::-1])]
        temporal_upsample = cfg.temporal_downsample[::-1]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(
            ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]), ResidualBlock(dims[0], dims[0])
        )
        blocks: list[nn.Module] = []
        scale = 1.0 / 2 ** (len(mult) - 2)
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            if i > 0:
                in_dim //= 2  # the previous upsampler's conv halves the channels
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResidualBlock(in_dim, out_dim))
                if scale in cfg.attn_scales:
                    blocks.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if i < len(mult) - 1:
                blocks.append(Resample(out_dim, "upsample3d" if temporal_upsample[i] else "upsample2d"))
                scale *= 2.0
        self.upsamples = nn.Sequential(*blocks)
        self.head = nn.Sequential(RMSNorm(dims[-1]), nn.SiLU(), CausalConv3d(dims[-1], 3, 3, padding=1))

    def forward(self, x: torch.Tensor, cache: CausalCache) -> torch.Tensor:
        x = self.conv1(x, cache)
        for seq in (self.middle, self.upsamples, self.head):
            x = _run(seq, x, cache)
        return x


class CausalVAE(nn.Module):
    """The bare autoencoder (official `WanVAE_` parameter names); works on unscaled latents."""

    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder3d(cfg)
        self.conv1 = CausalConv3d(cfg.z_dim * 2, cfg.z_dim * 2, 1)
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)
        for name, module in self.named_modules():
            if isinstance(module, CausalConv3d):
                module.cache_key = name

    def encode(self, video: torch.Tensor, cache: CausalCache | None = None) -> torch.Tensor:
        """(B, 3, T, H, W) -> posterior mean (B, z, T', H/8, W/8); a fresh clip needs T = 1 + 4k.

        Frame 0 is encoded alone, then 4 frames at a time. A started `cache` continues a stream
        (then T = 4k and T' = k).
        """
        cache = CausalCache() if cache is None else cache
        t = video.shape[2]
        first = 0 if cache.started else 1
        if t < first or (t - first) % TIME_STRIDE:
            want = "1 + 4k" if first else "4k (continuing a stream)"
            raise ValueError(f"VAE encode needs {want} frames, got {t}")
        bounds = ([(0, 1)] if first else []) + [(s, s + TIME_STRIDE) for s in range(first, t, TIME_STRIDE)]
        feats = [self.encoder(video[:, :, a:b], cache) for a, b in bounds]  # each (B, 2z, 1, h, w)
        mu, _log_var = self.conv1(torch.cat(feats, dim=2)).chunk(2, dim=1)
        return mu

    def encode_reference_clip(self, reference: torch.Tensor, length: int, memo: ZeroTailMemo) -> torch.Tensor:
        """`encode` of [reference, length - 1 zero frames] (B, 3, 1, H, W) -> mu (B, z, 1 + (length-1)/4, h, w),
        bit-identical to it, reusing from `memo` every encoder step output that cannot depend on the
        reference (`Encoder3d.chunk_reach`): the first call for a shape fills the memo, later ones skip, for
        each time chunk past the reach, the encoder steps up to the deepest one it no longer depends on."""
        b, c, _, h, w = reference.shape
        if (length - 1) % TIME_STRIDE:
            raise ValueError(f"VAE encode needs 1 + 4k frames, got {length}")
        video = torch.cat([reference, reference.new_zeros(b, c, length - 1, h, w)], dim=2)  # (B, 3, L, H, W)
        key = (id(self), tuple(video.shape), video.dtype, str(video.device))
        if memo.key != key:
            memo.key, memo.steps = key, {}
        reach = self.encoder.chunk_reach()
        cache = CausalCache()
        bounds = [(0, 1)] + [(s, s + TIME_STRIDE) for s in range(1, length, TIME_STRIDE)]
        feats = []
        for k, (a, e) in enumerate(bounds):
            free = max((i for i, r in enumerate(reach) if r < k), default=-1)  # deepest step free of frame 0
            if k in memo.steps:
                step, x = memo.steps[k]
            else:
                step, x = free, video[:, :, a:e]
                if free >= 0:
                    x = self.encoder(x, cache, 0, free + 1)
                    if 2 * x.shape[-1] <= w:  # kept from half resolution on: full-size ones cost more memory
                        memo.steps[k] = (free, x.clone())  # than the little compute they would save
            feats.append(self.encoder(x, cache, step + 1))  # (B, 2z, 1, h, w)
        mu, _log_var = self.conv1(torch.cat(feats, dim=2)).chunk(2, dim=1)
        return mu

    def decode(self, z: torch.Tensor, cache: CausalCache | None = None) -> torch.Tensor:
        """Unscaled latent (B, z, L, h, w) -> video (B, 3, 1 + 4(L-1), 8h, 8w) (4L when continuing)."""
        cache = CausalCache() if cache is None else cache
        x = self.conv2(z)
        frames = [self.decoder(x[:, :, i : i + 1], cache) for i in range(x.shape[2])]
        return torch.cat(frames, dim=2)


# ---------------------------------------------------------------------------------------------
# public wrapper
