"""Wan2.1 causal 3D VAE (video <-> 16-channel latent, 4x in time, 8x in space).

Parameter names follow the official `Wan2.1_VAE.pth` (a plain `state_dict` of the official `WanVAE_`),
so that file loads strictly with no renaming. Video is processed causally in time chunks (encode:
frame 0, then 4 frames at a time; decode: one latent frame at a time). Every causal conv keeps the
last input frames of the previous chunk in an explicit `CausalCache` that the caller owns, so a
stream can be continued across calls and nothing is stored on the modules between calls.

Optional spatial tiling (`model.network.tiling.TileSpec`) bounds peak memory for 720P. It is NOT exact: besides zero
padding at tile borders, the mid-block self-attention spans the whole frame, so every value changes
a little (see `tests/test_vae.py` for the measured error).

The bare network (config, causal cache, blocks, `CausalVAE`) is `model.network.vae_net`; this file holds the
scaled-latent wrapper the pipeline uses (`WanVAE`) and the checkpoint loading.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from model.checkpoint import CheckpointError, read_torch_state, strict_assign
from model.network.tiling import SPACE_STRIDE, TileSpec, tiled_apply
from model.network.vae_net import TIME_STRIDE, CausalCache, CausalVAE, VAEConfig, ZeroTailMemo

log = logging.getLogger(__name__)

# Per-channel latent statistics of the official WanVAE wrapper (float32).
LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


class WanVAE:
    """Scaled-latent interface of the Wan2.1 VAE: what the pipeline uses.

    `encode` returns (mu - mean) / std per channel; `decode` inverts that before decoding. Latents are
    float32; the model runs in its own dtype.
    """

    def __init__(self, model: CausalVAE) -> None:
        self.model = model.eval().requires_grad_(False)
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.mean = torch.tensor(LATENT_MEAN, dtype=torch.float32, device=self.device).view(1, -1, 1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(LATENT_STD, dtype=torch.float32, device=self.device).view(
            1, -1, 1, 1, 1
        )

    @property
    def z_dim(self) -> int:
        return self.model.cfg.z_dim

    @torch.no_grad()
    def encode(
        self, video: torch.Tensor, tiling: TileSpec | None = None, cache: CausalCache | None = None
    ) -> torch.Tensor:
        """Video (B, 3, T, H, W) in [-1, 1], T = 1 + 4k, H, W multiples of 8 -> latent (B, 16, 1 + k, H/8, W/8)."""
        _check_video(video)
        x = video.to(self.device, self.dtype)
        if tiling is None:
            mu = self.model.encode(x, cache)
        else:
            if cache is not None:
                raise ValueError(
                    "tiled encode keeps one cache per tile; streaming with a cache is untiled only"
                )
            frames = 1 + (x.shape[2] - 1) // TIME_STRIDE
            mu = tiled_apply(
                self.model.encode, x, tiling.tile, tiling.stride, 1 / SPACE_STRIDE, self.z_dim, frames
            )
        return (mu.float() - self.mean) * self.inv_std

    @torch.no_grad()
    def encode_reference(
        self,
        reference: torch.Tensor,
        length: int,
        memo: ZeroTailMemo | None = None,
        tiling: TileSpec | None = None,
    ) -> torch.Tensor:
        """`encode` of [reference (B, 3, 1, H, W), length - 1 zero frames], the sampler's image condition:
        the same latent, bit for bit; untiled, it reuses the reference-free part of the encode from `memo`
        (None: a memo of this call only, i.e. no reuse)."""
        _check_video(reference)
        if tiling is not None:
            b, c, _, h, w = reference.shape
            return self.encode(torch.cat([reference, reference.new_zeros(b, c, length - 1, h, w)], 2), tiling)
        memo = ZeroTailMemo() if memo is None else memo
        mu = self.model.encode_reference_clip(reference.to(self.device, self.dtype), length, memo)
        return (mu.float() - self.mean) * self.inv_std

    @torch.no_grad()
    def decode(
        self,
        latent: torch.Tensor,
        tiling: TileSpec | None = None,
        clamp: bool = True,
        cache: CausalCache | None = None,
    ) -> torch.Tensor:
        """Latent (B, 16, L, h, w) -> video (B, 3, 1 + 4(L-1), 8h, 8w), clamped to [-1, 1] unless `clamp=False`."""
        if latent.ndim != 5 or latent.shape[1] != self.z_dim:
            raise ValueError(f"latent must be (B, {self.z_dim}, L, h, w), got {tuple(latent.shape)}")
        z = (latent.to(self.device, torch.float32) / self.inv_std + self.mean).to(self.dtype)
        if tiling is None:
            video = self.model.decode(z, cache).float()
        else:
            if cache is not None:
                raise ValueError(
                    "tiled decode keeps one cache per tile; streaming with a cache is untiled only"
                )
            frames = 1 + TIME_STRIDE * (z.shape[2] - 1)
            tile, stride = tiling.tile // SPACE_STRIDE, tiling.stride // SPACE_STRIDE
            video = tiled_apply(self.model.decode, z, tile, stride, SPACE_STRIDE, 3, frames)
        return video.clamp_(-1.0, 1.0) if clamp else video


def _check_video(video: torch.Tensor) -> None:
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"video must be (B, 3, T, H, W), got {tuple(video.shape)}")
    h, w = video.shape[-2:]
    if h % SPACE_STRIDE or w % SPACE_STRIDE:
        raise ValueError(f"video height and width must be multiples of 8, got {h}x{w}")


# ---------------------------------------------------------------------------------------------
# loading


def vae_config_from_state(state: dict[str, torch.Tensor]) -> VAEConfig:
    """Read base width and latent channels off the checkpoint; the rest is the Wan2.1 layout."""
    try:
        dim = state["encoder.conv1.weight"].shape[0]
        z_dim = state["conv2.weight"].shape[0]
    except KeyError as e:
        raise KeyError(f"not a Wan VAE state dict: missing {e.args[0]!r}") from e
    return VAEConfig(dim=dim, z_dim=z_dim)


def load_vae(
    pth: Path | str,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    config: VAEConfig | None = None,
) -> WanVAE:
    """Load `Wan2.1_VAE.pth` (or a tiny one) strictly into a meta-built model; returns the scaled wrapper."""
    pth = Path(pth)
    state = read_torch_state(pth)
    try:
        cfg = config or vae_config_from_state(state)
    except KeyError as e:
        raise CheckpointError(f"{pth}: {e.args[0]}") from e
    with torch.device("meta"):
        model = CausalVAE(cfg)
    strict_assign(model, state, source=pth, dtype=dtype, device=device)
    log.info("loaded VAE %s (dim %d, %s, %s)", pth, cfg.dim, dtype, device)
    return WanVAE(model)
