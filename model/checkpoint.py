"""safetensors checkpoint utilities and the InfiniteTalk DiT loader.

Generic pieces (reused by the encoder loaders): `read_safetensors_index` finds shards through the
`<stem>.safetensors.index.json` (or a single `<stem>.safetensors`), `read_safetensors` reads tensors
through a memory-mapped `safe_open`, `check_keys` / `load_into` apply a state dict strictly to a module
built on the meta device (`assign=True`), with errors that name the file and every bad key.

`load_dit` reproduces what the official pipeline loads (Wan2.1 shards + `infinitetalk.safetensors`,
merged with later files winning, strict) and casts every floating tensor to the run dtype, as the
official `to(param_dtype)` + `to_param_dtype_fp32only` do (nothing is kept in float32; the float32
islands are in the forward instead).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from model.config import ConfigError, DiTConfig
from model.dit import InfiniteTalkDiT

log = logging.getLogger(__name__)

DIT_STEM = "diffusion_pytorch_model"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable, or does not fit the model."""


def _list_preview(items: list[str], limit: int = 50) -> str:
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
            raise CheckpointError(f"{index}: shard file(s) not found: {_list_preview(missing)}")
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
                    f"{path}: missing tensor(s) listed for this file: {_list_preview(absent)}"
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


def check_keys(expected: Iterable[str], got: Iterable[str], source: str) -> None:
    """Raise one error naming every missing and unexpected key."""
    expected_set, got_set = set(expected), set(got)
    missing = sorted(expected_set - got_set)
    unexpected = sorted(got_set - expected_set)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {_list_preview(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {_list_preview(unexpected)}")
        raise CheckpointError(f"{source}: " + "; ".join(parts))


def load_into(
    module: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    source: str,
    origins: Mapping[str, str] | None = None,
) -> nn.Module:
    """Strictly assign `state_dict` to `module` (built on meta or not), checking keys and shapes first.

    `origins` (key -> file) makes shape errors name the file each tensor came from.
    """
    expected = module.state_dict()
    check_keys(expected, state_dict, source)
    bad = []
    for key, tensor in state_dict.items():
        want = tuple(expected[key].shape)
        if tuple(tensor.shape) != want:
            where = origins.get(key, source) if origins else source
            bad.append(f"{where}: {key} has shape {tuple(tensor.shape)}, model expects {want}")
        if len(bad) >= 20:
            break
    if bad:
        raise CheckpointError("wrong tensor shape(s): " + "; ".join(bad))
    module.load_state_dict(state_dict, strict=True, assign=True)
    return module


def load_dit(
    wan_dir: Path | str,
    infinitetalk_file: Path | str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    config: DiTConfig | None = None,
) -> InfiniteTalkDiT:
    """Build the DiT on the meta device and fill it from the official files (strict, mmap'd).

    wan_dir holds `config.json` and the `diffusion_pytorch_model` shards (index json or one file);
    infinitetalk_file holds the audio-adapter keys. Floating tensors are cast to `dtype`.
    """
    wan_dir, infinitetalk_file = Path(wan_dir), Path(infinitetalk_file)
    if config is None:
        config_path = wan_dir / "config.json"
        try:
            config = DiTConfig.from_official(read_json(config_path), source=str(config_path))
        except ConfigError as exc:
            raise CheckpointError(str(exc)) from exc
    if not infinitetalk_file.is_file():
        raise CheckpointError(f"{infinitetalk_file}: file not found")

    # key -> file, Wan shards first, the InfiniteTalk file last (later files win, as officially)
    weight_map = read_safetensors_index(wan_dir, DIT_STEM)
    for key in safetensors_keys(infinitetalk_file):
        if key in weight_map:
            log.warning("%s overrides %s from %s", infinitetalk_file, key, weight_map[key])
        weight_map[key] = infinitetalk_file
    by_file: dict[Path, list[str]] = {}
    for key, path in weight_map.items():
        by_file.setdefault(path, []).append(key)

    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    check_keys(model.state_dict(), weight_map, f"{wan_dir} + {infinitetalk_file.name}")

    state: dict[str, torch.Tensor] = {}
    for path, keys in by_file.items():
        state.update(read_safetensors(path, keys, dtype=dtype, device=device))
    origins = {key: str(path) for key, path in weight_map.items()}
    load_into(model, state, f"{wan_dir} + {infinitetalk_file.name}", origins)
    log.info("loaded InfiniteTalk DiT (%d layers, dim %d) from %s", config.num_layers, config.dim, wan_dir)
    return model.eval().requires_grad_(False)
