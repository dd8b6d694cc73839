"""Writers of tiny random model files in the official on-disk layouts (for tests and the dry-run demo).

Each writer is deterministic from its seed and produces files the matching loader in `model/` reads
exactly like the real ones. Add one `write_tiny_<component>` function per component.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from model.config import DiTConfig
from model.dit import InfiniteTalkDiT, LayerNorm32, RMSNorm

# The real Wan2.1-I2V-14B config.json has `_class_name`, `_diffusers_version` and these keys; other WanModel kwargs are written only when
# they differ from the WanModel defaults (as the tiny parity config does).
_WAN_CONFIG_KEYS = (
    "dim",
    "eps",
    "ffn_dim",
    "freq_dim",
    "in_dim",
    "model_type",
    "num_heads",
    "num_layers",
    "out_dim",
    "text_len",
)
_DIT_STEM = "diffusion_pytorch_model"


def is_audio_key(key: str) -> bool:
    """Keys that live in `infinitetalk.safetensors` rather than the Wan2.1 shards."""
    return key.startswith("audio_proj.") or ".audio_cross_attn." in key or ".norm_x." in key


def dit_config_json(config: DiTConfig) -> dict:
    """config.json content: the official key set plus every kwarg that differs from WanModel defaults."""
    official = config.to_official()
    defaults = DiTConfig().to_official()
    out: dict = {"_class_name": "WanModel", "_diffusers_version": "0.30.0"}
    for key in _WAN_CONFIG_KEYS:
        out[key] = official[key]
    for key, value in official.items():
        if key not in out and value != defaults[key]:
            out[key] = value
    return out


def random_dit_state(
    config: DiTConfig, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Random DiT weights: N(0, 0.05^2), norm weights 1 + N(0, 0.05^2), drawn in parameter order.

    The time-embedding columns that see sinusoid frequencies >= 0.003 are scaled by 0.02 so the
    modulation is smooth in t (as the parity goldens do; otherwise TeaCache never reuses).
    """
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    norm_weights = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, RMSNorm | LayerNorm32 | nn.LayerNorm)
        and getattr(module, "weight", None) is not None
    }
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, param in model.named_parameters():
        value = torch.randn(param.shape, generator=gen) * 0.05
        if name in norm_weights:
            value = value + 1.0
        state[name] = value
    half = config.freq_dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64) / half)
    fast = torch.cat([freqs, freqs]) >= 0.003  # columns: [cos | sin] of each frequency
    state["time_embedding.0.weight"][:, fast] *= 0.02
    return {k: v.to(dtype).contiguous() for k, v in state.items()}


def write_tiny_dit(
    wan_dir: Path | str,
    infinitetalk_file: Path | str,
    config: DiTConfig,
    seed: int,
    n_shards: int = 3,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Write a random DiT in the official layout; returns the state dict written.

    wan_dir gets config.json, `diffusion_pytorch_model-0000k-of-0000n.safetensors` (non-audio keys)
    and the index json; infinitetalk_file gets the audio keys.
    """
    wan_dir, infinitetalk_file = Path(wan_dir), Path(infinitetalk_file)
    wan_dir.mkdir(parents=True, exist_ok=True)
    infinitetalk_file.parent.mkdir(parents=True, exist_ok=True)
    state = random_dit_state(config, seed, dtype)

    (wan_dir / "config.json").write_text(json.dumps(dit_config_json(config), indent=2) + "\n")

    wan_keys = sorted(k for k in state if not is_audio_key(k))
    per_shard = math.ceil(len(wan_keys) / n_shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(n_shards):
        keys = wan_keys[i * per_shard : (i + 1) * per_shard]
        name = f"{_DIT_STEM}-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: state[k] for k in keys}, str(wan_dir / name), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = name
            total += state[k].numel() * state[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (wan_dir / f"{_DIT_STEM}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    audio = {k: state[k] for k in sorted(state) if is_audio_key(k)}
    save_file(audio, str(infinitetalk_file), metadata={"format": "pt"})
    return state
