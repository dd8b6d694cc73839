"""Helpers shared by the parity runners."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b| over the whole tensor (the parity README's measure)."""
    a = a.detach().double().cpu()
    b = b.detach().double().cpu()
    assert a.shape == b.shape, f"shape {tuple(a.shape)} != golden {tuple(b.shape)}"
    denom = b.abs().max().clamp_min(1e-30)
    return float((a - b).abs().max() / denom)


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> None:
    err = rel_err(a, b)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e}"


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
