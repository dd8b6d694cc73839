"""The local command's logging: one console line per record, full records in the run's log file.

A person at a shell reads `dubflow: error: ...` and the progress lines; the tracebacks Prefect logs
for a failed task or flow run (and the one of the failure itself) go to the run's log file,
``<workspace root>/.logs/dub-<UTC time>-<pid>-<film stem>.log``, which the error line of an unexpected
failure names (a user error's line says it all).
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from tasks.run.workspace_roots import confine_workspace_root

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConsoleFormatter(logging.Formatter):
    """The record's message without its traceback or stack (a copy is formatted: other handlers keep them)."""

    def format(self, record: logging.LogRecord) -> str:
        bare = logging.makeLogRecord(record.__dict__)
        bare.exc_info, bare.exc_text, bare.stack_info = None, None, None
        return super().format(bare)


def console_handler(level: int) -> logging.Handler:
    """A stderr handler at `level` writing `FORMAT` lines without tracebacks."""
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.setFormatter(ConsoleFormatter(FORMAT, datefmt="%H:%M:%S"))
    return handler


def log_path(root: str | os.PathLike[str], source: str | os.PathLike[str]) -> Path:
    """Where a run of `source` logs: ``<root>/.logs/dub-<UTC time>-<pid>-<film stem>.log``; `root` is a
    workspace root the run may use (`tasks.run.workspace_roots.confine_workspace_root`: ConfigError, and
    nothing created, when it is not)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = confine_workspace_root(root, source) / ".logs"
    return folder / f"dub-{stamp}-{os.getpid()}-{Path(source).stem[:100]}.log"


@contextlib.contextmanager
def run_log(path: str | os.PathLike[str], level: int = logging.INFO) -> Iterator[Path]:
    """While the block runs, every record of `level` and above (tracebacks included) also goes to `path`.

    An exception leaving the block is written there with its traceback, and its `run_log` attribute is
    set to the path (the CLI names it in the error line of an unexpected failure) before it propagates.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(p, encoding="utf-8")
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield p
    except BaseException as exc:
        handler.stream.write("run failed:\n" + "".join(traceback.format_exception(exc)))
        handler.flush()
        with contextlib.suppress(AttributeError, TypeError):
            exc.run_log = str(p)  # type: ignore[attr-defined]
        raise
    finally:
        root.removeHandler(handler)
        handler.close()
