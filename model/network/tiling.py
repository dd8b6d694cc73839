"""Spatial tiling of VAE encode/decode: the tile spec and the blend of overlapping tile outputs.

Holds `TileSpec` (tiles of `tile` px every `stride` px, multiples of the VAE's 8-px latent stride)
and the pure helpers that cut a (B, C, T, H, W) tensor into overlapping spatial tiles, run a function
on each and blend the outputs with linear ramps over the overlaps. It sits below both `model.network.vae`
(which tiles with it) and `model.runtime.offload` (which sizes tiles to free memory), so it must not import
either of them or anything else from `model/`, and it holds no model code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPACE_STRIDE = 8  # VAE pixels per latent pixel: tiles are whole latent pixels


@dataclass(frozen=True)
class TileSpec:
    """Spatial tiling in pixels (multiples of 8): tiles of `tile` px every `stride` px, blended linearly."""

    tile: int = 256
    stride: int = 192

    def __post_init__(self) -> None:
        if self.tile % SPACE_STRIDE or self.stride % SPACE_STRIDE or not 0 < self.stride <= self.tile:
            raise ValueError(f"TileSpec needs multiples of 8 with 0 < stride <= tile, got {self}")


def _tile_starts(size: int, tile: int, stride: int) -> list[int]:
    """Tile offsets along one axis of `size` px; the last tile is pulled back to end at the border."""
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile, stride))
    return [*starts, size - tile]


def _blend_ramp(starts: list[int], length: int, i: int, size: int) -> torch.Tensor:
    """1D blend weight of tile i: linear ramps over its overlaps with the neighbouring tiles."""
    s, e = starts[i], min(starts[i] + length, size)
    w = torch.ones(e - s, dtype=torch.float64)
    if i > 0:
        n = min(starts[i - 1] + length, size) - s
        up = torch.arange(1, n + 1, dtype=torch.float64) / (n + 1)
        w[:n] = torch.minimum(w[:n], up)
    if i < len(starts) - 1:
        n = e - starts[i + 1]
        down = torch.arange(n, 0, -1, dtype=torch.float64) / (n + 1)
        w[e - s - n :] = torch.minimum(w[e - s - n :], down)
    return w


def tiled_apply(
    fn, x: torch.Tensor, tile: int, stride: int, factor: int, out_channels: int, out_frames: int
) -> torch.Tensor:
    """Run `fn` on overlapping spatial tiles of x (B, C, T, H, W) and blend the upscaled-by-`factor` outputs.

    `tile`/`stride` are in x's pixels; `factor` is output pixels per input pixel (8 decode, 1/8 encode).
    """
    b, _, _, h, w = x.shape
    hs, ws = _tile_starts(h, tile, stride), _tile_starts(w, tile, stride)
    oh, ow = int(h * factor), int(w * factor)
    out = torch.zeros(b, out_channels, out_frames, oh, ow, dtype=torch.float32, device=x.device)
    weight = torch.zeros(oh, ow, dtype=torch.float32, device=x.device)
    o_hs, o_ws = [int(s * factor) for s in hs], [int(s * factor) for s in ws]
    o_tile_h, o_tile_w = int(min(tile, h) * factor), int(min(tile, w) * factor)
    for i, h0 in enumerate(hs):
        wh = _blend_ramp(o_hs, o_tile_h, i, oh)
        for j, w0 in enumerate(ws):
            ww = _blend_ramp(o_ws, o_tile_w, j, ow)
            y = fn(x[:, :, :, h0 : h0 + tile, w0 : w0 + tile]).float()  # (B, C', T', th, tw)
            wt = (wh[:, None] * ww[None, :]).to(out.device, torch.float32)  # (th, tw)
            ys, xs = o_hs[i], o_ws[j]
            out[..., ys : ys + wt.shape[0], xs : xs + wt.shape[1]] += y * wt
            weight[ys : ys + wt.shape[0], xs : xs + wt.shape[1]] += wt
    return out / weight
