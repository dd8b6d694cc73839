"""Merge LoRA / weight-difference files into a loaded DiT (lightx2v, FusionX, SimpleTuner / diffusers Wan LoRAs).

Key formats (`<p>` = a DiT module path, after a `diffusion_model.`, `transformer.` or PEFT
`base_model.model.` prefix; official Wan names, or diffusers' `WanTransformer3DModel` names, which
`model.weights.lora_keys` translates, one naming per file):
  `<p>.lora_down.weight` + `<p>.lora_up.weight` [+ `<p>.alpha`]  ->  W += scale * (alpha / rank) * up @ down
  `<p>.lora_A.weight` + `<p>.lora_B.weight` (PEFT spelling of the same)
  `<p>.diff`   -> W += scale * diff        `<p>.diff_b` / `<p>.lora_B.bias` -> bias += scale * diff_b
Without an `alpha` key the factor alpha / rank is 1. (The official InfiniteTalk merge ignores `alpha`
altogether; the common Wan LoRAs store alpha == rank, where both agree.) Every key must be
understood and every target must exist with the right shape, otherwise nothing is merged and the
error names the offending keys. Merging is done in float32 and rounded once to the parameter dtype.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.checkpoint import CheckpointError
from model.weights.lora_keys import file_naming, official_path, split_key

log = logging.getLogger(__name__)


class LoraError(CheckpointError):
    """A LoRA file that cannot be merged (message names the file and keys)."""


@dataclass(frozen=True)
class LoraUpdate:
    """One parameter update: low-rank (`up @ down`, scaled) or a full difference tensor."""

    target: str  # parameter name in the DiT, e.g. "blocks.0.self_attn.q.weight"
    down: torch.Tensor | None = None  # (r, in, *k)
    up: torch.Tensor | None = None  # (out, r, *1)
    diff: torch.Tensor | None = None
    factor: float = 1.0  # alpha / rank
    key: str = ""  # the file's key it came from (for error messages)

    def fits(self, shape: torch.Size) -> bool:
        """Whether the update reshapes onto a parameter of `shape` (checked before any merge)."""
        if self.diff is not None:
            return self.diff.numel() == shape.numel()
        rows, inner = self.up.shape[0], self.down[0].numel()
        return rows == shape[0] and rows * inner == shape.numel()

    def delta(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        if self.diff is not None:
            return self.diff.to(device, torch.float32).reshape(shape) * self.factor
        up = self.up.to(device, torch.float32).flatten(1)  # (out, r)
        down = self.down.to(device, torch.float32).flatten(1)  # (r, in * k)
        return (up @ down).reshape(shape) * self.factor


def parse_lora(tensors: dict[str, torch.Tensor], source: str) -> list[LoraUpdate]:
    """Group a LoRA file's tensors into updates on official parameter names (diffusers names translated);
    unknown, unpaired or repeated keys raise LoraError naming `source` and the file's keys."""
    parts = {key: split_key(key) for key in tensors}
    unknown = sorted(k for k, p in parts.items() if p is None)
    if unknown:
        raise LoraError(f"{source}: unrecognised LoRA key(s): {', '.join(unknown[:8])}")
    naming = file_naming(p for p in parts.values() if p is not None)
    # official module path -> {"down" / "up" / "alpha": tensor, "key": the file's first key of it}
    groups: dict[str, dict[str, Any]] = {}
    diffs: dict[str, LoraUpdate] = {}
    mixed, repeated = [], []
    for key, (_, path, kind) in ((k, p) for k, p in parts.items() if p is not None):
        module = path if naming == "official" else official_path(path)
        if module is None:
            mixed.append(key)
        elif kind in ("diff", "diff_b"):
            target = module + (".weight" if kind == "diff" else ".bias")
            if target in diffs:
                repeated.append(key)
            diffs[target] = LoraUpdate(target=target, diff=tensors[key], key=key)
        else:
            group = groups.setdefault(module, {"key": key})
            if kind in group:
                repeated.append(key)
            group[kind] = tensors[key]
    if mixed:
        raise LoraError(
            f"{source}: diffusers-named LoRA also uses official key(s): {', '.join(sorted(mixed)[:8])}"
        )
    if repeated:
        raise LoraError(f"{source}: more than one key for the same update: {', '.join(sorted(repeated)[:8])}")
    unpaired = sorted(g["key"] for g in groups.values() if "down" not in g or "up" not in g)
    if unpaired:
        raise LoraError(f"{source}: lora_down/lora_up pair incomplete for: {', '.join(unpaired[:8])}")
    updates = list(diffs.values())
    for module, g in groups.items():
        rank = g["down"].shape[0]
        if g["up"].shape[1] != rank:
            raise LoraError(f"{source}: {g['key']}: up rank {g['up'].shape[1]} != down rank {rank}")
        factor = float(g["alpha"].float().reshape(-1)[0]) / rank if "alpha" in g else 1.0
        updates.append(
            LoraUpdate(target=module + ".weight", down=g["down"], up=g["up"], factor=factor, key=g["key"])
        )
    return updates


def read_lora(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a LoRA safetensors file (memory-mapped)."""
    from safetensors import safe_open

    if not path.is_file():
        raise LoraError(f"{path}: LoRA file not found")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as e:  # safetensors raises its own error types
        raise LoraError(f"{path}: not a readable safetensors file ({e})") from e


@torch.no_grad()
def merge_lora(
    model: nn.Module, path: Path | str, scale: float = 1.0, *, device: torch.device | str | None = None
) -> int:
    """Add `scale` x the LoRA in `path` to the model's weights in place; returns the number of tensors changed.

    `device`: where each merged weight is computed (default: where it lives), so a host-resident model
    (block offload) gets the same bits as one merged on the device it runs on.
    """
    path = Path(path)
    updates = parse_lora(read_lora(path), str(path))
    params = dict(model.named_parameters())
    missing = sorted(f"{u.key} ({u.target})" for u in updates if u.target not in params)
    if missing:
        raise LoraError(f"{path}: LoRA targets not in the model: {', '.join(missing[:8])}")
    misfit = [
        f"{u.key} ({u.target} {tuple(params[u.target].shape)})"
        for u in updates
        if not u.fits(params[u.target].shape)
    ]
    if misfit:
        raise LoraError(f"{path}: LoRA update shape does not fit: {', '.join(misfit[:8])}")
    for u in updates:  # one delta at a time: never a second full copy of the model
        p = params[u.target]
        at = p.device if device is None else torch.device(device)
        p.copy_((p.to(at).float() + scale * u.delta(p.shape, at)).to(p.dtype))
    log.info("merged LoRA %s (scale %g) into %d tensors", path, scale, len(updates))
    return len(updates)
