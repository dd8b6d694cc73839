"""Files a run workspace is made of: atomic writes, canonical JSON, first-writer-wins publishing.

Readers of any of these files see the old content or the whole new one, never a torn write; errors
name the file (`WorkspaceError`). Plain JSON views of configs and records (`jsonable`) are what
workspace keys hash. No workspace layout and no Prefect here: `tasks.run.workspace` builds on this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
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


class AtomicFile:
    """A temporary path next to ``final`` that becomes ``final`` on `commit` or vanishes on `discard`.

    The one atomic-write mechanism of the project (model/ keeps its own, it imports nothing from here).
    `commit` fsyncs the written file (or every file of a written folder), renames it over ``final``
    (``os.replace``: readers see the old content or the whole new one) and fsyncs the folder, so a
    completed write also survives a power loss. Nothing is created at ``tmp``: the writer (Python, ffmpeg,
    an OTIO adapter) creates it, with the mode the umask gives. The name ``.<stem>.<pid>-<rand>.tmp<suffix>``
    keeps the suffix tools pick a format from, and `tasks.media.intermediates.clean_temps` finds it.
    For a ``with`` block use `atomic_path`; streaming writers hold an `AtomicFile` across calls.
    """

    def __init__(self, final: str | os.PathLike[str]) -> None:
        self.final = Path(final)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        name = f".{self.final.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{self.final.suffix}"
        self.tmp = self.final.with_name(name)

    def commit(self) -> Path:
        """fsync what was written at ``tmp``, move it to ``final``, fsync the folder; ``final``."""
        try:
            if self.tmp.is_dir():
                for p in sorted(self.tmp.rglob("*"), reverse=True):  # files, then their folders
                    if p.is_dir():
                        _fsync_dir(p)
                    else:
                        _fsync_file(p)
                _fsync_dir(self.tmp)
            elif self.tmp.is_file():
                _fsync_file(self.tmp)
            os.replace(self.tmp, self.final)
        except BaseException:
            self.discard()
            raise
        _fsync_dir(self.final.parent)
        return self.final

    def discard(self) -> None:
        """Remove what was written at ``tmp`` (a file or a folder); ``final`` is left untouched."""
        if self.tmp.is_dir() and not self.tmp.is_symlink():
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                self.tmp.unlink()


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``final`` (same suffix); on success it becomes ``final`` (`AtomicFile`).

    On an exception the temporary file is removed and ``final`` is left untouched.
    """
    target = AtomicFile(final)
    try:
        yield target.tmp
    except BaseException:
        target.discard()
        raise
    target.commit()


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
    _fsync_dir(final.parent)


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
