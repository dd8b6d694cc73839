"""The identity of a run's inputs: noted when it starts, re-verified where they are read, checked again
before the film is assembled.

A film run reads its source for many minutes (every shot's frames) and muxes the dub track at the
very end; a source or dub file replaced while shots render would give a silently mixed output. Each
input must be a regular file (a FIFO or a device is refused at once, never waited on: `InputNotRegular`).
Its identity (device, inode, size, mtime and ctime in ns, and the SHA-256 of its first and last MiB,
`tasks.files.head_tail_fingerprint`) is noted before any work (`input_identity`). Every shot checks the
source against it before and after reading its frames (`check_input`, without the device: another host
sees another one) and a shot whose frames may come from another file is never marked done, so nothing
rendered from a swapped source is kept under the original's shot keys. Before assembling every input
is compared again (`check_inputs_unchanged`): any difference stops the run with one line naming the
file, before anything is written at the output. The ctime cannot be set back by a user, so a file
edited in place and its mtime restored is seen as changed; an edit in place by root with the clock
moved back is not (documented in docs/reliability.md). No Prefect here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tasks.errors import MediaError
from tasks.files import NotRegular, check_regular, head_tail_fingerprint

FIELDS = ("device", "inode", "size", "mtime_ns", "ctime_ns", "head+tail SHA-256")


class InputChanged(MediaError):
    """An input file was replaced or changed during the run (the message names it)."""


class InputNotRegular(MediaError):
    """An input is not a regular file (a FIFO, a device, a folder): refused before anything opens it."""


def _identity(path: str) -> list[int | str]:
    try:
        st = check_regular(path)
        fingerprint = head_tail_fingerprint(path)
    except NotRegular as exc:
        raise InputNotRegular(Path(path), str(exc)) from exc
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, fingerprint]


def input_identity(paths: Iterable[str | os.PathLike[str] | None]) -> dict[str, list[int | str]]:
    """{path: identity} of every readable input file given (None entries and files that cannot be read
    are skipped: the run's own checks name those with a clearer message). `InputNotRegular` for a path
    that names anything but a regular file (opened by nothing before this check)."""
    noted = {}
    for p in paths:
        if p is not None:
            try:
                noted[str(p)] = _identity(str(p))
            except OSError:
                continue
    return noted


def portable(identity: list[int | str]) -> list[int | str]:
    """An identity without its device number (which differs between the hosts mounting one file)."""
    return list(identity[1:])


def check_input(path: str, noted: list[int | str], what: str = "") -> None:
    """Raise InputChanged when `path` is no longer the file `noted` (a `portable` identity) describes."""
    try:
        now = portable(_identity(path))
    except (OSError, MediaError) as exc:
        raise InputChanged(Path(path), f"removed or unreadable since the run began ({exc}){what}") from exc
    changed = [name for name, a, b in zip(FIELDS[1:], noted, now, strict=True) if a != b]
    if changed:
        raise InputChanged(Path(path), f"changed during the run ({', '.join(changed)} differ){what}")


def check_inputs_unchanged(noted: dict[str, list[int | str]]) -> None:
    """Raise InputChanged naming the first input whose identity differs from `noted`."""
    for path, before in noted.items():
        try:
            now = _identity(path)
        except (OSError, MediaError) as exc:
            raise InputChanged(
                Path(path), f"removed or unreadable since the run began ({exc}): nothing assembled"
            ) from exc
        changed = [name for name, a, b in zip(FIELDS, before, now, strict=True) if a != b]
        if changed:
            raise InputChanged(
                Path(path),
                f"changed during the run ({', '.join(changed)} differ): nothing assembled; "
                "re-run to dub the file as it is now",
            )
