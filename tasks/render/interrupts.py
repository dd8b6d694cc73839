"""Stopping a run on one Ctrl-C (SIGINT) or SIGTERM without losing what finished.

`stop_on_signals` installs a `StopOnSignal` handler for both signals while a run goes on. The first signal
asks the work to stop at its next safe point (`check_stop`: before the next chunk's model work, before the
next shot), so the chunk in flight is finished and checkpointed where that takes less than the grace period;
once the grace period is over, or on a second signal, `Interrupted` is raised in the main thread at once
(the chunks already generated are still written: `tasks.render.overlap.run_chunks`). Either way the same
command resumes at the last finished chunk. While a Prefect flow runs in the main thread, its engine
answers SIGTERM itself (it raises at once) and then hands the signal on here: the run then stops at once,
as after a second signal.

The state is the process's signal table itself (the installed handler object), so any thread can ask
`stop_requested()` and nothing here is module-level state.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from tasks.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """The SIGINT/SIGTERM handler of a run: first signal = stop at the next safe point (and hard after
    `grace_s`), second signal = stop now. `notify(signal name)` is called once, on the first."""

    def __init__(self, grace_s: float, notify: Callable[[str], None] | None = None) -> None:
        self.grace_s = grace_s
        self.notify = notify
        self.requested: str | None = None  # the first signal's name
        self._timer: threading.Timer | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if self.requested is not None:  # the second signal, or the grace period's end
            raise Interrupted(self.requested)
        self.requested = signal.Signals(signum).name
        unwinding = sys.exc_info()[1]
        if unwinding is not None and not isinstance(unwinding, Exception):
            # the run is already stopping: a signal handler of Prefect's flow engine (its SIGTERM bridge)
            # raised its own stop and handed the signal on to this one
            raise Interrupted(self.requested) from unwinding
        if self.notify is not None:
            self.notify(self.requested)
        if self.grace_s <= 0:
            raise Interrupted(self.requested)
        # a real signal to the main thread at the end of the grace period: it also wakes a blocking wait
        main = threading.main_thread().ident
        self._timer = threading.Timer(self.grace_s, signal.pthread_kill, (main, signal.SIGINT))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _installed() -> StopOnSignal | None:
    handler = signal.getsignal(signal.SIGINT)
    return handler if isinstance(handler, StopOnSignal) else None


def stop_requested() -> str | None:
    """The signal that asked this process to stop (e.g. "SIGINT"), None when none did."""
    handler = _installed()
    return handler.requested if handler is not None else None


def check_stop() -> None:
    """Raise `Interrupted` when a signal asked the run to stop (a safe point: nothing is half done here)."""
    name = stop_requested()
    if name is not None:
        raise Interrupted(name)


@contextlib.contextmanager
def stop_on_signals(grace_s: float, notify: Callable[[str], None] | None = None) -> Iterator[StopOnSignal]:
    """While the block runs, SIGINT and SIGTERM stop it in order (see the module docstring); the previous
    handlers come back after it. Only the main thread can install handlers: elsewhere nothing changes."""
    handler = StopOnSignal(grace_s, notify)
    if threading.current_thread() is not threading.main_thread():
        yield handler
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield handler
    finally:
        handler.cancel()
        for s, h in previous.items():
            signal.signal(s, h)
