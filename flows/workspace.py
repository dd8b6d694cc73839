"""Run workspace: where a film's per-shot results live, so that a re-run reuses instead of redoing.

A workspace is run-level: keyed by the film's content fingerprint (size, mtime (ns) and a SHA-256 of its
first and last MiB; films are tens of GB, so the whole file is not hashed; replacing, re-encoding,
truncating or touching the file changes the key, an in-place edit of the middle that keeps size and mtime
would not: accepted), the run's kind (quality or preview pass) and the layout version `STORE_LAYOUT`.
Neither the dub track, nor the shot settings, nor the code are in it: each shot's result is stored under
its own key (`tasks/shot_key.py`: its frames, its conditioning audio, its effective settings, the weights,
`RENDER_VERSION`), so a changed line of dialogue, one shot's override or an upgrade re-renders only the
shots whose own inputs changed.

Layout under ``<root>/<key>/`` (root: ``./workspace`` by default, or any path shared by all hosts)::

    workspace.json          what the key was made of, plus a random incarnation id (see below)
    attempts.jsonl          one line per shot attempt: status, host, worker, device, seconds
    shots-<hash>.json       the shot partition, per shot-detection config
    dialogue-<fp>.wav       the decoded dub track, per dub file
    film/                   per-film caches (prompt embeddings, audio features: keyed inside)
    shots/0042-<shot key>/  one folder per shot result (4-digit index + its key): content-addressed
        <intermediate>      the shot's rendered file, written through ``atomic_path``
        shot.chunks/        per-chunk checkpoints (resume inside a long shot)
        done.json           written atomically and LAST: the result is complete iff this exists
        failed.json         the last failure's reason (removed when the shot completes)

Prefect's result cache is the first line of resume, keyed by ``Workspace.shot_cache_key`` (workspace
key + incarnation + shot index + shot key; never the flow run id). ``done.json`` is the second: a shot
task checks ``shot_done`` before doing any work. The incarnation id changes whenever the workspace
folder is recreated, so wiping a workspace also invalidates cache records that point into it.
No Prefect imports here: paths and files only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

MIB = 1 << 20
MANIFEST = "workspace.json"
DONE = "done.json"
FAILED = "failed.json"
ATTEMPTS = "attempts.jsonl"
STORE_LAYOUT = "shot-store-1"  # the workspace layout version (part of the workspace key)


class WorkspaceError(RuntimeError):
    """A workspace file cannot be read or created (the message names the file)."""


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A run workspace; small and JSON-serialisable so it can be a flow parameter (``as_dict``)."""

    root: str
    key: str
    incarnation: str

    @property
    def path(self) -> Path:
        return Path(self.root) / self.key

    def shot_dir(self, index: int, key: str) -> Path:
        """The folder of shot ``index``'s result under its shot key (content-addressed)."""
        return self.path / "shots" / f"{index:04d}-{key}"

    def done_path(self, index: int, key: str) -> Path:
        return self.shot_dir(index, key) / DONE

    def failed_path(self, index: int, key: str) -> Path:
        return self.shot_dir(index, key) / FAILED

    def shot_cache_key(self, index: int, key: str) -> str:
        """Prefect cache key of one shot result: stable across parent runs, retries and hosts."""
        return f"dubflow-{self.key}-{self.incarnation}-shot-{index:04d}-{key}"

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Workspace:
        try:
            return cls(
                root=str(values["root"]), key=str(values["key"]), incarnation=str(values["incarnation"])
            )
        except KeyError as exc:
            raise ValueError(f"workspace record: missing key {exc.args[0]!r} in {dict(values)!r}") from exc


# ----------------------------------------------------------------------------------------- keys


def film_fingerprint(film: str | os.PathLike[str]) -> str:
    """Cheap content fingerprint of a (large) film file: size, mtime and first/last MiB hashed."""
    path = Path(film)
    try:
        st = path.stat()
        digest = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
        with path.open("rb") as fh:
            digest.update(fh.read(MIB))
            if st.st_size > MIB:
                fh.seek(max(MIB, st.st_size - MIB))
                digest.update(fh.read(MIB))
    except OSError as exc:
        raise WorkspaceError(f"{path}: cannot fingerprint film ({exc.strerror or exc})") from exc
    return digest.hexdigest()[:32]


def stable_hash(obj: Any, length: int = 16) -> str:
    """SHA-256 of the canonical JSON of ``obj`` (dataclasses, paths, fractions and enums allowed)."""
    text = json.dumps(_jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def config_hash(config: Any, *, exclude: Iterable[str] = ()) -> str:
    """Hash of a config (mapping or dataclass), without the keys in ``exclude``.

    Leave out what does not change the result (output path, workspace root, worker count), so that
    such changes still resume. Keys are top-level (``"encode"``) or dotted (``"infinitetalk.profile"``).
    """
    data = _jsonable(config)
    if not isinstance(data, dict):
        raise TypeError(f"config_hash: expected a mapping or dataclass, got {type(config).__name__}")
    for key in exclude:
        *parents, leaf = key.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return stable_hash(data)


def workspace_key(film: str | os.PathLike[str], fingerprint: str, config_digest: str, version: str) -> str:
    """``<film stem slug>-<16 hex>``: readable in a listing, unique per (film content, config, version)."""
    stem = re.sub(r"[^a-z0-9]+", "-", Path(film).stem.lower()).strip("-")[:40] or "film"
    return f"{stem}-{stable_hash([fingerprint, config_digest, version])}"


def open_workspace(
    root: str | os.PathLike[str],
    film: str | os.PathLike[str],
    config: Any,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    exclude: Iterable[str] = (),
    version: str = STORE_LAYOUT,
) -> Workspace:
    """Create (or reopen) the workspace of ``film`` + ``config`` + ``version`` under ``root``.

    ``inputs`` are other files everything in it depends on: their fingerprints join the film's. Safe
    when several runs open the same workspace at once: the first manifest written wins and the others
    read its incarnation id.
    """
    digest = config_hash(config, exclude=exclude)
    fingerprint = film_fingerprint(film)
    extra = {str(Path(p).resolve()): film_fingerprint(p) for p in inputs}
    if extra:
        fingerprint = stable_hash([fingerprint, sorted(extra.values())], length=32)
    key = workspace_key(film, fingerprint, digest, version)
    path = Path(root) / key
    path.mkdir(parents=True, exist_ok=True)
    manifest = {
        "key": key,
        "film": str(Path(film).resolve()),
        "fingerprint": fingerprint,
        "inputs": extra,
        "config_hash": digest,
        "version": version,
        "incarnation": uuid.uuid4().hex[:12],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    target = path / MANIFEST
    if not target.exists():
        _publish_once(target, _json_bytes(manifest))
    existing = read_json(target)
    return Workspace(root=str(Path(root).resolve()), key=key, incarnation=str(existing["incarnation"]))


# ------------------------------------------------------------------------------- shot markers


def shot_done(ws: Workspace, index: int, key: str) -> bool:
    """Whether the result of shot ``index`` under shot key ``key`` is complete."""
    return ws.done_path(index, key).exists()


def read_shot_done(ws: Workspace, index: int, key: str) -> dict[str, Any] | None:
    """The result's ``done.json`` record, or None when it is not complete."""
    path = ws.done_path(index, key)
    return read_json(path) if path.exists() else None


def mark_shot_done(ws: Workspace, index: int, key: str, record: Mapping[str, Any]) -> Path:
    """Write ``done.json`` (atomically, last) and clear any previous failure record."""
    body = {"index": index, "key": key, "finished": datetime.now(UTC).isoformat(timespec="seconds"), **record}
    path = atomic_write_json(ws.done_path(index, key), body)
    ws.failed_path(index, key).unlink(missing_ok=True)
    return path


def mark_shot_failed(
    ws: Workspace, index: int, key: str, reason: str, record: Mapping[str, Any] | None = None
) -> Path:
    """Record why shot ``index`` failed (shown in the film's shot table), plus ``record`` (e.g. where)."""
    body = {
        "index": index,
        "key": key,
        "failed": datetime.now(UTC).isoformat(timespec="seconds"),
        **(record or {}),
        "reason": reason,
    }
    return atomic_write_json(ws.failed_path(index, key), body)


def read_shot_failed(ws: Workspace, index: int, key: str) -> dict[str, Any] | None:
    """The result's ``failed.json`` record while it is not done, else None."""
    path = ws.failed_path(index, key)
    if not path.exists() or shot_done(ws, index, key):
        return None
    return read_json(path)


def log_attempt(ws: Workspace, record: Mapping[str, Any]) -> None:
    """Append one shot attempt (shot, status, where, seconds) to ``attempts.jsonl``.

    The workspace's audit trail: which host, worker and device rendered each shot, and how long it took.
    One ``O_APPEND`` write per line, so concurrent writers on one file system never interleave lines.
    """
    line = json.dumps(
        {"at": datetime.now(UTC).isoformat(timespec="milliseconds"), **_jsonable(record)}, sort_keys=True
    )
    fd = os.open(ws.path / ATTEMPTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_attempts(ws: Workspace) -> list[dict[str, Any]]:
    """Every record of ``attempts.jsonl``, oldest first (empty when no shot was attempted)."""
    path = ws.path / ATTEMPTS
    if not path.exists():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{path}: cannot read attempt records ({exc})") from exc


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


def atomic_write_bytes(final: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``final`` atomically (readers see the old file or the whole new one)."""
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)
    return Path(final)


def atomic_write_json(final: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write_bytes(final, _json_bytes(obj))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; errors name the file."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{path}: cannot read JSON ({exc})") from exc


# ---------------------------------------------------------------------------------- helpers


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n").encode()


def _jsonable(obj: Any) -> Any:
    """Plain-JSON view of configs and records (dataclasses, paths, fractions, enums, tuples, sets)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return sorted(_jsonable(v) for v in obj)
    if isinstance(obj, Enum):
        return _jsonable(obj.value)
    if isinstance(obj, Fraction):
        return f"{obj.numerator}/{obj.denominator}"
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot hash a {type(obj).__name__} value: {obj!r}")


def _publish_once(final: Path, data: bytes) -> None:
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
