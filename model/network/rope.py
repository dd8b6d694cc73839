"""Rotary position embeddings of the DiT: 3D (frame, height, width) for self-attention, 1D for the
two-speaker audio routing.

Both rotate interleaved pairs (x[2i], x[2i+1]) by an angle, i.e. the complex product the official code
computes with `view_as_complex`. Here the angles are turned into real cos/sin tables once per grid
shape (float64 angles, stored as float32) and the rotation is plain float32 arithmetic.
"""

from __future__ import annotations

import torch

from model.config import DiTConfig


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of the last dim of x (..., D) by angles whose cos/sin broadcast to
    (..., D/2). Returns float32."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (..., D/2, 2)
    re, im = pairs.unbind(-1)  # (..., D/2) each
    return torch.stack((re * cos - im * sin, re * sin + im * cos), dim=-1).flatten(-2)  # (..., D)


def _inverse_frequencies(dim: int, theta: float, dtype: torch.dtype) -> torch.Tensor:
    """theta^(-2i/dim) for i < dim/2 (the standard RoPE frequencies of a `dim`-wide rotation)."""
    return 1.0 / torch.pow(theta, torch.arange(0, dim, 2, dtype=dtype) / dim)


class Rope3D:
    """3D RoPE tables for one model instance, computed once per (frames, height, width, device).

    The head dimension's D/2 pairs are split (time, height, width) as `config.rope_axis_pairs`; each
    axis uses the frequencies of a rotation of width 2 * pairs (as the official `rope_params`).
    """

    def __init__(self, config: DiTConfig):
        self.axis_pairs = config.rope_axis_pairs
        self.theta = config.rope_theta
        self._tables: dict[tuple[int, int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, grid: tuple[int, int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape (F*H*W, 1, D/2), float32, tokens in (frame, row, column) order."""
        key = (*grid, torch.device(device))
        cached = self._tables.get(key)
        if cached is None:
            cached = self._build(grid, device)
            self._tables[key] = cached
        return cached

    def _build(self, grid: tuple[int, int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        per_axis = []
        for n, pairs in zip(grid, self.axis_pairs, strict=True):
            freqs = _inverse_frequencies(2 * pairs, self.theta, torch.float64)  # (pairs,)
            per_axis.append(torch.arange(n, dtype=torch.float64)[:, None] * freqs)  # (n, pairs)
        f, h, w = grid
        angles = torch.cat(
            [
                per_axis[0][:, None, None, :].expand(f, h, w, -1),
                per_axis[1][None, :, None, :].expand(f, h, w, -1),
                per_axis[2][None, None, :, :].expand(f, h, w, -1),
            ],
            dim=-1,
        ).reshape(f * h * w, 1, -1)  # (L, 1, D/2)
        return angles.cos().float().to(device), angles.sin().float().to(device)

    def clear(self) -> None:
        self._tables.clear()


def rope_1d_tables(
    positions: torch.Tensor, head_dim: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (..., D/2) for real-valued 1D positions (...,), in float32 like the official
    `RotaryPositionalEmbedding1D`."""
    freqs = _inverse_frequencies(head_dim, theta, torch.float32).to(positions.device)  # (D/2,)
    angles = positions.float()[..., None] * freqs  # (..., D/2)
    return angles.cos(), angles.sin()
