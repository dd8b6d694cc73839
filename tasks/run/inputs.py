"""The identity of a run's inputs, noted when it starts and checked again before the film is assembled.

A film run reads its source for many minutes (every shot's frames) and muxes the dub track at the
very end; a source or dub file replaced while shots render would give a silently mixed output. Each
input's identity (device, inode, size, mtime in ns, and the SHA-256 of its first and last MiB,
`tasks.run.workspace.film_fingerprint`) is noted before any work (`input_identity`) and compared again
before assembling (`check_inputs_unchanged`): any difference stops the run with one line naming the
file, before anything is written at the output. An edit in place that keeps size, mtime and the first
and last MiB is not detected (documented in docs/reliability.md). No Prefect here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tasks.errors import MediaError
from tasks.files import WorkspaceError
from tasks.run.workspace import film_fingerprint

FIELDS = ("device", "inode", "size", "mtime_ns", "head+tail SHA-256")


class InputChanged(MediaError):
    """An input file was replaced or changed during the run (the message names it)."""


def _identity(path: str) -> list[int | str]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, film_fingerprint(path)]


def input_identity(paths: Iterable[str | os.PathLike[str] | None]) -> dict[str, list[int | str]]:
    """{path: identity} of every readable input file given (None entries and files that cannot be read
    are skipped: the run's own checks name those with a clearer message)."""
    noted = {}
    for p in paths:
        if p is not None:
            try:
                noted[str(p)] = _identity(str(p))
            except (OSError, WorkspaceError):
                continue
    return noted


def check_inputs_unchanged(noted: dict[str, list[int | str]]) -> None:
    """Raise InputChanged naming the first input whose identity differs from `noted`."""
    for path, before in noted.items():
        try:
            now = _identity(path)
        except (OSError, WorkspaceError) as exc:
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
