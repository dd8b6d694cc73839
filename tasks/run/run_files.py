"""Run files that may be damaged: read them, and set aside the ones that cannot be trusted.

A workspace's run files (``workspace.json``, ``shots-*.json``, ``assembled.json``) are caches of work
that can be done again. One that is zero-filled, truncated, not JSON or not of the expected shape
must never make every re-run fail until someone deletes it by hand: `read_run_file` renames it to
``<name>.bad-<UTC time>-<random>`` next to itself (kept for a post-mortem, never read again), logs
one warning naming both files, and answers None, so the caller rebuilds it. The rename only happens
while the path still names the file that was read (a concurrent run may have rebuilt it already).
No Prefect here: files only.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_RUN_FILE = 64 << 20  # a run file is small JSON; anything larger is damaged


class BadRunFile(ValueError):
    """A run file's content is not what it should be (the message says why)."""


def set_aside(path: str | os.PathLike[str], why: str, *, read: os.stat_result | None = None) -> Path | None:
    """Rename the damaged run file `path` out of the way (one warning line); the new name, or None.

    `read`: the stat of the file that was found damaged; nothing is renamed when `path` now names
    another file (rebuilt meanwhile by a concurrent run).
    """
    p = Path(path)
    try:
        if read is not None and not os.path.samestat(read, os.lstat(p)):
            return None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = p.with_name(f"{p.name}.bad-{stamp}-{os.urandom(3).hex()}")
        os.rename(p, aside)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: %s; it cannot be set aside (%s): ignored", p, why, exc.strerror or exc)
        return None
    log.warning("%s: %s: set aside as %s, it will be rebuilt", p, why, aside.name)
    return aside


def read_run_file(path: str | os.PathLike[str], check: Callable[[Any], T] | None = None) -> T | Any | None:
    """The JSON of run file `path` passed through `check` (which raises on a wrong shape); None when
    the file is missing or was set aside as damaged (see the module docstring)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. a symlink planted at the path, or no permission
        set_aside(p, f"cannot be opened ({exc.strerror or exc})")
        return None
    st: os.stat_result | None = None
    try:
        st = os.fstat(fd)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_RUN_FILE + 1)
        if len(data) > MAX_RUN_FILE:
            raise BadRunFile(f"larger than {MAX_RUN_FILE} bytes")
        if not data.strip(b"\0 \t\r\n"):
            raise BadRunFile("empty or zero-filled")
        value = json.loads(data)
        return value if check is None else check(value)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = str(exc) if isinstance(exc, BadRunFile) else f"unreadable ({type(exc).__name__}: {exc})"
        set_aside(p, why[:300], read=st)
        return None
    finally:
        os.close(fd)
