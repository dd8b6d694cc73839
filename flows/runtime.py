"""Where a flow step runs and how it logs: the run logger (Prefect's inside a run, the caller's module
logger in inline mode) and the host / worker / device triple that shot markers and attempt lines record.

Holds only these two process-context helpers; no tasks, no flows, no workspace or media logic.
"""

from __future__ import annotations

import logging
import os
import socket

from prefect import get_run_logger


def run_logger(inline: logging.Logger) -> logging.Logger | logging.LoggerAdapter:
    """Prefect's run logger inside a flow or task run, else `inline` (the caller's module logger)."""
    from prefect.context import FlowRunContext, TaskRunContext

    if TaskRunContext.get() is None and FlowRunContext.get() is None:  # inline mode
        return inline
    return get_run_logger()


def where_am_i() -> dict[str, str]:
    """Host, Prefect worker (set by the worker in its flow-run processes) and device of this process."""
    return {
        "host": socket.gethostname(),
        "worker": os.environ.get("PREFECT__WORKER_NAME", "") or "in-process",
        "device": os.environ.get("CUDA_VISIBLE_DEVICES", "") or "cpu",
    }


def describe_place(where: dict[str, str]) -> str:
    """`where_am_i()` for a log line: the device alone in this process, else worker@host:device."""
    if where["worker"] == "in-process":
        return where["device"]
    return f"{where['worker']}@{where['host']}:{where['device']}"
