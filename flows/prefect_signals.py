"""Ctrl-C and SIGTERM around a Prefect run in this process (`dubflow dub` in its default mode).

An exception raised by a signal handler lands on whatever line the main thread runs. Inside Prefect's own
engine code that is not safe: a stop landing while the engine creates a task run makes its crash handling
fail with `ValueError: Task run is not set`, which then fails the flow like any error (exit status 1 instead
of 130, tests/test_interrupts.py saw it); one landing after a flow's code has returned is swallowed and the
run goes on. Two guards keep `tasks.render.interrupts`' stop off those lines:

* `outside_prefect_engine(frame)`, the hard stop's `safe_to_raise`: no on a line of Prefect's code inside a
  flow or task run, unless that code is the call into our own flow or task function; elsewhere yes;
* `dubflow_owns_sigterm()`: while a flow runs, Prefect's flow engine swaps SIGTERM's handler for its own
  bridge (made for a runner cancelling a flow subprocess), which raises on any line at once. In the local
  command nothing cancels a flow that way, so the bridge stays off and SIGTERM stays dubflow's, like Ctrl-C.

Prefect is located here, not imported (the local command imports it only after its server URL is set).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from types import FrameType

ENGINE_FILES = ("flow_engine.py", "task_engine.py")
USER_CALL = "call_with_parameters"  # prefect.utilities.callables: where the engines call a flow's/task's code


def _prefect_dir() -> str:
    spec = importlib.util.find_spec("prefect")
    assert spec is not None and spec.origin is not None, "prefect is not installed"
    return os.path.dirname(spec.origin) + os.sep


def outside_prefect_engine(frame: FrameType | None, prefect_dir: str | None = None) -> bool:
    """Whether an exception raised on `frame`'s line reaches our code's handlers, not Prefect's engine
    bookkeeping: true outside any flow or task run, and inside one where the innermost Prefect frame is
    the engine's call into the flow's or task's own function."""
    root = prefect_dir or _prefect_dir()
    innermost = None  # the innermost frame of Prefect's code
    f = frame
    while f is not None:
        path = f.f_code.co_filename
        if path.startswith(root):
            innermost = innermost or f
            if os.path.basename(path) in ENGINE_FILES:
                return innermost.f_code.co_name == USER_CALL
        f = f.f_back
    return True  # not inside a flow or task run


@contextlib.contextmanager
def dubflow_owns_sigterm() -> Iterator[None]:
    """While the block runs, flows run in this process leave SIGTERM's handler as it is (see above)."""
    import prefect.flow_engine as engine

    bridge = engine.capture_sigterm
    engine.capture_sigterm = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.capture_sigterm = bridge
