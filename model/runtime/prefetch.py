"""Overlap the film pipeline's CPU work with the DiT: a small ordered background-work queue.

Per chunk the GPU denoises for seconds while the CPU has its own work: decoding the next chunk's
source frames and audio features, colour-matching, compositing and encoding the previous chunk's
output. Done inline, every second of it is a second the GPU sits idle. `Prefetcher` runs such jobs
on worker threads (ffmpeg pipes, numpy, zlib and torch CPU ops release the GIL), keeps at most
`depth` of them in flight (bounded memory, backpressure), and hands results back in submission
order; a failed job re-raises in the caller with the job's name.

Typical backend use::

    with Prefetcher(depth=2) as inputs, Prefetcher(depth=2) as outputs:
        inputs.submit(load_chunk_inputs, plan[0], name="inputs 0")
        for k, spec in enumerate(plan):
            if k + 1 < len(plan):
                inputs.submit(load_chunk_inputs, plan[k + 1], name=f"inputs {k + 1}")
            frames = generate(inputs.next())                        # GPU
            if len(outputs) == outputs.depth:
                outputs.next()                                       # oldest write done (or raise)
            outputs.submit(write_chunk, frames.cpu(), name=f"write {k}")  # CPU, overlapped
        outputs.drain()                                              # re-raises any writer error
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class PrefetchError(RuntimeError):
    """A background job failed; the message names the job, the cause is chained."""


class Prefetcher:
    """Ordered background jobs with bounded look-ahead.

    `submit` blocks while `depth` jobs are pending (results not yet taken), so a slow consumer
    cannot pile up decoded frames; a caller that submits more than `depth` jobs must take results
    (`next()`) in between, or the next `submit` waits forever. `next()` returns the oldest job's result (waiting for it);
    `drain()` waits for all and returns their results. `busy_seconds` sums the jobs' own run
    times (what the overlap hides), `wait_seconds` the time callers spent blocked on results.
    """

    def __init__(self, depth: int = 2, workers: int = 1, name: str = "prefetch"):
        if depth < 1 or workers < 1:
            raise ValueError(f"Prefetcher needs depth >= 1 and workers >= 1, got {depth}, {workers}")
        self.depth = depth
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._pending: deque[tuple[str, Future]] = deque()
        self._slots = threading.BoundedSemaphore(depth)
        self._lock = threading.Lock()
        self.busy_seconds = 0.0
        self.wait_seconds = 0.0
        self._closed = False

    def _run(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self.busy_seconds += time.perf_counter() - start

    def submit(self, fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any) -> None:
        """Queue `fn(*args, **kwargs)`; blocks while `depth` results are still pending."""
        if self._closed:
            raise RuntimeError("Prefetcher is closed")
        self._slots.acquire()
        label = name or getattr(fn, "__name__", "job")
        self._pending.append((label, self._pool.submit(self._run, fn, args, kwargs)))

    def __len__(self) -> int:
        return len(self._pending)

    def next(self) -> Any:
        """Result of the oldest pending job (re-raises its error as `PrefetchError`)."""
        if not self._pending:
            raise IndexError("Prefetcher.next(): nothing submitted")
        label, future = self._pending.popleft()
        start = time.perf_counter()
        try:
            return future.result()
        except Exception as exc:
            raise PrefetchError(f"background job {label!r} failed: {exc}") from exc
        finally:
            self.wait_seconds += time.perf_counter() - start
            self._slots.release()

    def drain(self) -> list[Any]:
        """Wait for every pending job; results in submission order."""
        return [self.next() for _ in range(len(self._pending))]

    def close(self, cancel: bool = False) -> None:
        """Stop accepting jobs; wait for running ones (`cancel` drops those not yet started)."""
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel=exc_type is not None)
