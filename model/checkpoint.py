"""The checkpoint helpers every loader in `model/` uses: one error type, strict checks, strict assignment.

Holds `CheckpointError`, key previews, `read_json`, the safetensors readers (`safetensors_keys`,
`read_safetensors_index` finding shards through `<stem>.safetensors.index.json` or a single
`<stem>.safetensors`, `read_safetensors` through a memory-mapped `safe_open`), `read_torch_state`
for `torch.save` files, `check_keys`, and `strict_assign`, THE one way a state dict goes into a
(meta-built) module: keys and shapes checked first, floats cast, tensors moved, errors naming the
file and every bad key. It must not know any component (no model classes, no layouts): it imports
nothing from `model/`, so every loader can import it from below (`model.weights.dit_loader`, `model.network.vae`,
`model.network.t5`, `model.network.clip`, `model.weights.quant`, ...).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

PREVIEW_LIMIT = 20  # keys listed in one error before "... (+N more)"
SHAPE_PROBLEM_LIMIT = 8  # wrong-shape tensors listed in one error


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable, or does not fit the model."""


def key_preview(items: list[str], limit: int = PREVIEW_LIMIT) -> str:
    """The first `limit` items, comma-separated, and how many more there are."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def read_json(path: Path) -> dict:
    """Parse a JSON object file, with errors naming the file."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def safetensors_keys(path: Path) -> list[str]:
    """Tensor names stored in one safetensors file (header only)."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return list(f.keys())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from exc


def read_safetensors_index(directory: Path, stem: str) -> dict[str, Path]:
    """Weight map key -> file for `<stem>.safetensors.index.json` in `directory`, else for a single
    `<stem>.safetensors`. Shards listed in the index must exist."""
    directory = Path(directory)
    index = directory / f"{stem}.safetensors.index.json"
    single = directory / f"{stem}.safetensors"
    if index.is_file():
        raw = read_json(index)
        weight_map = raw.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no 'weight_map' object")
        files = {name: directory / name for name in sorted(set(weight_map.values()))}
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise CheckpointError(f"{index}: shard file(s) not found: {key_preview(missing)}")
        return {key: files[name] for key, name in weight_map.items()}
    if single.is_file():
        return dict.fromkeys(safetensors_keys(single), single)
    raise CheckpointError(f"{directory}: neither {index.name} nor {single.name} found")


def read_safetensors(
    path: Path,
    keys: Iterable[str] | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """Read `keys` (default all) from one file, floating tensors cast to `dtype`, placed on `device`."""
    path = Path(path)
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            available = set(f.keys())
            wanted = list(available) if keys is None else list(keys)
            absent = [k for k in wanted if k not in available]
            if absent:
                raise CheckpointError(
                    f"{path}: missing tensor(s) listed for this file: {key_preview(absent)}"
                )
            for key in wanted:
                tensor = f.get_tensor(key)
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(device=device, dtype=dtype)
                else:
                    tensor = tensor.to(device=device)
                out[key] = tensor
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except Exception as exc:  # corrupt / truncated files surface as safetensors or OS errors
        raise CheckpointError(f"{path}: cannot read safetensors data ({exc})") from exc
    return out


def read_torch_state(path: Path) -> dict[str, torch.Tensor]:
    """Memory-map a `torch.save(state_dict)` file (weights only: nothing in it is executed)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # torch raises RuntimeError, pickle and zip errors for damaged files
        raise CheckpointError(f"{path}: cannot read torch checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a flat state_dict of tensors")
    return state


def _key_problems(expected: Iterable[str], got: Iterable[str], name: Callable[[str], str]) -> list[str]:
    """The missing-key and unexpected-key problems (keys as `name` spells them); empty when they match."""
    expected_set, got_set = set(expected), set(got)
    missing = sorted({name(k) for k in expected_set - got_set})
    unexpected = sorted({name(k) for k in got_set - expected_set})
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {key_preview(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {key_preview(unexpected)}")
    return problems


def check_keys(expected: Iterable[str], got: Iterable[str], source: str) -> None:
    """Raise one error naming `source` and every missing and unexpected key."""
    problems = _key_problems(expected, got, str)
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


def strict_assign(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: Path | str,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    file_name: Callable[[str], str] | None = None,
    origins: Mapping[str, str] | None = None,
) -> nn.Module:
    """Check `state` against a (meta-built) model, cast floats to `dtype`, move to `device`, assign in place.

    Keys and shapes are checked before anything is copied; one error names `source` and every bad
    key as the file spells it (`file_name` maps a converted key back); `origins` (key -> file)
    makes shape errors name the file each tensor came from. Tensors shared between keys (tied
    weights) stay shared; a tensor left on the meta device afterwards is an error.
    """
    name = file_name or str
    origins = origins or {}
    expected = model.state_dict()
    shapes = []
    for k, v in state.items():
        if k in expected and v.shape != expected[k].shape and len(shapes) < SHAPE_PROBLEM_LIMIT:
            where = f"{origins[k]}: " if k in origins else ""  # the file, when the tensors came from several
            shapes.append(
                f"{where}{name(k)} has shape {tuple(v.shape)}, model expects {tuple(expected[k].shape)}"
            )
    problems = _key_problems(expected, state, name) + shapes
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))
    converted: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in state.items():
        if id(v) not in converted:
            cast = dtype if (dtype is not None and v.is_floating_point()) else v.dtype
            converted[id(v)] = v.to(device=device, dtype=cast)
        out[k] = converted[id(v)]
    model.load_state_dict(out, strict=True, assign=True)
    left = sorted(n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta)
    if left:
        raise CheckpointError(f"{source}: tensors not initialised after loading: {', '.join(left[:6])}")
    return model
