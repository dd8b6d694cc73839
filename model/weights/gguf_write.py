"""Writing GGUF DiT files as the published Wan conversions lay them out (for tests and random roots).

`write_gguf(path, state, qtype)` applies the published precision rules (see `model.weights.gguf`): 2-D weights
of more than 1024 values in `qtype` unless their name is one of the unquantized prefixes, which keep
`float_type`; 1-D tensors, small tensors and `.modulation` in F32; the 5-D patch embedding as a 5-D F32
tensor. The `gguf` package quantizes Q8_0 / F16 / BF16; the K-quants (Q4_K, Q5_K, Q6_K) have only
dequantizers there, so this file has simple (round-to-nearest, per-sub-block max) quantizers of its own:
valid blocks in the ggml format, not llama.cpp's error-minimising search.
`random_quantized(shape, qtype, std, rng)` writes random valid blocks directly (a real-size random root
in seconds instead of quantizing 14 B floats).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from model.weights.gguf import ARCH, BF16, BLOCKS, F16, F32, Q4_K, Q5_K, Q6_K, Q8_0

UNQUANTIZED = (
    "patch_embedding.",
    "text_embedding.",
    "time_embedding.",
    "time_projection.",
    "img_emb.",
    "head.",
)
SMALL = 1024  # tensors of at most this many values stay F32
TYPES = {"Q8_0": Q8_0, "Q6_K": Q6_K, "Q5_K": Q5_K, "Q4_K": Q4_K, "F16": F16, "BF16": BF16, "F32": F32}


def tensor_type(name: str, shape: tuple[int, ...], qtype: int, float_type: int = BF16) -> int:
    """The ggml type a published Wan conversion stores `name` in."""
    n = int(np.prod(shape))
    if (
        len(shape) <= 1
        or n <= SMALL
        or ".modulation" in name
        or name.endswith("modulation")
        or len(shape) > 4
    ):
        return F32
    if any(name.startswith(p) for p in UNQUANTIZED):
        return float_type
    if qtype in BLOCKS and shape[-1] % BLOCKS[qtype][0]:
        return float_type  # rows not a whole number of blocks: kept at the source precision
    return qtype


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """(n, 8) 6-bit scales and mins -> (n, 12) bytes (the ggml K-quant packing)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
    return out


def _k_asymmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """(n, 256) -> f16 d, dmin (n,), 6-bit scales, mins (n, 8), and q (n, 8, 32) in 0..levels."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0.0)
    hi = sub.max(axis=2)
    scale, minv = (hi - lo) / levels, -lo  # per sub-block: x ~ scale * q - minv
    d = (scale.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    dmin = (minv.max(axis=1) / 63).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.clip(np.rint(scale / d[:, None]), 0, 63), 0)
        mn = np.where(dmin[:, None] > 0, np.clip(np.rint(minv / dmin[:, None]), 0, 63), 0)
        eff, off = (d[:, None] * sc)[:, :, None], (dmin[:, None] * mn)[:, :, None]
        q = np.where(eff > 0, np.clip(np.rint((sub + off) / eff), 0, levels), 0)
    return d, dmin, sc, mn, q.astype(np.uint8)


def _nibble_pack(q: np.ndarray) -> np.ndarray:
    """(n, 8, 32) values < 16 -> (n, 128): byte l of chunk c = q[2c][l] | q[2c+1][l] << 4."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(q.shape[0], 128)


def quantize_blocks(x: np.ndarray, qtype: int) -> np.ndarray:
    """(n, values per block) float32 -> (n, bytes per block) uint8 in `qtype`'s block format."""
    if qtype == Q8_0:
        from gguf import GGMLQuantizationType, quants

        return quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(x.shape[0], 34)
    if qtype in (Q4_K, Q5_K):
        d, dmin, sc, mn, q = _k_asymmetric(x, 15 if qtype == Q4_K else 31)
        parts = [_f16_bytes(d), _f16_bytes(dmin), _pack_k_scales(sc, mn)]
        if qtype == Q5_K:
            bits = ((q >> 4) & 1).astype(np.uint8)  # (n, 8, 32): sub-block j's 5th bits -> bit j of byte l
            parts.append(np.bitwise_or.reduce(bits << np.arange(8, dtype=np.uint8)[None, :, None], axis=1))
        parts.append(_nibble_pack(q & 15))
        return np.concatenate(parts, axis=1)
    if qtype == Q6_K:
        sub = x.reshape(-1, 16, 16)
        amax = np.abs(sub).max(axis=2)
        scale = amax / 31
        d = (scale.max(axis=1) / 127).astype(np.float16).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(d[:, None] > 0, np.clip(np.rint(scale / d[:, None]), -128, 127), 0)
            eff = (d[:, None] * sc)[:, :, None]
            q = np.where(eff > 0, np.clip(np.rint(sub / eff), -32, 31), 0)
        q = (q + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128 values
        ql = np.concatenate([q[:, :, :64] & 15 | ((q[:, :, 64:] & 15) << 4)], axis=-1).reshape(-1, 128)
        hi = (q >> 4) & 3  # (n, 2, 128): value 32k + l of a half -> bits 2k of byte l
        qh = (hi[:, :, 0:32] | hi[:, :, 32:64] << 2 | hi[:, :, 64:96] << 4 | hi[:, :, 96:128] << 6).reshape(
            -1, 64
        )
        return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)
    raise ValueError(f"no block quantizer for ggml type {qtype}")


def quantize(x: np.ndarray, qtype: int) -> np.ndarray:
    """A float array (rows of whole blocks) -> its bytes in `qtype`: (rows..., bytes per row) uint8."""
    per, nbytes = BLOCKS[qtype]
    blocks = quantize_blocks(np.ascontiguousarray(x, dtype=np.float32).reshape(-1, per), qtype)
    return blocks.reshape(*x.shape[:-1], x.shape[-1] // per * nbytes)


def random_quantized(shape: tuple[int, ...], qtype: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid `qtype` bytes for a `shape` tensor whose values have roughly standard deviation `std`."""
    per, nbytes = BLOCKS[qtype]
    n = int(np.prod(shape)) // per
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    if qtype == Q8_0:
        raw[:, :2] = _f16_bytes(np.full(n, std / 73.0, dtype=np.float32))  # uniform int8: std 73.9
    elif qtype in (Q4_K, Q5_K):
        levels = 15 if qtype == Q4_K else 31
        step = std * np.sqrt(12.0) / levels  # uniform q in 0..levels -> std ~ step * levels / sqrt(12)
        raw[:, 0:2] = _f16_bytes(np.full(n, step / 32, dtype=np.float32))
        raw[:, 2:4] = _f16_bytes(np.full(n, step * levels / 2 / 32, dtype=np.float32))
        raw[:, 4:16] = _pack_k_scales(
            np.full((n, 8), 32), np.full((n, 8), 32)
        )  # centred: x = step * (q - L/2)
    elif qtype == Q6_K:
        raw[:, 192:208] = np.full((n, 16), 32, dtype=np.int8).view(np.uint8)
        raw[:, 208:210] = _f16_bytes(np.full(n, std / 18.5 / 32, dtype=np.float32))  # uniform -32..31: 18.5
    return raw.reshape(*shape[:-1], shape[-1] // per * nbytes)


def write_gguf(
    path: Path | str,
    state: dict[str, np.ndarray],
    qtype: int,
    *,
    float_type: int = BF16,
    raw: dict[str, tuple[int, np.ndarray]] | None = None,
) -> Path:
    """Write `state` (name -> float32 array, torch shapes) as a Wan GGUF file; `raw`: tensors already in
    bytes (name -> (ggml type, bytes)), written as they are. Returns the path."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), arch=ARCH)
    writer.add_quantization_version(2)
    for name, array in state.items():
        kind = tensor_type(name, array.shape, qtype, float_type)
        array = np.ascontiguousarray(array, dtype=np.float32)
        if kind in BLOCKS:
            writer.add_tensor(name, quantize(array, kind), raw_dtype=GGMLQuantizationType(kind))
        elif kind == F32:
            writer.add_tensor(name, array, raw_dtype=GGMLQuantizationType.F32)
        else:
            data = quants.quantize(array, GGMLQuantizationType(kind))
            writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType(kind))
    for name, (kind, data) in (raw or {}).items():
        writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType(kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _data_bytes(shape: tuple[int, ...], kind: int) -> int:
    """Bytes of one tensor's data in the file (`kind` from `tensor_type`)."""
    n = int(np.prod(shape))
    if kind in BLOCKS:
        per, nbytes = BLOCKS[kind]
        return n // per * nbytes
    return n * (4 if kind == F32 else 2)


def write_gguf_stream(
    path: Path | str,
    items: list[tuple[str, tuple[int, ...]]],
    make: Callable[[str, tuple[int, ...], int], np.ndarray],
    qtype: int,
    *,
    float_type: int = BF16,
) -> int:
    """Write a Wan GGUF file tensor by tensor (`items`: name, torch shape), so a real-size file never sits
    in memory: `make(name, shape, kind)` returns the tensor in `kind` (from `tensor_type`): bytes
    (rows, bytes per row) uint8 for a block type, float32 for F32, anything `gguf` quantizes to
    F16 / BF16 otherwise. Returns the bytes of tensor data written."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kinds = [tensor_type(name, shape, qtype, float_type) for name, shape in items]
    need = sum(_data_bytes(shape, kind) for (_, shape), kind in zip(items, kinds, strict=True))
    free = shutil.disk_usage(path.parent).free
    if free < need:  # found before the header, not 16 GB into the file
        raise OSError(f"{path}: needs {need / 1e9:.1f} GB of tensor data, {free / 1e9:.1f} GB free there")
    writer = GGUFWriter(str(path), arch=ARCH)
    writer.add_quantization_version(2)
    for (name, shape), kind in zip(items, kinds, strict=True):
        if kind in BLOCKS:
            per, nbytes = BLOCKS[kind]
            byte_shape = (*shape[:-1], shape[-1] // per * nbytes)
            writer.add_tensor_info(
                name, byte_shape, np.dtype(np.uint8), _data_bytes(shape, kind), GGMLQuantizationType(kind)
            )
        else:
            dtype = np.dtype(np.float32 if kind == F32 else np.uint8 if kind == BF16 else np.float16)
            shape_in = shape if kind != BF16 else (*shape[:-1], shape[-1] * 2)
            writer.add_tensor_info(
                name, shape_in, dtype, _data_bytes(shape, kind), GGMLQuantizationType(kind)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = 0
    for (name, shape), kind in zip(items, kinds, strict=True):
        data = make(name, shape, kind)
        if kind not in BLOCKS and kind != F32:
            data = quants.quantize(np.ascontiguousarray(data, dtype=np.float32), GGMLQuantizationType(kind))
        elif kind == F32:
            data = np.ascontiguousarray(data, dtype=np.float32)
        writer.write_tensor_data(data)
        total += data.nbytes
    writer.close()
    return total
