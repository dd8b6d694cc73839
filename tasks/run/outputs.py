"""Where a film run may write its output, and what it may replace there.

The deployment's ``out`` parameter can be set by anyone who reaches the Prefect API, so it is
confined: the output path, fully resolved (``..`` and symlinks, before any check), must lie under an
output root. The roots come from the host running the film flow, never from run parameters:
``DUBFLOW_OUTPUT_ROOTS`` (paths separated by ``os.pathsep``) or, when unset, the source's folder and
the project's ``out/`` (``DUBFLOW_OUT_DIR``, default ``./out``). A missing output folder under a
root is created, with a log line naming it. An existing file is replaced only when dubflow wrote it,
which is proven by the record dubflow keeps of what it delivered (``.<name>.dubflow.json``: size,
SHA-256, workspace key and output, owned by this user: `tasks.media.deliver`), never by a tag a copy would keep: a re-run of the
same film and pass (one workspace) replaces its own output, anything else only with ``overwrite``;
a file dubflow did not write (or one changed since) is never replaced. The same holds for the
sidecars (``.dub.wav``, ``.otio``, ``.edl``, ``.xml``), which belong to the output they were delivered
with (their record names it): two outputs of one stem (``x.mp4``, ``x.mkv``) would share them, so
``overwrite`` of one never replaces the other's. From `claim_output` to the end of the run every file
the output delivers is locked (``.<name>.dubflow.lock``, the film's and each sidecar's): a second film
started with the same ``out``, or with another output sharing a sidecar, fails at once naming the first.
The encode still stamps the container's ``comment`` (``dubflow:<workspace key>``, `output_comment`) for
people and tools; nothing trusts it. The local ``dubflow dub --out`` is not confined (`local_output`):
its user chose the path at their own shell; only the foreign-file rule applies to it. A local command that
fills a folder with many files (`dubflow weights download --to`) writes through `delivered_folder`: the
same rules per file, staged privately and moved in only once the whole fill succeeded. No Prefect here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from tasks.errors import OutputError
from tasks.media import ffmpeg
from tasks.media.deliver import (
    LOCK_SUFFIX,
    NOT_OURS,
    Destination,
    check_names,
    check_replaceable,
    clean_stale,
    deliver,
    destination,
    staging,
    written_record,
)
from tasks.run.run_lock import hold_lock

log = logging.getLogger(__name__)

ROOTS_ENV = "DUBFLOW_OUTPUT_ROOTS"
TAG_PREFIX = "dubflow:"
_COMMENT = re.compile(r"^\s*comment\s*:\s*(\S.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def out_dir() -> Path:
    """The project's output folder: ``$DUBFLOW_OUT_DIR`` (default ``./out``), resolved."""
    return Path(os.environ.get("DUBFLOW_OUT_DIR", "out")).expanduser().resolve()


def output_roots(source: str | os.PathLike[str]) -> list[Path]:
    """The folders outputs may go under (resolved): ``$DUBFLOW_OUTPUT_ROOTS``, else source folder + out/."""
    configured = [p for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p.strip()]
    if configured:
        return [Path(p).expanduser().resolve() for p in configured]
    return [Path(source).expanduser().resolve().parent, out_dir()]


def output_tag(path: str | os.PathLike[str]) -> str | None:
    """The ``dubflow:<key>`` stamp (the first word of the container's comment) of an existing media file,
    or None (not written by dubflow / unreadable)."""
    _, err = ffmpeg.run(["-i", str(path)], path=path, check=False)
    container = err.split("Stream #", 1)[0]  # the container's metadata comes before the streams
    for value in _COMMENT.findall(container):
        if value.startswith(TAG_PREFIX):
            return value.split()[0]
    return None


def confine_output(out: str | os.PathLike[str], source: str | os.PathLike[str]) -> Path:
    """The resolved output path, after checking it is under an output root and not a foreign file.

    Raises OutputError (one line naming the path) before any work is done. Creates nothing: a missing
    output folder is made when the output is claimed, so a run stopped by a bad input leaves no folder.
    """
    resolved = Path(out).expanduser().resolve()
    roots = output_roots(source)
    if not any(resolved.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(r) for r in roots)
        raise OutputError(
            out,
            f"resolves to {resolved}, outside the output roots ({allowed}); "
            f"set {ROOTS_ENV} on the host running the film flow to allow another folder",
        )
    existing = next(p for p in resolved.parents if p.exists() or p.is_symlink())  # "/" at worst
    if not existing.is_dir():
        raise OutputError(out, f"{existing} is not a folder")
    if existing != resolved.parent:  # made by the output's lock (`claim_output`), after the inputs are read
        log.info("the output folder %s will be created (under the output root)", resolved.parent)
    if resolved.exists() or resolved.is_symlink():
        if resolved.is_symlink() or not resolved.is_file():
            raise OutputError(out, "exists and is not a regular file")
        if written_record(resolved) is None:
            raise OutputError(out, NOT_OURS)
    return resolved


def check_overwrite(
    out: str | os.PathLike[str], key: str, overwrite: bool, output: str | None = None
) -> None:
    """An existing dubflow output is replaced only by a run of the same workspace, or with `overwrite`;
    a file delivered with another output (`output`: the name of the one being made) never."""
    path = Path(out)
    if not (path.exists() or path.is_symlink()):
        return
    record = written_record(path)
    if record is None:
        raise OutputError(out, NOT_OURS)
    owner = record.get("output")
    if output is not None and owner is not None and owner != output:
        raise OutputError(
            out,
            f"was delivered with the dubflow output {owner}, not {output}: refusing to replace it "
            "(remove it, or choose another output name)",
        )
    if record.get("key") != key and not overwrite:
        raise OutputError(
            out,
            f"exists (a dubflow output of another film or pass, {output_stamp(str(record.get('key')))}); "
            "pass --overwrite (flow parameter overwrite=true) to replace it",
        )


def claim_output(
    held: contextlib.ExitStack,
    out: str | os.PathLike[str],
    key: str,
    overwrite: bool,
    sidecars: Sequence[str | os.PathLike[str]] = (),
    run: str = "",
) -> dict:
    """Lock `out` and each of its `sidecars` for the rest of the run (`held`), remove what a killed run
    left there, check that they may be replaced, and note what is there (`tasks.media.deliver.Destination`,
    as a dict: the final renames check it again)."""
    path = Path(out)
    for target in (path, *map(Path, sidecars)):  # the same order in every run: the first shared one decides
        lock = target.with_name(f".{target.name}{LOCK_SUFFIX}")
        what = f"output {path}" if target == path else f"{target} (a file output {path.name} delivers)"
        held.enter_context(hold_lock(lock, what, run=run))  # another run delivering it: fails at once
        held.callback(_unlink_quietly, lock)  # removed while still held (a waiter then locks a fresh file)
    clean_stale(path.parent, path.name)
    for target in (path, *map(Path, sidecars)):
        check_overwrite(target, key, overwrite, path.name)
    return destination([path, *map(Path, sidecars)]).to_dict()


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def output_stamp(key: str) -> str:
    """The stamp an output of workspace `key` carries (the first word of its container comment)."""
    return f"{TAG_PREFIX}{key}"


def output_comment(key: str, label: str | None = None) -> str:
    """The container ``comment`` of an output of workspace `key`: its stamp, then `label` if any."""
    return f"{output_stamp(key)} {label}" if label else output_stamp(key)


# ------------------------------------------------------------- the local command's output (`dubflow dub --out`)


def local_output(out: str | os.PathLike[str]) -> Path:
    """The resolved output of the local `dubflow dub`: anywhere its user says, never a foreign file.

    The person at their own shell chose the path, so no output root applies (the roots confine the
    deployment's ``out`` parameter, `confine_output`). A missing folder is fine (the run creates it); an
    existing file is refused unless dubflow wrote it (`check_overwrite` decides the rest in the run).
    Raises OutputError naming the path; creates nothing.
    """
    resolved = Path(out).expanduser().resolve()
    folder = resolved.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputError(out, f"{folder} is not a folder")
    if resolved.exists():
        if not resolved.is_file():
            raise OutputError(out, "exists and is not a regular file")
        if written_record(resolved) is None:
            raise OutputError(out, NOT_OURS)
    return resolved


@contextlib.contextmanager
def local_output_allowed(out: str | os.PathLike[str], source: str | os.PathLike[str]) -> Iterator[Path]:
    """While the block runs, this process's film run may write `out` (its folder is an output root).

    For the local command only: its process is the host running the film flow, the roots being that
    host's setting. The previous ``DUBFLOW_OUTPUT_ROOTS`` (set or not) is restored on exit.
    """
    resolved = local_output(out)
    before = os.environ.get(ROOTS_ENV)
    roots = [*output_roots(source), resolved.parent]
    os.environ[ROOTS_ENV] = os.pathsep.join(str(r) for r in roots)
    try:
        yield resolved
    finally:
        if before is None:
            os.environ.pop(ROOTS_ENV, None)
        else:
            os.environ[ROOTS_ENV] = before


# ------------------------------------------- a folder of files a local command fills (`dubflow weights download`)


def local_folder(to: str | os.PathLike[str]) -> Path:
    """The resolved folder a local command fills with files: anywhere its user says (as `local_output`; a
    link the user gave is resolved once, here), but a folder or a path to one not made yet, never a file.
    OutputError naming the path; creates nothing."""
    resolved = Path(to).expanduser().resolve()
    existing = next(p for p in (resolved, *resolved.parents) if p.exists() or p.is_symlink())  # "/" at worst
    if not existing.is_dir():
        raise OutputError(to, f"{existing} is not a folder")
    return resolved


def _inside(folder: Path, rel: str) -> Path:
    """`folder / rel`, refused (OutputError) when `rel` leaves `folder` or a folder on the way is a symlink
    or a file (nothing is written through a planted link)."""
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts or not parts:
        raise OutputError(folder, f"{rel!r}: not a path inside the folder")
    step = folder
    for part in parts[:-1]:
        step = step / part
        if step.is_symlink() or (step.exists() and not step.is_dir()):
            raise OutputError(step, "is not a folder (a symlink or a file): refusing to write through it")
    check_names([folder / rel])
    return folder / rel


@contextlib.contextmanager
def delivered_folder(
    to: str | os.PathLike[str], key: str, expected: Sequence[str] = (), stem: str = "download"
) -> Iterator[Path]:
    """Fill the folder `to` by the delivery rules, as every output is written (`tasks.media.deliver`).

    Before anything is created: `to` is a folder (`local_folder`) and each file of `expected` (paths under
    `to`) is absent or one dubflow wrote and nobody changed (`check_replaceable`). Then `to` is created and
    locked (``.<stem>.dubflow.lock``; staging folders a killed fill left are removed) and the block writes
    into the private staging folder it is given. When the block ends without error, every file staged
    (hidden paths, a writer's own bookkeeping, left out) is checked the same way, all before the first is
    moved, then each is moved to its path under `to` with its record (`key`: what wrote it). The staging
    folder is removed either way: a failed or interrupted fill leaves what was there before.
    """
    folder = local_folder(to)
    for rel in expected:
        check_replaceable(_inside(folder, rel))
    folder.mkdir(parents=True, exist_ok=True)
    st = os.lstat(folder)
    with contextlib.ExitStack() as held:
        lock = folder / f".{stem}{LOCK_SUFFIX}"
        held.enter_context(hold_lock(lock, f"folder {folder}"))  # a second fill of it fails at once
        held.callback(_unlink_quietly, lock)
        clean_stale(folder, stem)
        staged = held.enter_context(staging(Destination(str(folder), (st.st_dev, st.st_ino)), stem))
        yield staged
        files = sorted(p for p in staged.rglob("*") if not p.is_dir() or p.is_symlink())
        files = [p for p in files if not any(part.startswith(".") for part in p.relative_to(staged).parts)]
        moves = []
        for path in files:
            if path.is_symlink() or not path.is_file():
                raise OutputError(path, "was staged as a symlink or a special file: nothing delivered")
            target = _inside(folder, path.relative_to(staged).as_posix())
            moves.append((path, check_replaceable(target)))
        for path, target in moves:
            target.parent.mkdir(parents=True, exist_ok=True)
            deliver(destination([target]), path, target.name, key)
        log.info("%d file(s) delivered into %s", len(moves), folder)
