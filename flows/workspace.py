"""Run workspace: where a film's per-shot intermediates live, so that a re-run resumes instead of redoing.

A workspace is keyed by what determines the result:

* the film's content fingerprint: size, mtime (ns) and a SHA-256 of its first and last MiB. Films are
  tens of GB, so the whole file is not hashed; replacing, re-encoding, truncating or touching the file
  changes the key (an in-place edit of the middle that keeps size and mtime would not: accepted);
  other inputs the shots depend on (the dubbed dialogue track) are fingerprinted the same way;
* a hash of the pipeline config (canonical JSON of its semantic fields);
* the code version: the ``dubflow`` package version plus a hash of the Python code that makes shots
  (``flows/``, ``tasks/``, ``model/``), so commits touching only docs, tests or benchmarks keep
  workspaces valid (``DUBFLOW_CODE_VERSION`` pins it instead, e.g. a release name on a cluster).

Layout under ``<root>/<key>/`` (root: ``./workspace`` by default, or any path shared by all hosts)::

    workspace.json          what the key was made of, plus a random incarnation id (see below)
    run.lock                held by the film run using the workspace (one at a time; flows/run_lock.py)
    attempts.jsonl          one line per shot attempt: status, host, worker, device, seconds
    shots/0042/             one folder per shot (4-digit index)
        shot.mkv            the shot's lossless intermediate (written atomically by the renderer)
        shot.chunks/        per-chunk checkpoints (resume inside a long shot; tasks/chunk_checkpoints.py)
        done.json           written atomically and LAST: the shot is complete iff this exists, is readable
                            and its ``result.file`` record (size, SHA-256, frames) matches ``shot.mkv``
        failed.json         the last failure's reason (removed when the shot completes)
        render.lock         held while a process renders the shot (another one skips it)

Prefect's result cache is the first line of resume, keyed by ``Workspace.shot_cache_key`` (workspace
key + incarnation + shot index + shot plan hash; never the flow run id). ``done.json`` is the second:
a shot task checks ``shot_done`` before doing any work. The incarnation id changes whenever the workspace
folder is recreated, so wiping a workspace also invalidates cache records that point into it.
A marker that cannot be read, or whose intermediate no longer matches it, means "not done": it is
removed with one log line naming the file, and the shot is rendered again (never a stuck state).
Recording a failure or an attempt never raises (a full disk must not hide the error being recorded).
No Prefect imports here: paths and files only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from flows.jsonfiles import (  # noqa: F401 (re-exported: the workspace's file helpers)
    WorkspaceError,
    _json_bytes,
    _jsonable,
    _publish_once,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    read_json,
)
from tasks.intermediates import verify

log = logging.getLogger(__name__)

MIB = 1 << 20
MANIFEST = "workspace.json"
DONE = "done.json"
FAILED = "failed.json"
ATTEMPTS = "attempts.jsonl"
RUN_LOCK = "run.lock"  # held by the film run using the workspace (flows/run_lock.py)
SHOT_LOCK = "render.lock"  # in a shot folder: held while the shot renders
_PROJECT_DIR = Path(__file__).resolve().parent.parent
CODE_PACKAGES = ("flows", "tasks", "model")  # the code a shot's pixels depend on (see code_version)


@dataclasses.dataclass(frozen=True)
class Workspace:
    """A run workspace; small and JSON-serialisable so it can be a flow parameter (``as_dict``)."""

    root: str
    key: str
    incarnation: str

    @property
    def path(self) -> Path:
        return Path(self.root) / self.key

    def shot_dir(self, index: int) -> Path:
        return self.path / "shots" / f"{index:04d}"

    def chunk_dir(self, index: int) -> Path:
        return self.shot_dir(index) / "shot.chunks"  # the renderer's checkpoints of shot.mkv

    def done_path(self, index: int) -> Path:
        return self.shot_dir(index) / DONE

    def failed_path(self, index: int) -> Path:
        return self.shot_dir(index) / FAILED

    def shot_cache_key(self, index: int, plan_hash: str) -> str:
        """Prefect cache key of one shot: stable across parent runs, retries and hosts."""
        return f"dubflow-{self.key}-{self.incarnation}-shot-{index:04d}-{plan_hash}"

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


def code_version(project_dir: str | os.PathLike[str] | None = None) -> str:
    """``<package version>+code.<hash of flows/ tasks/ model/ *.py>``, or just the version without them.

    ``DUBFLOW_CODE_VERSION`` pins it. The hash covers file paths and contents, not git metadata: any
    commit changed ``git describe`` (and with it every workspace key), even one touching only docs.
    """
    pinned = os.environ.get("DUBFLOW_CODE_VERSION", "").strip()
    if pinned:
        return pinned
    try:
        version = metadata.version("dubflow")
    except metadata.PackageNotFoundError:
        version = "0+unknown"
    root = Path(project_dir or _PROJECT_DIR)
    files = sorted(
        path
        for package in CODE_PACKAGES
        for path in (root / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )
    if not files:
        return version
    digest = hashlib.sha256()
    for path in files:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise WorkspaceError(f"{path}: cannot read for the code version ({exc.strerror or exc})") from exc
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + data + b"\0")
    return f"{version}+code.{digest.hexdigest()[:12]}"


def workspace_key(film: str | os.PathLike[str], fingerprint: str, config_digest: str, version: str) -> str:
    """``<film stem slug>-<16 hex>``: readable in a listing, unique per (film content, config, code)."""
    stem = re.sub(r"[^a-z0-9]+", "-", Path(film).stem.lower()).strip("-")[:40] or "film"
    return f"{stem}-{stable_hash([fingerprint, config_digest, version])}"


def open_workspace(
    root: str | os.PathLike[str],
    film: str | os.PathLike[str],
    config: Any,
    *,
    inputs: Iterable[str | os.PathLike[str]] = (),
    exclude: Iterable[str] = (),
    version: str | None = None,
) -> Workspace:
    """Create (or reopen) the workspace of ``film`` + ``config`` + code version under ``root``.

    ``inputs`` are other files the shots depend on (the dubbed dialogue track): their fingerprints
    join the film's. Safe when several runs open the same workspace at once: the first manifest
    written wins and the others read its incarnation id.
    """
    version = code_version() if version is None else version
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
        "code_version": version,
        "incarnation": uuid.uuid4().hex[:12],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    target = path / MANIFEST
    if not target.exists():
        _publish_once(target, _json_bytes(manifest))
    existing = read_json(target)
    return Workspace(root=str(Path(root).resolve()), key=key, incarnation=str(existing["incarnation"]))


# ------------------------------------------------------------------------------- shot markers


def shot_done(ws: Workspace, index: int, plan_hash: str | None = None) -> bool:
    """Whether shot ``index`` is complete (and, if given, was made from the plan ``plan_hash``)."""
    record = read_shot_done(ws, index)
    if record is None:
        return False
    return plan_hash is None or record.get("plan_hash") == plan_hash


def read_shot_done(ws: Workspace, index: int) -> dict[str, Any] | None:
    """The shot's ``done.json`` record, or None when the shot is not complete.

    Cheap (one stat): an unreadable marker, or an intermediate missing or of another size than its
    record, invalidates the marker. `verify_shot_done` also checks the content hash.
    """
    path = ws.done_path(index)
    if not path.exists():
        return None
    try:
        record = read_json(path)
        output = Path(record["output"])
        size = (record.get("result") or {}).get("file", {}).get("size")
    except WorkspaceError as exc:
        return _invalidate(ws, index, f"unreadable done marker: {exc}")
    except (KeyError, TypeError, AttributeError) as exc:
        return _invalidate(ws, index, f"{path}: not a done marker ({type(exc).__name__}: {exc})")
    try:
        have = output.stat().st_size
    except OSError as exc:
        return _invalidate(ws, index, f"{output}: shot intermediate unreadable ({exc.strerror or exc})")
    if size is not None and have != size:
        return _invalidate(ws, index, f"{output}: {have} bytes, {size} recorded (truncated or replaced)")
    return record


def verify_shot_done(ws: Workspace, index: int) -> dict[str, Any] | None:
    """`read_shot_done` plus the intermediate's content hash (one read of the file); None: not done."""
    record = read_shot_done(ws, index)
    if record is None:
        return None
    problem = verify(record["output"], (record.get("result") or {}).get("file"))
    if problem is not None:
        return _invalidate(ws, index, f"{record['output']}: {problem}")
    return record


def _invalidate(ws: Workspace, index: int, why: str) -> None:
    """Mark shot ``index`` not done (its marker removed), with one log line saying why."""
    log.warning("shot %04d: %s: not done, it will be rendered again", index, why)
    with contextlib.suppress(OSError):
        ws.done_path(index).unlink()


def mark_shot_done(ws: Workspace, index: int, record: Mapping[str, Any]) -> Path:
    """Write ``done.json`` (atomically, last) and clear any previous failure record."""
    body = {"index": index, "finished": datetime.now(UTC).isoformat(timespec="seconds"), **record}
    path = atomic_write_json(ws.done_path(index), body)
    ws.failed_path(index).unlink(missing_ok=True)
    return path


def mark_shot_failed(
    ws: Workspace, index: int, reason: str, record: Mapping[str, Any] | None = None
) -> Path | None:
    """Record why shot ``index`` failed (shown in the film's shot table), plus ``record`` (e.g. where).

    Never raises: when the record cannot be written (a full disk) that is logged with the reason,
    and the caller goes on reporting the original failure. None then.
    """
    body = {
        "index": index,
        "failed": datetime.now(UTC).isoformat(timespec="seconds"),
        **(record or {}),
        "reason": reason,
    }
    try:
        return atomic_write_json(ws.failed_path(index), body)
    except (OSError, TypeError) as exc:
        log.error("shot %04d failed (%s); recording it also failed: %s", index, reason, exc)
        return None


def read_shot_failed(ws: Workspace, index: int) -> dict[str, Any] | None:
    """The shot's ``failed.json`` record while it is not done, else None."""
    path = ws.failed_path(index)
    if not path.exists() or shot_done(ws, index):
        return None
    try:
        return read_json(path)
    except WorkspaceError as exc:
        log.warning("%s (ignored)", exc)
        return None


def log_attempt(ws: Workspace, record: Mapping[str, Any]) -> None:
    """Append one shot attempt (shot, status, where, seconds) to ``attempts.jsonl``.

    The workspace's audit trail: which host, worker and device rendered each shot, and how long it took.
    One ``O_APPEND`` write per line, so concurrent writers on one file system never interleave lines.
    Never raises (the audit line is logged instead when it cannot be written, e.g. on a full disk).
    """
    line = json.dumps(
        {"at": datetime.now(UTC).isoformat(timespec="milliseconds"), **_jsonable(record)}, sort_keys=True
    )
    try:
        fd = os.open(ws.path / ATTEMPTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.error("%s: cannot record the attempt %s (%s)", ws.path / ATTEMPTS, line, exc.strerror or exc)


def read_attempts(ws: Workspace) -> list[dict[str, Any]]:
    """Every record of ``attempts.jsonl``, oldest first (empty when no shot was attempted)."""
    path = ws.path / ATTEMPTS
    if not path.exists():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{path}: cannot read attempt records ({exc})") from exc


def read_shot_failure(ws: Workspace, index: int) -> str | None:
    """The last recorded failure reason of shot ``index``, if it is not done."""
    record = read_shot_failed(ws, index)
    return None if record is None else str(record.get("reason", "unknown"))
