"""Delivering files into a user's folder: never over a file dubflow did not write, never through a
planted symlink, never into a folder or over a file swapped during the run.

* What dubflow wrote is *recorded*: next to each delivered file ``<name>``, ``.<name>.dubflow.json``
  holds its size and SHA-256 and the workspace key that wrote it (`written_record`; a file with the
  recorded inode, size and mtime is not hashed again: any write moves the mtime). A file is "a
  dubflow output" only while its bytes still match that record: a stream-copied cut of an output, an
  edited one or any other file at that name is not, whatever its tags say.
* Files are written in a private staging folder (``.<output name>.dubflow-tmp-<random>``, mode 0700,
  created with ``mkdir`` relative to the checked folder), so no temp name in the user's folder can be
  pre-planted as a symlink; the staging folder is removed afterwards, and stale ones (a killed run)
  by the next run of the same output (`clean_stale`, under the output's lock).
* `Destination` notes the folder's identity (device + inode) and each target's identity (or absence)
  when the run starts; `deliver` checks both again at the final rename, through a folder descriptor
  opened without following a symlink: a folder swapped for a symlink, a file created at the output
  path meanwhile, or a file replaced there, stops the delivery with one line naming it.
No Prefect and no workspace here: files only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.errors import OutputError

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".dubflow.json"
STAGING_TAG = ".dubflow-tmp-"
_BLOCK = 4 << 20


def record_path(path: str | os.PathLike[str]) -> Path:
    """Where the record of what dubflow wrote at `path` lives: ``.<name>.dubflow.json`` beside it."""
    p = Path(path)
    return p.with_name(f".{p.name}{RECORD_SUFFIX}")


def _digest(fd: int) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    os.lseek(fd, 0, os.SEEK_SET)
    while block := os.read(fd, _BLOCK):
        h.update(block)
        size += len(block)
    return size, h.hexdigest()


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def written_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record of what dubflow wrote at `path` when the file there still is that (size + SHA-256),
    else None (no record, unreadable record, or another file: not a dubflow output)."""
    p = Path(path)
    try:
        with open(record_path(p), "rb", opener=_nofollow) as fh:
            record = json.loads(fh.read(1 << 20))
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not isinstance(record, dict) or not stat.S_ISREG(st.st_mode):
            return None
        size = st.st_size
        if [record.get("size"), record.get("inode"), record.get("mtime_ns")] == [
            size,
            st.st_ino,
            st.st_mtime_ns,
        ]:
            return record  # the very file delivered, untouched since (any write moves its mtime)
        wanted = [record, record.get("previous") or {}]
        if not any(w.get("size") == size for w in wanted):
            return None
        _, digest = _digest(fd)
    finally:
        os.close(fd)
    return record if any(w.get("size") == size and w.get("sha256") == digest for w in wanted) else None


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


@dataclass(frozen=True)
class Destination:
    """A folder and the files a run will deliver into it, as they were when the run checked them."""

    folder: str
    folder_id: tuple[int, int]
    names: dict[str, list[int] | None] = field(default_factory=dict)  # name -> identity (None: absent)

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "folder_id": list(self.folder_id), "names": dict(self.names)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Destination:
        return cls(d["folder"], tuple(d["folder_id"]), dict(d["names"]))


def destination(paths: Sequence[str | os.PathLike[str]]) -> Destination:
    """Note the folder of `paths` (all in one, already resolved) and what is at each path now.

    Raises OutputError when a path is a symlink or not a regular file.
    """
    folder = Path(paths[0]).parent
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(folder, "is not a folder")
    names: dict[str, list[int] | None] = {}
    for path in map(Path, paths):
        if path.parent != folder:
            raise OutputError(path, f"not in the output folder {folder}")
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            names[path.name] = None
            continue
        if not stat.S_ISREG(now.st_mode):
            raise OutputError(path, "exists and is not a regular file (a symlink or a folder)")
        names[path.name] = _identity(now)
    return Destination(str(folder), (st.st_dev, st.st_ino), names)


def _open_folder(dest: Destination) -> int:
    """A descriptor of the destination folder, checked to be the same folder as when the run began."""
    try:
        fd = os.open(dest.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise OutputError(
            dest.folder, f"the output folder was replaced during the run ({why}): nothing delivered"
        ) from exc
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != tuple(dest.folder_id) or os.path.realpath(dest.folder) != dest.folder:
        os.close(fd)
        raise OutputError(dest.folder, "the output folder was replaced during the run: nothing delivered")
    return fd


@contextlib.contextmanager
def staging(dest: Destination, stem: str) -> Iterator[Path]:
    """A private (0700) staging folder in the destination folder; removed when the block ends."""
    fd = _open_folder(dest)
    try:
        for _ in range(100):
            name = f".{stem}{STAGING_TAG}{os.urandom(6).hex()}"
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - 100 collisions of 48 random bits
            raise OutputError(dest.folder, "cannot create a staging folder")
    finally:
        os.close(fd)
    path = Path(dest.folder) / name
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def clean_stale(folder: str | os.PathLike[str], stem: str) -> int:
    """Remove staging folders of `stem` left by a killed run (call while holding the output's lock)."""
    n = 0
    for stale in Path(folder).glob(f".{stem}{STAGING_TAG}*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
            log.info("removed %s, left by an earlier run that did not finish", stale)
            n += 1
    return n


def deliver(dest: Destination, staged: Path, name: str, key: str) -> Path:
    """Move `staged` (a file in a `staging` folder of `dest`) to `name` in the destination folder,
    with its record; refuses (OutputError) when the folder or the file at `name` changed since `dest`."""
    fd = _open_folder(dest)
    try:
        try:
            now = _identity(os.lstat(name, dir_fd=fd))
        except FileNotFoundError:
            now = None
        target = Path(dest.folder) / name
        if now != dest.names.get(name):
            what = "created" if dest.names.get(name) is None else "replaced or removed"
            raise OutputError(target, f"a file was {what} at the output path during the run: not replaced")
        src_fd = os.open(staged.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            file_fd = os.open(staged.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=src_fd)
            try:
                size, digest = _digest(file_fd)
                os.fsync(file_fd)  # on disk before the rename makes it the output
                st = os.fstat(file_fd)  # a rename keeps the inode and the mtime
            finally:
                os.close(file_fd)
            previous = written_record(target) if now is not None else None
            record = {"file": name, "size": size, "sha256": digest, "key": key, "inode": st.st_ino,
                      "mtime_ns": st.st_mtime_ns, "written": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
            prev = {k: previous[k] for k in ("size", "sha256")} if previous else None
            _put_record(fd, src_fd, name, {**record, "previous": prev})  # a crash here: either file matches
            os.replace(staged.name, name, src_dir_fd=src_fd, dst_dir_fd=fd)
            _put_record(fd, src_fd, name, record)
        finally:
            os.close(src_fd)
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return target


def _put_record(folder_fd: int, staging_fd: int, name: str, record: dict[str, Any]) -> None:
    tmp = f"record-{os.urandom(4).hex()}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=staging_fd)
    try:
        os.write(out, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
        os.fsync(out)
    finally:
        os.close(out)
    os.replace(tmp, record_path(name).name, src_dir_fd=staging_fd, dst_dir_fd=folder_fd)
