"""Files a run workspace is made of: atomic writes, canonical JSON, first-writer-wins publishing.

Readers of any of these files see the old content or the whole new one, never a torn write; errors
name the file (`WorkspaceError`). Plain JSON views of configs and records (`jsonable`) are what
workspace keys hash. No workspace layout and no Prefect here: `flows.workspace` builds on this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any


class WorkspaceError(RuntimeError):
    """A workspace file cannot be read or created (the message names the file)."""


# ------------------------------------------------------------------------------ atomic writes


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``final`` (same suffix); on success ``os.replace`` it into place.

    On an exception the temporary file is removed and ``final`` is left untouched. The temporary name
    keeps the final suffix so tools that pick a format from it (ffmpeg) behave the same.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{final.suffix}")
    try:
        yield tmp
        if tmp.is_file():
            _fsync_file(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(final.parent)


def atomic_temp(final: str | Path) -> Path:
    """A fresh temp path next to `final` (same directory => os.replace is atomic), same suffix."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=f".tmp{final.suffix}", dir=final.parent)
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(final: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``final`` atomically (readers see the old file or the whole new one)."""
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)
    return Path(final)


def atomic_write_json(final: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write_bytes(final, json_bytes(obj))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; errors name the file."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{path}: cannot read JSON ({exc})") from exc


# ---------------------------------------------------------------------------------- helpers


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(jsonable(obj), indent=2, sort_keys=True) + "\n").encode()


def jsonable(obj: Any) -> Any:
    """Plain-JSON view of configs and records (dataclasses, paths, fractions, enums, tuples, sets)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return sorted(jsonable(v) for v in obj)
    if isinstance(obj, Enum):
        return jsonable(obj.value)
    if isinstance(obj, Fraction):
        return f"{obj.numerator}/{obj.denominator}"
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot hash a {type(obj).__name__} value: {obj!r}")


def publish_once(final: Path, data: bytes) -> None:
    """Create ``final`` with ``data`` unless it already exists (first writer wins, never torn)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, final)
    finally:
        os.unlink(tmp)


def _fsync_file(path: Path) -> None:
    with path.open("rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
