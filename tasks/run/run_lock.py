"""Run locks: one film run per workspace, one renderer per shot, and stale locks taken over.

A lock is an advisory ``flock`` on a small file (``<workspace>/run.lock``, ``shots/NNNN-<shot key>/render.lock``)
that also records its holder (pid, host, run, since) for the messages. The kernel drops a flock
when its process dies, however it dies, so a lock left by a dead process is simply taken over by
the next run (logged, naming the dead holder); there is no pid guessing and no clean-up step.
On a shared workspace flock works across hosts on NFSv4 (byte-range locks; a dead host's locks
end with its lease). A second film run on the same workspace waits up to ``checks.lock_wait_s``
and then fails with one line naming the holder; a shot another live process is rendering is
skipped (`LockBusy`) and its run's report says so. No Prefect here: files and processes only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.errors import DubflowError

log = logging.getLogger(__name__)


class LockBusy(DubflowError):
    """Another live process holds the lock (the message names it)."""


def holder_text(owner: dict[str, Any] | None) -> str:
    """`pid 123 on host h (run x) since t`, or `an unknown process`."""
    if not owner:
        return "an unknown process"
    run = f" ({owner['run']})" if owner.get("run") else ""
    return f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}{run} since {owner.get('since', '?')}"


def _read_owner(fd: int) -> dict[str, Any] | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        owner = json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def hold_lock(
    path: str | os.PathLike[str], what: str, *, wait_s: float = 0.0, run: str = "", poll_s: float = 1.0
) -> Iterator[dict[str, Any]]:
    """Hold the lock at `path` for the block; wait up to `wait_s` for a live holder, then `LockBusy`.

    `what` names the locked thing in messages ("workspace /w/x", "shot 0042"). Yields the owner record.
    """
    p = Path(path)
    deadline, waiting = time.monotonic() + max(0.0, wait_s), False
    while True:
        p.parent.mkdir(parents=True, exist_ok=True)
        try:  # never through a symlink planted at the lock's path (the owner record is written into it)
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise LockBusy(p, f"{what}: cannot open its lock file ({exc.strerror or exc})") from exc
        if _try_lock(fd):
            if _same_file(fd, p):
                break
            os.close(fd)  # the file was removed (its folder deleted) while we waited: lock the new one
            continue
        holder = holder_text(_read_owner(fd))
        os.close(fd)
        if time.monotonic() >= deadline:
            waited = f" after waiting {wait_s:.0f} s (checks.lock_wait_s)" if wait_s > 0 else ""
            raise LockBusy(p, f"{what} is in use by {holder}{waited}")
        if not waiting:
            log.info("%s is in use by %s: waiting up to %.0f s", what, holder, wait_s)
            waiting = True
        time.sleep(min(poll_s, max(0.01, deadline - time.monotonic())))
    try:
        stale = _read_owner(fd)
        if stale:  # a holder that ended without releasing: it died (a released lock is emptied)
            log.warning(
                "%s: taking over the lock of %s, which is no longer running", what, holder_text(stale)
            )
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "run": run,
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        try:
            yield owner
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)  # released cleanly: the next holder sees no stale owner
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
