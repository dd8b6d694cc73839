"""Build every InfiniteTalk component from a weights root in the official layout.

`load_models(root, spec)` is the one entry point. Models are constructed on the meta device and
their weights assigned from memory-mapped files with strict key and shape checks, so a wrong or
damaged file fails before any compute with an error naming the file (and key).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A weights file that cannot be read or does not fit the model (message names the file/key)."""


def read_torch_state(path: Path) -> dict[str, torch.Tensor]:
    """Memory-map a `torch.save(state_dict)` file (weights only, nothing executed)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weights file not found")
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # torch raises RuntimeError, pickle/zip errors, ... for damaged files
        raise CheckpointError(f"{path}: cannot read torch checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a flat state_dict of tensors")
    return state


def _describe(keys: set[str], limit: int = 6) -> str:
    shown = ", ".join(sorted(keys)[:limit])
    return shown + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def check_state(model: nn.Module, state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Raise CheckpointError naming `source` and every missing / unexpected / wrongly shaped key."""
    expected = model.state_dict()
    missing = set(expected) - set(state)
    unexpected = set(state) - set(expected)
    problems = []
    if missing:
        problems.append(f"missing keys: {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_describe(unexpected)}")
    bad_shapes = [
        f"{k} has shape {tuple(state[k].shape)}, model expects {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems += bad_shapes[:4]
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


def strict_assign(
    model: nn.Module,
    state: dict[str, torch.Tensor],
    *,
    source: Path | str,
    dtype: torch.dtype | None,
    device: torch.device | str,
) -> None:
    """Check `state` against a (meta-built) model, cast floats to `dtype`, move, and assign in place.

    Tensors shared between keys (tied weights) stay shared. Fails if any tensor is left on meta.
    """
    check_state(model, state, source)
    converted: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in state.items():
        if id(v) not in converted:
            cast = dtype if (dtype is not None and v.is_floating_point()) else v.dtype
            converted[id(v)] = v.to(device=device, dtype=cast)
        out[k] = converted[id(v)]
    model.load_state_dict(out, strict=True, assign=True)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise CheckpointError(f"{source}: tensors not initialised after loading: {_describe(set(left))}")
