"""Run workspace: where a film's per-shot results live, so that a re-run reuses instead of redoing.

A workspace is run-level: keyed by the film's content fingerprint (size, mtime (ns) and a SHA-256 of its
first and last MiB; films are tens of GB, so the whole file is not hashed; replacing, re-encoding,
truncating or touching the file changes the key, an in-place edit of the middle that keeps size and mtime
would not: accepted), the run's kind (quality or preview pass) and the layout version `STORE_LAYOUT`.
Neither the dub track, nor the shot settings, nor the code are in it: each shot's result is stored under
its own key (`tasks/timeline/shot_key.py`: its frames, its conditioning audio, its effective settings, the weights,
`RENDER_VERSION`), so a changed line of dialogue, one shot's override or an upgrade re-renders only the
shots whose own inputs changed.

Layout under ``<root>/<key>/`` (root: ``./workspace`` by default, or any path shared by all hosts)::

    workspace.json          what the key was made of, plus a random incarnation id (see below)
    run.lock                held by the film run using the workspace (one at a time; tasks/run/run_lock.py)
    attempts.jsonl          one line per shot attempt: status, host, worker, device, seconds
    groups/loads.jsonl      one line per group model load that warmed: its models and warm-up seconds
    shots-<hash>.json       the shot partition, per shot-detection config
    dialogue-<fp>.wav       the decoded dub track, per dub file
    film/                   per-film caches (prompt embeddings, audio features: keyed inside)
    shots/0042-<shot key>/  one folder per shot result (4-digit index + its key): content-addressed
        <intermediate>      the shot's rendered file, written through ``atomic_path``
        shot.chunks/        per-chunk checkpoints (resume inside a long shot; tasks/render/chunk_checkpoints.py)
        done.json           written atomically and LAST: the result is complete iff this exists, is readable
                            and its ``result.file`` record (size, SHA-256, frames) matches the intermediate
        failed.json         the last failure's reason (removed when the shot completes)
        render.lock         held while a process renders the shot (another one skips it)

Prefect's result cache is the first line of resume, keyed by ``Workspace.shot_cache_key`` (workspace
key + incarnation + shot index + shot key; never the flow run id). ``done.json`` is the second: a shot
task checks ``shot_done`` before doing any work. The incarnation id changes whenever the workspace
folder is recreated, so wiping a workspace also invalidates cache records that point into it.
A marker is bound to its place: it names its workspace key, shot index and shot key, and its
intermediate lies in its own folder (`marker_misplaced`); a valid marker copied from another film or
shot is not trusted. A marker that cannot be read, that lies elsewhere than it says, or whose
intermediate no longer matches it, means "not done": it is removed with one log line naming the
file, and the shot is rendered again (never a stuck state).
Recording a failure or an attempt never raises (a full disk must not hide the error being recorded).
No Prefect imports here: paths and files only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.files import (
    WorkspaceError,
    atomic_write_json,
    head_tail_fingerprint,
    json_bytes,
    jsonable,
    publish_once,
    read_json,
)
from tasks.media.intermediates import verify
from tasks.run.run_files import BadRunFile, read_run_file

log = logging.getLogger(__name__)

MIB = 1 << 20
MANIFEST = "workspace.json"
DONE = "done.json"
FAILED = "failed.json"
ATTEMPTS = "attempts.jsonl"
GROUP_LOADS = "groups/loads.jsonl"
STORE_LAYOUT = "shot-store-1"  # the workspace layout version (part of the workspace key)
RUN_LOCK = "run.lock"  # held by the film run using the workspace (tasks/run/run_lock.py)
SHOT_LOCK = "render.lock"  # in a shot result folder: held while the shot renders


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
    """Cheap content fingerprint of a (large) film file: size, mtime and first/last MiB hashed
    (`tasks.files.head_tail_fingerprint`: a regular file only, never waited on)."""
    try:
        return head_tail_fingerprint(film)
    except OSError as exc:
        raise WorkspaceError(f"{film}: cannot fingerprint film ({exc.strerror or exc})") from exc


def stable_hash(obj: Any, length: int = 16) -> str:
    """SHA-256 of the canonical JSON of ``obj`` (dataclasses, paths, fractions and enums allowed)."""
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def config_hash(config: Any, *, exclude: Iterable[str] = ()) -> str:
    """Hash of a config (mapping or dataclass), without the keys in ``exclude``.

    Leave out what does not change the result (output path, workspace root, worker count), so that
    such changes still resume. Keys are top-level (``"encode"``) or dotted (``"infinitetalk.profile"``).
    """
    data = jsonable(config)
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
    for _ in range(3):  # a damaged manifest is set aside and published again (never a stuck state)
        if not target.exists():
            publish_once(target, json_bytes(manifest))
        incarnation = read_run_file(target, functools.partial(_manifest_incarnation, key))
        if incarnation is not None:
            return Workspace(root=str(Path(root).resolve()), key=key, incarnation=incarnation)
    raise WorkspaceError(f"{target}: cannot create a readable workspace manifest")


def _manifest_incarnation(key: str, manifest: Any) -> str:
    """The incarnation id of a manifest that belongs to workspace `key` (else BadRunFile)."""
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        raise BadRunFile(f"not the manifest of workspace {key}")
    incarnation = manifest.get("incarnation")
    if not isinstance(incarnation, str) or not re.fullmatch(r"[0-9a-f]{12}", incarnation):
        raise BadRunFile(f"bad incarnation id {incarnation!r}")
    return incarnation


# ------------------------------------------------------------------------------- shot markers


def shot_done(ws: Workspace, index: int, key: str) -> bool:
    """Whether the result of shot ``index`` under shot key ``key`` is complete (`read_shot_done`)."""
    return read_shot_done(ws, index, key) is not None


def read_shot_done(ws: Workspace, index: int, key: str) -> dict[str, Any] | None:
    """The result's ``done.json`` record, or None when it is not complete.

    Cheap (one stat): an unreadable marker, or an intermediate missing or of another size than its
    record, invalidates the marker. `verify_shot_done` also checks the content hash.
    """
    path = ws.done_path(index, key)
    if not path.exists():
        return None
    try:
        record = read_json(path)
        output = Path(record["output"])
        size = (record.get("result") or {}).get("file", {}).get("size")
    except WorkspaceError as exc:
        return _invalidate(ws, index, key, f"unreadable done marker: {exc}")
    except (KeyError, TypeError, AttributeError) as exc:
        return _invalidate(ws, index, key, f"{path}: not a done marker ({type(exc).__name__}: {exc})")
    misplaced = marker_misplaced(ws, index, key, record)
    if misplaced is not None:
        return _invalidate(ws, index, key, f"{path}: {misplaced}")
    try:
        have = output.stat().st_size
    except OSError as exc:
        return _invalidate(ws, index, key, f"{output}: shot intermediate unreadable ({exc.strerror or exc})")
    if size is not None and have != size:
        return _invalidate(ws, index, key, f"{output}: {have} bytes, {size} recorded (truncated or replaced)")
    return record


def marker_misplaced(ws: Workspace, index: int, key: str, record: Mapping[str, Any]) -> str | None:
    """Why a readable ``done.json`` does not belong where it lies (None: it does).

    A marker vouches for one shot of one workspace: its workspace key, shot index and shot key must be
    the folder's, and its intermediate must lie in that folder. A valid marker copied from another
    film, shot or folder is therefore never trusted (its intermediate would be another shot's pixels).
    """
    want = {"workspace": ws.key, "index": index, "key": key}
    for field, value in want.items():
        if record.get(field) != value:
            return f"a done marker of {field} {record.get(field)!r}, not {value!r} (copied from elsewhere)"
    folder = ws.shot_dir(index, key)
    try:
        inside = Path(record["output"]).resolve().parent == folder.resolve()
    except (OSError, RuntimeError, TypeError):
        inside = False
    if not inside:
        return f"its intermediate {record.get('output')} is not in {folder} (copied from elsewhere)"
    return None


def verify_shot_done(ws: Workspace, index: int, key: str) -> dict[str, Any] | None:
    """`read_shot_done` plus the intermediate's content hash (one read of the file); None: not done."""
    record = read_shot_done(ws, index, key)
    if record is None:
        return None
    problem = verify(record["output"], (record.get("result") or {}).get("file"))
    if problem is not None:
        return _invalidate(ws, index, key, f"{record['output']}: {problem}")
    return record


def _invalidate(ws: Workspace, index: int, key: str, why: str) -> None:
    """Mark shot ``index``'s result under ``key`` not done (its marker removed), with one log line why."""
    log.warning("shot %04d: %s: not done, it will be rendered again", index, why)
    with contextlib.suppress(OSError):
        ws.done_path(index, key).unlink()


def mark_shot_done(ws: Workspace, index: int, key: str, record: Mapping[str, Any]) -> Path:
    """Write ``done.json`` (atomically, last) and clear any previous failure record."""
    body = {
        **record,
        "workspace": ws.key,
        "index": index,
        "key": key,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    path = atomic_write_json(ws.done_path(index, key), body)
    ws.failed_path(index, key).unlink(missing_ok=True)
    return path


def mark_shot_failed(
    ws: Workspace, index: int, key: str, reason: str, record: Mapping[str, Any] | None = None
) -> Path | None:
    """Record why shot ``index`` failed (shown in the film's shot table), plus ``record`` (e.g. where).

    Never raises: when the record cannot be written (a full disk) that is logged with the reason,
    and the caller goes on reporting the original failure. None then.
    """
    body = {
        "index": index,
        "key": key,
        "failed": datetime.now(UTC).isoformat(timespec="seconds"),
        **(record or {}),
        "reason": reason,
    }
    try:
        return atomic_write_json(ws.failed_path(index, key), body)
    except (OSError, TypeError) as exc:
        log.error("shot %04d failed (%s); recording it also failed: %s", index, reason, exc)
        return None


def read_shot_failed(ws: Workspace, index: int, key: str) -> dict[str, Any] | None:
    """The result's ``failed.json`` record while it is not done, else None."""
    path = ws.failed_path(index, key)
    if not path.exists() or shot_done(ws, index, key):
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
    _append_line(ws.path / ATTEMPTS, record, "attempt")


def log_group_load(ws: Workspace, record: Mapping[str, Any]) -> None:
    """Append one group model load (group, where, models and warm-up seconds) to ``groups/loads.jsonl``,
    as `log_attempt` does: what a film report states as "model load", apart from the shots."""
    with contextlib.suppress(OSError):  # a failure to write is logged by `_append_line`
        (ws.path / GROUP_LOADS).parent.mkdir(parents=True, exist_ok=True)
    _append_line(ws.path / GROUP_LOADS, record, "group load")


def read_group_loads(ws: Workspace) -> list[dict[str, Any]]:
    """Every record of ``groups/loads.jsonl``, oldest first (an unreadable file: logged, none)."""
    path = ws.path / GROUP_LOADS
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("%s: cannot read the group load records (%s); ignored", path, exc)
        return []


def _append_line(path: Path, record: Mapping[str, Any], what: str) -> None:
    line = json.dumps(
        {"at": datetime.now(UTC).isoformat(timespec="milliseconds"), **jsonable(record)}, sort_keys=True
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.error("%s: cannot record the %s %s (%s)", path, what, line, exc.strerror or exc)


def read_attempts(ws: Workspace) -> list[dict[str, Any]]:
    """Every record of ``attempts.jsonl``, oldest first (empty when no shot was attempted)."""
    path = ws.path / ATTEMPTS
    if not path.exists():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise WorkspaceError(f"{path}: cannot read attempt records ({exc})") from exc
