"""GGUF DiT weights (the city96 Wan conversions + an InfiniteTalk adapter file), dequantized on the fly.

Layout of the published conversions (facts read from city96's ComfyUI-GGUF tools): `general.architecture`
is "wan"; tensor names are the official Wan2.1 keys (`blocks.0.self_attn.q.weight`, ...); ggml stores a
tensor's dims innermost first, so the torch shape is the reversed `ne`, unless a
`comfy.gguf.orig_shape.<name>` INT32 array gives it. Only 2-D weights are quantized; 1-D tensors, tensors
of <= 1024 values and the `.modulation` parameters stay F32, the embeddings / head (`patch_embedding.`,
`text_embedding.`, `time_embedding.`, `time_projection.`, `img_emb.`, `head.`) at the source precision
(F16/BF16/F32), and the 5-D `patch_embedding.weight` is stored as a 5-D F32 tensor. The InfiniteTalk
adapter (`audio_proj.*`, `blocks.N.audio_cross_attn.*`, `blocks.N.norm_x.*`) comes as a second file in
the same format (later file wins, as with the safetensors).

Each quantized Linear becomes a `GGUFLinear` holding the file's bytes (uint8, one row of blocks per
output channel) and dequantizing them in torch where they live (the GPU when the DiT is there, or the
block offload's device slot) right before its matmul: memory stays at the quantized size, and with
`model.runtime.offload.BlockOffload` only two blocks' bytes sit on the device. Block formats (ggml): Q8_0 = f16 d +
32 int8; Q4_K / Q5_K = f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales and mins (8 x 32 values),
(Q5_K: 32 bytes of 5th bits), 128 bytes of nibbles; Q6_K = 128 bytes low nibbles, 64 bytes 2-bit highs,
16 int8 sub-block scales (16 x 16 values), f16 d. F16 / BF16 / F32 tensors are cast to the run dtype
at load. Checked against `gguf`'s numpy dequantizers in tests/test_gguf.py.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.checkpoint import CheckpointError, check_keys, key_preview, read_json
from model.config import ConfigError, DiTConfig

log = logging.getLogger(__name__)

ARCH = "wan"
QK_K = 256
# ggml type id -> (values per block, bytes per block) of the block-quantized types dequantized here
Q8_0, Q4_K, Q5_K, Q6_K = 8, 12, 13, 14
F32, F16, BF16 = 0, 1, 30
BLOCKS = {Q8_0: (32, 34), Q4_K: (QK_K, 144), Q5_K: (QK_K, 176), Q6_K: (QK_K, 210)}
FLOATS = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}
TYPE_NAMES = {Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", F32: "F32", F16: "F16", BF16: "BF16"}


# ---------------------------------------------------------------------------------------------
# dequantization (torch; runs on the bytes' device)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 -> (n, 1) float32."""
    return raw.contiguous().view(torch.float16).float()


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 12) packed 6-bit scales and mins of Q4_K / Q5_K -> (n, 8) each (float32)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return sc.float(), mn.float()


def _nibbles(qs: torch.Tensor, groups: int) -> torch.Tensor:
    """(n, groups * 32) bytes -> (n, 2 * groups, 32) values: each 32 bytes give their low, then high nibbles."""
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).view(1, 1, 2, 1)
    return ((qs.reshape(-1, groups, 1, 32) >> shifts) & 15).reshape(qs.shape[0], 2 * groups, 32)


def dequantize_blocks(raw: torch.Tensor, qtype: int) -> torch.Tensor:
    """(n_blocks, bytes per block) uint8 -> (n_blocks, values per block) float32."""
    n = raw.shape[0]
    if qtype == Q8_0:
        return _f16(raw[:, :2]) * raw[:, 2:].contiguous().view(torch.int8).float()
    if qtype in (Q4_K, Q5_K):
        d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])
        sc, mn = _k_scales(raw[:, 4:16])
        if qtype == Q4_K:
            q = _nibbles(raw[:, 16:144], 4)  # (n, 8, 32)
        else:
            bits = torch.arange(8, dtype=torch.uint8, device=raw.device).view(1, 8, 1)
            high = (raw[:, 16:48].reshape(n, 1, 32) >> bits) & 1  # (n, 8, 32): bit j of byte l -> sub-block j
            q = _nibbles(raw[:, 48:176], 4) | (high << 4)
        return ((d * sc)[:, :, None] * q.float() - (dmin * mn)[:, :, None]).reshape(n, QK_K)
    if qtype == Q6_K:
        # per 128-value half: 64 bytes of low nibbles (values 0-63), then their high nibbles (64-127)
        low = ((raw[:, :128].reshape(n, 2, 1, 64) >> _shifts(raw, (0, 4))) & 15).reshape(n, 8, 32)
        high = ((raw[:, 128:192].reshape(n, 2, 1, 32) >> _shifts(raw, (0, 2, 4, 6))) & 3).reshape(n, 8, 32)
        q = (low | (high << 4)).float() - 32.0  # (n, 8, 32) = 256 values in order
        scales = raw[:, 192:208].contiguous().view(torch.int8).float()  # (n, 16)
        d = _f16(raw[:, 208:210])
        return ((d * scales)[:, :, None] * q.reshape(n, 16, 16)).reshape(n, QK_K)
    raise CheckpointError(f"GGUF type {TYPE_NAMES.get(qtype, qtype)} is not supported")


def _shifts(raw: torch.Tensor, values: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=raw.device).view(1, 1, len(values), 1)


def dequantize(raw: torch.Tensor, qtype: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The bytes of one quantized tensor (any shape, row-major blocks) -> a `shape` tensor of `dtype`."""
    per, nbytes = BLOCKS[qtype]
    out = dequantize_blocks(raw.reshape(-1, nbytes), qtype)
    return out.reshape(shape).to(dtype)


class GGUFLinear(nn.Linear):
    """A Linear whose weight stays in a GGUF block format (`qweight`: (out, bytes per row) uint8) and is
    dequantized to the compute dtype on the device it sits on, right before each matmul."""

    def __init__(
        self,
        qweight: torch.Tensor,
        qtype: int,
        in_features: int,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ):
        nn.Module.__init__(self)
        per, nbytes = BLOCKS[qtype]
        if in_features % per or qweight.shape != (qweight.shape[0], in_features // per * nbytes):
            raise ValueError(f"GGUFLinear: {tuple(qweight.shape)} bytes do not hold rows of {in_features}")
        self.out_features, self.in_features = qweight.shape[0], in_features
        self.qtype = qtype
        self.compute_dtype = dtype
        self.register_buffer("qweight", qweight)  # (out, in / per * nbytes) uint8
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        return dequantize(self.qweight, self.qtype, (self.out_features, self.in_features), self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        name = TYPE_NAMES[self.qtype]
        return f"in_features={self.in_features}, out_features={self.out_features}, {name}"


# ---------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: ggml type, torch-order shape, and its bytes (a read-only memmap)."""

    name: str
    qtype: int
    shape: tuple[int, ...]
    data: np.ndarray


def read_gguf(path: Path | str) -> tuple[str, dict[str, GGUFTensor]]:
    """(architecture, name -> tensor) of a GGUF file, memory-mapped; errors name the file."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises ValueError / struct / numpy errors on damaged files
        raise CheckpointError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    field = reader.get_field("general.architecture")
    arch = str(field.parts[field.data[-1]], encoding="utf-8") if field is not None else ""
    out = {}
    for t in reader.tensors:
        orig = reader.get_field(f"comfy.gguf.orig_shape.{t.name}")
        if orig is not None:
            shape = tuple(int(orig.parts[i][0]) for i in orig.data)
        else:
            shape = tuple(int(v) for v in reversed(t.shape.tolist()))
        out[t.name] = GGUFTensor(t.name, int(t.tensor_type), shape, t.data)
    return arch, out


def _torch_bytes(t: GGUFTensor) -> torch.Tensor:
    """The tensor's quantized bytes as (rows, bytes per row) uint8, rows = all dims but the innermost."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        raw = torch.from_numpy(np.ascontiguousarray(t.data).view(np.uint8))
    rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
    return raw.reshape(rows, -1)


def _float_tensor(t: GGUFTensor, path: Path) -> torch.Tensor:
    if t.qtype in FLOATS:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            raw = torch.from_numpy(np.ascontiguousarray(t.data).view(np.uint8))
        return raw.view(FLOATS[t.qtype]).reshape(t.shape)
    if t.qtype in BLOCKS:  # a quantized tensor that is not a Linear weight: dequantized once, here
        return dequantize(_torch_bytes(t), t.qtype, t.shape, torch.float32)
    raise CheckpointError(f"{path}: {t.name} has GGUF type {t.qtype}, which is not supported")


def load_gguf_dit(
    wan_dir: Path | str,
    files: list[Path],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """The InfiniteTalk DiT from `wan_dir/config.json` + GGUF `files` (the Wan DiT, then the InfiniteTalk
    adapter; later files win), strictly checked: every key present, none unknown, shapes as the config
    says, architecture "wan". Quantized Linear weights stay quantized (`GGUFLinear`); floats -> `dtype`."""
    from model.network.dit import (
        InfiniteTalkDiT,  # the DiT imports a lot; keep `import model.weights.gguf` light
    )

    wan_dir = Path(wan_dir)
    config_path = wan_dir / "config.json"
    try:
        config = DiTConfig.from_official(read_json(config_path), source=str(config_path))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    tensors: dict[str, tuple[GGUFTensor, Path]] = {}
    for path in files:
        arch, found = read_gguf(path)
        if arch != ARCH:
            raise CheckpointError(f"{path}: GGUF architecture {arch!r}, expected {ARCH!r} (a Wan conversion)")
        tensors.update({k: (t, path) for k, t in found.items()})
    source = " + ".join(str(p) for p in files)
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    expected = model.state_dict()
    check_keys(expected, tensors, source)
    bad = [
        f"{path}: {k} has shape {t.shape}, model expects {tuple(expected[k].shape)}"
        for k, (t, path) in tensors.items()
        if t.shape != tuple(expected[k].shape)
    ]
    if bad:
        raise CheckpointError(f"{source}: " + "; ".join(bad[:8]))
    modules = dict(model.named_modules())
    state: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    for key, (t, path) in tensors.items():
        owner, _, leaf = key.rpartition(".")
        counts[TYPE_NAMES.get(t.qtype, str(t.qtype))] = (
            counts.get(TYPE_NAMES.get(t.qtype, str(t.qtype)), 0) + 1
        )
        linear = modules.get(owner)
        if t.qtype in BLOCKS and leaf == "weight" and type(linear) is nn.Linear:
            bias_key = f"{owner}.bias"
            bias = _float_tensor(tensors[bias_key][0], path) if bias_key in tensors else None
            new = GGUFLinear(_torch_bytes(t), t.qtype, linear.in_features, bias, dtype)
            parent, _, child = owner.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, new)
            continue
        state[key] = _float_tensor(t, path)
    quantized = {n for n, m in model.named_modules() if isinstance(m, GGUFLinear)}
    state = {
        k: v.to(dtype) if v.is_floating_point() else v
        for k, v in state.items()
        if k.rpartition(".")[0] not in quantized
    }
    model.load_state_dict(state, strict=False, assign=True)  # keys checked above
    left = sorted(n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta)
    if left:
        raise CheckpointError(f"{source}: tensors not initialised after loading: {key_preview(left)}")
    model.to(device)
    log.info(
        "loaded GGUF DiT from %s (%s; %d Linears dequantized on the fly)",
        source, ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), len(quantized),
    )  # fmt: skip
    return model.eval().requires_grad_(False)
