"""Quantized InfiniteTalk DiT from the official fp8 / int8 files (optimum-quanto format).

The official `quant_models/infinitetalk_single_{fp8,int8}.safetensors` hold the whole DiT after
`quanto.quantize(model, weights=qfloat8|qint8); freeze(model)`: every `nn.Linear` weight is stored as
`<name>.weight._data` (float8_e4m3fn / int8, [out, in]) and `<name>.weight._scale` (float32, [out, 1]),
next to a `.json` quantization map. They are read back with `optimum.quanto.requantize`, which
loads with `strict=False`, so the key set is checked here first (and again after) and any gap fails.

Each quanto `QLinear` is then swapped for a `DequantLinear` that keeps the 1-byte weights and
computes `F.linear(x, (data.float() * scale).to(dtype), bias)`, i.e. "dequantize, then float matmul"
(the documented reference semantics, ~4e-7 from the official outputs). The dequantized weight is a
transient per call, so memory stays at one byte per weight; it also keeps the DiT's float32 islands
(which read `linear.weight`) working, which quanto's weight tensors forbid for non-float32 dtypes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from model.checkpoint import CheckpointError, check_keys, read_json, read_safetensors, safetensors_keys
from model.config import ConfigError, DiTConfig
from model.network.dit import InfiniteTalkDiT

log = logging.getLogger(__name__)

QUANT_MODES = ("fp8", "int8")
_QTYPES = {"qfloat8", "qfloat8_e4m3fn", "qint8"}
_QUANT_SUFFIXES = ("weight._data", "weight._scale", "input_scale", "output_scale")


class DequantLinear(nn.Linear):
    """Linear layer with per-output-row quantized weights, dequantized to the compute dtype on use.

    fp8 data is held as a uint8 view so `module.to(dtype)` can never convert it.
    """

    def __init__(
        self, data: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
    ):
        nn.Module.__init__(self)
        self.out_features, self.in_features = data.shape
        self.data_dtype = data.dtype
        self.compute_dtype = dtype
        stored = data.view(torch.uint8) if data.dtype.is_floating_point else data
        self.register_buffer("weight_data", stored)  # (out, in) 1 byte each
        self.register_buffer("weight_scale", scale.float().reshape(-1, 1))  # (out, 1) float32
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        data = (
            self.weight_data.view(self.data_dtype) if self.data_dtype.is_floating_point else self.weight_data
        )
        return (data.float() * self.weight_scale).to(self.compute_dtype)  # (out, in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, data={self.data_dtype}"


def quant_map_path(quant_file: Path) -> Path:
    """The quanto map next to the weights: `<stem>.json` (official: the path with 'safetensors' -> 'json')."""
    return quant_file.with_suffix(".json")


def expected_quant_keys(model: nn.Module, qmap: dict, source: str) -> set[str]:
    """State-dict keys a frozen quanto model has: quantized Linears store data/scale + input/output scales."""
    modules = dict(model.named_modules())
    keys = set(model.state_dict())
    for name, spec in qmap.items():
        module = modules.get(name)
        if not isinstance(module, nn.Linear):
            raise CheckpointError(
                f"{source}: quantization map names {name!r}, which is not a Linear of the DiT"
            )
        weights, acts = spec.get("weights"), spec.get("activations", "none")
        if weights not in _QTYPES or acts not in ("none", None):
            raise CheckpointError(
                f"{source}: {name}: unsupported quantization weights={weights} activations={acts}"
            )
        keys.discard(f"{name}.weight")
        keys.update(f"{name}.{s}" for s in _QUANT_SUFFIXES)
    return keys


def _to_dequant(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace every quanto QLinear by a DequantLinear holding the same 1-byte data. Returns the count."""
    from optimum.quanto.nn import QLinear  # optional heavy import

    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, QLinear)]
    for name, m in targets:
        w = m.weight
        data = getattr(w, "_data", None)
        scale = getattr(w, "_scale", None)
        if data is None or scale is None:
            raise CheckpointError(f"{name}: quantized weight has no _data/_scale (not frozen?)")
        new = DequantLinear(data, scale, None if m.bias is None else m.bias.data, dtype)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    return len(targets)


def load_quant_dit(
    wan_dir: Path | str,
    quant_file: Path | str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> InfiniteTalkDiT:
    """DiT from `wan_dir/config.json` + an official quanto file (+ its `.json` map), strictly checked."""
    from optimum.quanto import requantize  # optional heavy import

    wan_dir, quant_file = Path(wan_dir), Path(quant_file)
    config_path = wan_dir / "config.json"
    try:
        config = DiTConfig.from_official(read_json(config_path), source=str(config_path))
    except ConfigError as e:
        raise CheckpointError(str(e)) from e
    map_path = quant_map_path(quant_file)
    qmap = read_json(map_path)

    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    expected = expected_quant_keys(model, qmap, str(map_path))
    check_keys(expected, safetensors_keys(quant_file), str(quant_file))  # before anything is allocated

    state = read_safetensors(quant_file)
    requantize(model, state, qmap, device=torch.device("cpu"))
    check_keys(model.state_dict(), state, f"{quant_file} (after requantize)")  # quanto loads strict=False

    n = _to_dequant(model, dtype)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.is_floating_point() and p.dtype != dtype:
                setattr(module, name, nn.Parameter(p.data.to(dtype), requires_grad=False))
    model = model.to(device)
    bad = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if bad:
        raise CheckpointError(f"{quant_file}: tensors left uninitialised: {', '.join(bad[:6])}")
    log.info("loaded quantized DiT %s (%d quantized Linears, compute %s, %s)", quant_file, n, dtype, device)
    return model.eval().requires_grad_(False)
