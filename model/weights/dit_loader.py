"""The InfiniteTalk DiT loader: the official Wan2.1 shards plus `infinitetalk.safetensors`, strict.

`load_dit` reproduces what the official pipeline loads (Wan2.1 shards + `infinitetalk.safetensors`,
merged with later files winning, strict) and casts every floating tensor to the run dtype, as the
official `to(param_dtype)` + `to_param_dtype_fp32only` do (nothing is kept in float32; the float32
islands are in the forward instead). It only composes the helpers of `model.checkpoint` with the DiT
class; it must not hold generic checkpoint code (that is `model.checkpoint`), LoRA merging,
quantized loading or the other components (`model.weights.lora`, `model.weights.quant`, `model.weights.loading`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from model.checkpoint import (
    CheckpointError,
    check_keys,
    read_json,
    read_safetensors,
    read_safetensors_index,
    safetensors_keys,
    strict_assign,
)
from model.config import ConfigError, DiTConfig
from model.network.dit import InfiniteTalkDiT
from model.weights.layout import DIT_STEM

log = logging.getLogger(__name__)


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
    strict_assign(model, state, source=f"{wan_dir} + {infinitetalk_file.name}", origins=origins)
    log.info("loaded InfiniteTalk DiT (%d layers, dim %d) from %s", config.num_layers, config.dim, wan_dir)
    return model.eval().requires_grad_(False)
