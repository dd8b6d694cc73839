"""Delivering files into a user's folder: never over a file dubflow did not write, never through a
planted symlink, never into a folder or over a file swapped during the run.

* What dubflow wrote is *recorded*: next to each delivered file ``<name>``, ``.<name>.dubflow.json``
  holds its name, size and SHA-256, the workspace key that wrote it and the output it was delivered
  with (`written_record`). A record proves authorship only when this process's user owns it, nobody
  else may write it and it has one link (a record another user wrote, or a hard link to one of
  dubflow's, proves nothing), and only while the file's bytes still match it: a file whose inode,
  size, mtime and ctime are the recorded ones is not hashed again (an edit moves the ctime, which no
  user can set back, even when the mtime is restored); any other file is hashed. A stream-copied cut
  of an output, an edited one or any other file at that name is not a dubflow output, whatever its
  tags say.
* Files are written in a private staging folder (``.<output name>.dubflow-tmp-<random>``, mode 0700,
  created with ``mkdir`` relative to the checked folder), so no temp name in the user's folder can be
  pre-planted as a symlink; the staging folder is removed afterwards, and stale ones (a killed run)
  by the next run of the same output (`clean_stale`, under the output's lock).
* `Destination` notes the folder's identity (device + inode) and each target's identity (or absence)
  when the run starts; `deliver` checks both again at the final rename, through a folder descriptor
  opened without following a symlink: a folder swapped for a symlink, a file created at the output
  path meanwhile, or a file replaced there, stops the delivery with one line naming it.
* Every name derived from a delivered file's (its record, its lock, its staging folder) must fit the
  folder's file-name limit (`check_names`, before any work), not fail after the render.
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
LOCK_SUFFIX = ".dubflow.lock"
STAGING_TAG = ".dubflow-tmp-"
_BLOCK = 4 << 20
_MAX_RECORD = 1 << 20


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


def _untouched(st: os.stat_result) -> list[int]:
    """What no write can leave as it was: inode, size, mtime and ctime (utime itself moves the ctime)."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _own_record(fd: int) -> str | None:
    """Why the open record `fd` proves nothing about who wrote it (None: it is this user's own)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_RECORD:
        return "not a small regular file"
    if st.st_uid != os.geteuid():
        return f"written by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return "writable by others"
    if st.st_nlink != 1:
        return "a hard link"
    return None


def written_record(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The record of what dubflow wrote at `path` when the file there still is that (size + SHA-256) and
    the record is this user's own (module docstring), else None: not a dubflow output."""
    p = Path(path)
    try:
        rfd = os.open(record_path(p), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        why = _own_record(rfd)
        record = json.loads(os.read(rfd, _MAX_RECORD)) if why is None else None
    except (OSError, ValueError):
        record = None
    finally:
        os.close(rfd)
    if why is not None:
        log.warning("%s: %s: it proves nothing, %s is not taken as a dubflow output", record_path(p), why, p)
        return None
    if not isinstance(record, dict) or record.get("file") != p.name:
        return None
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if [record.get(k) for k in ("inode", "size", "mtime_ns", "ctime_ns")] == _untouched(st):
            return record  # the very file delivered, untouched since
        size = st.st_size
        wanted = [record, record.get("previous") or {}]
        if not any(w.get("size") == size for w in wanted):
            return None
        _, digest = _digest(fd)
    finally:
        os.close(fd)
    return record if any(w.get("size") == size and w.get("sha256") == digest for w in wanted) else None


def check_names(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Every name dubflow derives from each delivered path (its record, lock and staging folder) fits the
    file-name limit of the folder it goes in; OutputError naming the path, before any work."""
    for path in map(Path, paths):
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            limit = os.pathconf(folder, "PC_NAME_MAX")
        except (OSError, ValueError):
            limit = 255
        derived = [path.name, record_path(path).name, f".{path.name}{LOCK_SUFFIX}",
                   f".{path.name}{STAGING_TAG}{'0' * 12}"]  # fmt: skip
        longest = max(derived, key=lambda n: len(os.fsencode(n)))
        if len(os.fsencode(longest)) > limit:
            raise OutputError(
                path,
                f"the name is too long: {longest[:24]}... (what dubflow writes beside it) would be "
                f"{len(os.fsencode(longest))} bytes, over the folder's limit of {limit}; choose a shorter name",
            )


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


def deliver(dest: Destination, staged: Path, name: str, key: str, output: str | None = None) -> Path:
    """Move `staged` (a file in a `staging` folder of `dest`) to `name` in the destination folder,
    with its record (`output`: the name of the output it belongs to, default `name` itself); refuses
    (OutputError) when the folder or the file at `name` changed since `dest`."""
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
            record = {"file": name, "size": size, "sha256": digest, "key": key, "output": output or name,
                      "written": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
            prev = {k: previous[k] for k in ("size", "sha256")} if previous else None
            _put_record(fd, src_fd, name, {**record, "previous": prev})  # a crash here: either file matches
            os.replace(staged.name, name, src_dir_fd=src_fd, dst_dir_fd=fd)
            moved = os.stat(name, dir_fd=fd, follow_symlinks=False)  # the rename moved its ctime
            if moved.st_ino == st.st_ino:
                record.update(zip(("inode", "size", "mtime_ns", "ctime_ns"), _untouched(moved), strict=True))
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


# ------------------------------------------------------------- one file of a command (`dubflow plan --out`)

NOT_OURS = "exists and was not written by dubflow (or was changed since): refusing to overwrite it"


def check_replaceable(
    path: str | os.PathLike[str], inputs: Sequence[str | os.PathLike[str] | None] = ()
) -> Path:
    """The resolved `path` a command will write, after checking it is none of its `inputs`, not a symlink
    or anything but a regular file, and, when it exists, a file dubflow wrote and nobody changed since
    (`written_record`). OutputError naming the path; creates nothing. Call it before any work."""
    p = Path(path).expanduser()
    resolved = p.resolve()
    for other in inputs:
        if other is not None and resolved == Path(other).expanduser().resolve():
            raise OutputError(path, "is one of this command's inputs: refusing to overwrite it")
    check_names([resolved])
    if os.path.lexists(p):
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(path, "exists and is not a regular file (a symlink or a folder)")
        if written_record(p) is None:
            raise OutputError(path, NOT_OURS)
    return resolved


def write_delivered(path: str | os.PathLike[str], data: bytes, key: str) -> Path:
    """Write `data` at `path` by the delivery rules: `check_replaceable` (again), a missing folder created,
    staged privately and renamed with its record (`deliver`)."""
    target = check_replaceable(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    dest = destination([target])
    with staging(dest, target.name) as folder:
        (folder / target.name).write_bytes(data)
        return deliver(dest, folder / target.name, target.name, key)
