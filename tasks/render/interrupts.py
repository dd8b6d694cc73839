"""Stopping a run on one Ctrl-C (SIGINT) or SIGTERM without losing what finished.

`stop_on_signals` installs a `StopOnSignal` handler for both signals while a run goes on. The first signal
asks the work to stop at its next safe point (`check_stop`: before the next chunk's model work, before the
next shot), so the chunk in flight is finished and checkpointed where that takes less than the grace period;
once the grace period is over, or on a second signal, the run stops at once: `Interrupted` is raised in the
main thread (the chunks already generated are still written: `tasks.render.overlap.run_chunks`). Either way
the same command resumes at the last finished chunk.

An exception raised from a signal handler lands on whatever line the main thread runs, and not every line
survives that: an orchestrator's own bookkeeping (Prefect's engine creating a task run, say) may turn it into
an unrelated error or swallow it. So the caller may pass `safe_to_raise(frame)`: while it says no, the stop
is retried every `RETRY_S` instead; and `last_resort()`, called from a timer thread when the run is still
going `last_resort_s` after the stop was due (a stop that cannot be raised, or a clean-up that hangs), ends
the process itself. Where a Prefect flow engine answers SIGTERM with its own exception and then hands the
signal on here, the run stops at once, as after a second signal.

The state is the process's signal table itself (the installed handler object), so any thread can ask
`stop_requested()` and nothing here is module-level state.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from tasks.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)
RETRY_S = 0.05  # a stop that may not be raised on the main thread's current line is tried again this soon


class StopOnSignal:
    """The SIGINT/SIGTERM handler of a run: first signal = stop at the next safe point (and hard after
    `grace_s`), second signal = stop now. `notify(signal name)` is called once, on the first;
    `safe_to_raise` and `last_resort`: see the module docstring."""

    def __init__(
        self,
        grace_s: float,
        notify: Callable[[str], None] | None = None,
        safe_to_raise: Callable[[FrameType | None], bool] | None = None,
        last_resort: Callable[[str], None] | None = None,
        last_resort_s: float = 5.0,
    ) -> None:
        self.grace_s = grace_s
        self.notify = notify
        self.safe_to_raise = safe_to_raise
        self.last_resort = last_resort
        self.last_resort_s = last_resort_s
        self.requested: str | None = None  # the first signal's name
        self.stop_due: float | None = None  # monotonic time the hard stop was first due
        self.deferred = 0  # hard stops put off because the main thread was on an unsafe line
        self._timers: list[threading.Timer] = []
        self._closed = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None:  # the second signal, the grace period's end, or a retry
            self._stop_now(frame)
            return
        self.requested = signal.Signals(signum).name
        unwinding = sys.exc_info()[1]
        if unwinding is not None and not isinstance(unwinding, Exception):
            # the run is already stopping: a signal handler of Prefect's flow engine (its SIGTERM bridge)
            # raised its own stop and handed the signal on to this one
            raise Interrupted(self.requested) from unwinding
        if self.notify is not None:
            self.notify(self.requested)
        if self.grace_s <= 0:
            self._stop_now(frame)
            return
        self._kick_after(self.grace_s)

    def _stop_now(self, frame: FrameType | None) -> None:
        assert self.requested is not None
        if self.stop_due is None:
            self.stop_due = time.monotonic()
            if self.last_resort is not None:
                self._after(self.last_resort_s, self._give_up)
        if self.safe_to_raise is None or self.safe_to_raise(frame):
            raise Interrupted(self.requested)
        self.deferred += 1
        self._kick_after(RETRY_S)

    def _kick_after(self, seconds: float) -> None:
        """A real SIGINT to the main thread in `seconds` (it also wakes a blocking wait there)."""
        self._after(seconds, self._kick)

    def _kick(self) -> None:
        if not self._closed:  # once the handler is gone, a SIGINT would be an unrelated KeyboardInterrupt
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    def _after(self, seconds: float, fn: Callable[..., object], *args: object) -> None:
        if self._closed:
            return
        timer = threading.Timer(seconds, fn, args)
        timer.daemon = True
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def _give_up(self) -> None:
        if not self._closed and self.last_resort is not None and self.requested is not None:
            self.last_resort(self.requested)

    def cancel(self) -> None:
        self._closed = True
        for timer in self._timers:
            timer.cancel()


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
def stop_on_signals(
    grace_s: float,
    notify: Callable[[str], None] | None = None,
    safe_to_raise: Callable[[FrameType | None], bool] | None = None,
    last_resort: Callable[[str], None] | None = None,
    last_resort_s: float = 5.0,
) -> Iterator[StopOnSignal]:
    """While the block runs, SIGINT and SIGTERM stop it in order (see the module docstring); the previous
    handlers come back after it. Only the main thread can install handlers: elsewhere nothing changes."""
    handler = StopOnSignal(grace_s, notify, safe_to_raise, last_resort, last_resort_s)
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
