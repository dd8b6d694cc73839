"""Chunk checkpoints as data only: a backend's state between chunks as one safetensors file.

A shot session's `state()` is a nested record of JSON values (dicts with string keys, lists, str,
int, float, bool, None) and tensors (torch or numpy). It is written as a safetensors file: every
tensor under a generated name, and the record itself, with each tensor replaced by a
``{"$tensor": name}`` (or ``{"$ndarray": name}``) placeholder, as JSON in the file's metadata.
Reading back never executes anything: the header is parsed as JSON, the tensors by safetensors.
The file's SHA-256 (returned by `save_state`) goes into the chunk's done marker; `load_state`
checks it first, so a truncated, flipped or swapped state is an error (`StateError`), never data.
This module must not use pickle, `torch.load` or any other format that can carry code.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from tasks.files import atomic_write_bytes

FORMAT = "dubflow-state-1"
_META_KEY = "dubflow.state"  # metadata entry holding the record (JSON)
_MAX_HEADER = 64 << 20  # a real header is a few kB; refuse to parse absurd ones


class StateError(ValueError):
    """A checkpoint state cannot be used: unreadable, corrupt, or not what its marker recorded."""


def _split(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """The JSON skeleton of `value`, moving its tensors into `tensors`."""
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value.detach().cpu().contiguous()
        return {"$tensor": name}
    if isinstance(value, np.ndarray):
        name = f"t{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value))
        return {"$ndarray": name}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"checkpoint state {where}: dict keys must be strings")
        if len(value) == 1 and next(iter(value)) in ("$tensor", "$ndarray"):
            raise TypeError(f"checkpoint state {where}: the key {next(iter(value))!r} is reserved")
        return {k: _split(v, tensors, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_split(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"checkpoint state {where}: cannot store a {type(value).__name__} (tensors and JSON only)"
    )


def _join(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `_split`."""
    if isinstance(skeleton, dict):
        if len(skeleton) == 1 and "$tensor" in skeleton:
            return tensors[skeleton["$tensor"]]
        if len(skeleton) == 1 and "$ndarray" in skeleton:
            return tensors[skeleton["$ndarray"]].numpy()
        return {k: _join(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [_join(v, tensors) for v in skeleton]
    return skeleton


def encode_state(state: Any) -> bytes:
    """The safetensors bytes of `state` (TypeError naming the field for anything but tensors + JSON)."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split(state, tensors, "state")
    return save_tensors(tensors, metadata={"format": FORMAT, _META_KEY: json.dumps(skeleton)})


def decode_state(data: bytes) -> Any:
    """The state encoded by `encode_state` (StateError when `data` is not such a file)."""
    if len(data) < 8:
        raise StateError(f"{len(data)} bytes: not a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(_MAX_HEADER, len(data) - 8):
        raise StateError("truncated or not a safetensors file (header length out of range)")
    try:
        meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
        if meta.get("format") != FORMAT:
            raise StateError(f"unknown state format {meta.get('format')!r} (expected {FORMAT})")
        skeleton = json.loads(meta[_META_KEY])
        tensors = load_tensors(data)
        return _join(skeleton, tensors)
    except StateError:
        raise
    except Exception as exc:  # safetensors raises its own error types; all mean "corrupt"
        raise StateError(f"corrupt state ({type(exc).__name__}: {exc})") from exc


def save_state(path: str | os.PathLike[str], state: Any) -> dict[str, Any]:
    """Write `state` to `path` atomically; its record for the done marker: {"file", "size", "sha256"}."""
    data = encode_state(state)
    final = Path(path)
    atomic_write_bytes(final, data)
    return {"file": final.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def load_state(path: str | os.PathLike[str], record: dict[str, Any]) -> Any:
    """Read the state at `path` after checking it against its done-marker `record` (StateError if not)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise StateError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    if len(data) != record.get("size") or hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise StateError(f"{p}: {len(data)} bytes that do not match the checkpoint's recorded size and hash")
    try:
        return decode_state(data)
    except StateError as exc:
        raise StateError(f"{p}: {exc}") from exc
