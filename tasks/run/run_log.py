"""The local command's logging: one console line per record, full records in the run's log file.

A person at a shell reads `dubflow: error: ...` and the progress lines; the tracebacks Prefect logs
for a failed task or flow run (and the one of the failure itself) go to the run's log file,
``<workspace root>/.logs/dub-<UTC time>-<pid>-<film stem>.log``, which the error line of an unexpected
failure names (a user error's line says it all). Prefect's own bookkeeping (run created, "Finished in
state Completed()", the engine's report of an interrupt) stays off the console (`ConsoleFilter`,
installed by `quiet_console` once Prefect is imported) and goes to the log file.
"""

from __future__ import annotations

import contextlib
import importlib.util
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


# Prefect's own reports of a state or a failure the command reports itself (one line at its end)
_PREFECT_REPORTS = (
    "Finished in state",
    "Encountered exception during execution",
    "Crash detected!",
    "Engine execution",
    "Execution of task",
)


# the loggers whose INFO lines a person running a film reads: the flows' and their run loggers'
_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "flows.", "dubflow")


class ConsoleFilter(logging.Filter):
    """Lets through what a person running a film needs: the flows' lines (progress per shot and chunk,
    through Prefect's run loggers too) and every warning and error, but of Prefect's own code only
    warnings and errors that are not its report of a state or failure the command reports itself
    ("Finished in state ...", "Encountered exception ...", the engine's report of an interrupt)."""

    def __init__(self) -> None:
        super().__init__()
        spec = importlib.util.find_spec("prefect")
        origin = spec.origin if spec is not None else None
        self.prefect_dir = str(Path(origin).parent) + os.sep if origin else None

    def filter(self, record: logging.LogRecord) -> bool:
        prefect_code = self.prefect_dir is not None and record.pathname.startswith(self.prefect_dir)
        if prefect_code:
            return record.levelno >= logging.WARNING and not record.getMessage().startswith(_PREFECT_REPORTS)
        # below warnings: the run's own lines (progress per shot and chunk); library detail (model loads,
        # encoders) goes to the log file
        return record.levelno >= logging.WARNING or record.name.startswith(_RUN_LOGGERS)


def console_handler(level: int) -> logging.Handler:
    """A stderr handler at `level` writing `FORMAT` lines without tracebacks, without Prefect's noise."""
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.setFormatter(ConsoleFormatter(FORMAT, datefmt="%H:%M:%S"))
    handler.addFilter(ConsoleFilter())
    handler.dubflow_console = True  # type: ignore[attr-defined] # one of ours (`quiet_console` replaces it)
    return handler


def quiet_console(level: int) -> None:
    """After Prefect's import (its logging setup replaced the root logger's handlers with its console
    handler and raised the root level to WARNING): the root logger at `level` again, with one console
    handler of ours (`console_handler`) and no console handler of Prefect's."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if type(handler).__module__.startswith("prefect.") or getattr(handler, "dubflow_console", False):
            root.removeHandler(handler)
    root.addHandler(console_handler(level))
    root.setLevel(min(level, logging.INFO))


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
    handler.dubflow_run_log = True  # type: ignore[attr-defined] # the report names it (flows/run_report.py)
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
