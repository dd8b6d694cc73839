"""Files a run workspace is made of: atomic writes, canonical JSON, first-writer-wins publishing, derived
caches bound to what made them, and bounded reads of regular files.

Readers of any of these files see the old content or the whole new one, never a torn write; errors
name the file (`WorkspaceError`). Plain JSON views of configs and records (`jsonable`) are what
workspace keys hash.

A derived cache (a shot partition, a face analysis, a shot's delivery segment) is *bound*: written
with a digest of what it was made from and a SHA-256 of its own content (`write_bound_json`, or a
record beside a binary file, `bind_file`), and reused only when both still hold (`read_bound_json`,
`bound_file_ok`). One copied from another film or shot, made under other settings, damaged or
replaced is not reused: it is removed with one log line and made again (never delivered, never a
stuck state). `read_regular` is the one way a small file a user hands in is read: a regular file
(a FIFO or a device is refused at once, never waited on) of bounded size.
No workspace layout and no Prefect here: `tasks.run.workspace` builds on this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from tasks.errors import ConfigError

log = logging.getLogger(__name__)

MIB = 1 << 20
MAX_BOUND_JSON = 64 << 20  # a derived JSON cache is small; anything larger is damaged


class WorkspaceError(RuntimeError):
    """A workspace file cannot be read or created (the message names the file)."""


class NotRegular(OSError):
    """A path names something else than a regular file of bounded size (the message says what)."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))  # fmt: skip


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words (``a FIFO``, ``a folder`` ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def check_regular(path: str | os.PathLike[str]) -> os.stat_result:
    """The stat of `path` (symlinks followed) when it is a regular file, else `NotRegular` saying what
    it is; opens nothing, so a FIFO is never waited on."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(f"not a regular file ({kind_of(st.st_mode)})")
    return st


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (else `NotRegular`); opened without
    blocking, checked on the descriptor that is read (no swap between check and read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"not a regular file ({kind_of(st.st_mode)})")
        if st.st_size > limit:
            raise NotRegular(f"larger than {limit} bytes ({st.st_size})")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotRegular(f"larger than {limit} bytes")
    return data


def head_tail_fingerprint(path: str | os.PathLike[str]) -> str:
    """Cheap content fingerprint of a (large) file: size, mtime and its first and last MiB hashed."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"not a regular file ({kind_of(st.st_mode)})")
        digest = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
        digest.update(os.pread(fd, MIB, 0))
        if st.st_size > MIB:
            digest.update(os.pread(fd, MIB, max(MIB, st.st_size - MIB)))
    finally:
        os.close(fd)
    return digest.hexdigest()[:32]


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


# ------------------------------------------------------------------------- bound derived caches


def digest_of(obj: Any) -> str:
    """SHA-256 of the canonical JSON of `obj` (what `jsonable` accepts)."""
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def write_bound_json(final: str | os.PathLike[str], made_from: Any, body: Any) -> Path:
    """Write the derived JSON `body` atomically, bound to `made_from` (what it was computed from)."""
    return atomic_write_json(
        final, {"made_from": digest_of(made_from), "sha256": digest_of(body), "body": body}
    )


def bound_body(data: Any, made_from: Any) -> Any:
    """The body of a bound cache's JSON `data` when it was made from `made_from` and is whole, else
    ValueError saying why (another film's or shot's, other settings, damaged)."""
    if not isinstance(data, dict) or not {"made_from", "sha256", "body"} <= set(data):
        raise ValueError("no record of what it was made from")
    if data["made_from"] != digest_of(made_from):
        raise ValueError("made from other inputs (another film, shot or settings)")
    if data["sha256"] != digest_of(data["body"]):
        raise ValueError("its content does not match its own hash (damaged or edited)")
    return data["body"]


def read_bound_json(path: str | os.PathLike[str], made_from: Any, what: str) -> Any | None:
    """The body of the bound cache at `path` made from `made_from`; None when it is missing or cannot
    be trusted (then it is removed, with one log line naming it and why: it will be made again)."""
    p = Path(path)
    try:
        data = json.loads(read_regular(p, MAX_BOUND_JSON))
        return bound_body(data, made_from)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: %s %s: made again", p, what, exc)
        discard(p)
        return None


def _file_record(path: Path) -> Path:
    return path.with_name(f"{path.name}.made.json")


def bind_file(path: str | os.PathLike[str], made_from: Any) -> None:
    """Record beside the just-written derived file `path` what made it, its size and SHA-256."""
    p = Path(path)
    size, digest = _sha256(p)
    atomic_write_json(_file_record(p), {"made_from": digest_of(made_from), "size": size, "sha256": digest})


def bound_file_ok(path: str | os.PathLike[str], made_from: Any, what: str) -> bool:
    """Whether the derived file `path` is the one `bind_file` recorded for `made_from` (size, then one
    SHA-256 pass); when it is there but is not, it and its record are removed with one log line."""
    p = Path(path)
    if not os.path.lexists(p):
        return False
    try:
        if p.is_symlink():
            raise NotRegular("a symlink")
        check_regular(p)
        record = json.loads(read_regular(_file_record(p), MIB))
        if not isinstance(record, dict) or record.get("made_from") != digest_of(made_from):
            raise ValueError("made from other inputs, or no record of what made it")
        if [p.stat().st_size, _sha256(p)[1]] != [record.get("size"), record.get("sha256")]:
            raise ValueError("its bytes are not the ones recorded (replaced or damaged)")
        return True
    except (OSError, ValueError) as exc:
        log.warning("%s: %s %s: made again", p, what, exc)
        discard(p)
        discard(_file_record(p))
        return False


def discard(path: str | os.PathLike[str]) -> None:
    """Remove a derived file (or a folder or anything else found at its name) so it can be made again."""
    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            p.unlink()


def _sha256(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while block := fh.read(4 << 20):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


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


# ------------------------------------------------------------------------------------- user documents
# Documents a user hands in (config, cast and shot plan files, `--set` values), read one way, bounded: a
# regular file (never waited on) of at most `MAX_DOCUMENT` bytes whose YAML may not use aliases (``*name``:
# a few hundred bytes of nested aliases expand to millions of nodes in whatever walks the loaded value).
# No dubflow document needs them. Errors are `ConfigError`, one line naming the file.

MAX_DOCUMENT = 4 << 20  # a config, cast or plan file of a long film is tens of KB


class _NoAliases(yaml.SafeLoader):
    """The safe loader, refusing aliases (anchors alone are harmless)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(
                f"aliases (*name) are not allowed in a dubflow document (line {mark.line + 1})"
            )
        return super().compose_node(parent, index)


def parse_yaml(text: str | bytes, where: str | os.PathLike[str], what: str = "YAML") -> Any:
    """`text` as YAML without aliases; ConfigError naming `where` when it is not."""
    try:
        return yaml.load(text, Loader=_NoAliases)
    except yaml.YAMLError as ex:
        raise ConfigError(where, f"invalid {what}: {' '.join(str(ex).split())}") from ex


def read_document(path: str | os.PathLike[str], what: str = "file") -> bytes:
    """The bytes of the document at `path`: a regular file of at most `MAX_DOCUMENT` bytes (ConfigError)."""
    p = Path(path)
    try:
        return read_regular(p, MAX_DOCUMENT)
    except FileNotFoundError as ex:
        raise ConfigError(p, f"{what} not found") from ex
    except NotRegular as ex:
        raise ConfigError(p, f"cannot read the {what}: {ex}") from ex
    except OSError as ex:
        raise ConfigError(p, f"cannot read the {what} ({ex.strerror or ex})") from ex


def load_yaml(path: str | os.PathLike[str], what: str = "file") -> Any:
    """The YAML document at `path` (`read_document`, then `parse_yaml`)."""
    return parse_yaml(read_document(path, what), path)
