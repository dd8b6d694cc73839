"""The overlapped chunk loop of one shot: read ahead, generate on the caller's thread, write behind.

A shot's chunks pass three steps: `read` (decode the chunk's source frames; CPU, ffmpeg), `generate`
(the backend's model work; the GPU) and `write` (finish the frames: composite, colour, the lossless
segment, the chunk checkpoint; CPU, ffmpeg). Done one after the other, the GPU idles through every
read and write. `run_chunks` runs `read` on a reader thread up to `depth` chunks ahead and `write` on
a writer thread up to `depth` chunks behind, while `generate` stays on the calling thread (the one that
owns the models), so the GPU goes from one chunk to the next without waiting for the CPU steps:
  * order: reads, generations and writes each run in chunk order, writes one at a time, so the
    checkpoint semantics of a sequential loop hold (a chunk is done when its `write` returned);
  * backpressure: at most `depth` chunks wait decoded and at most `depth` wait to be written, so
    memory stays bounded when one side is slower;
  * errors: the first error of any step is raised in the caller as it was raised (same type), after
    the writes of chunks already generated have finished (a crash loses no generated chunk; their own
    errors are logged); reads not yet started are dropped;
  * `on_done(item)` runs on the calling thread once the item's write has returned (progress callbacks
    stay on the caller's thread);
  * a stop asked for by a signal (`tasks.render.interrupts.check_stop`) is honoured before each generation:
    the chunks generated so far are written, then `Interrupted` is raised (the next run resumes there).
`overlap=False` runs the same three steps inline, one after the other: the reference the tests compare
against (the same output bytes). Holds no knowledge of frames, files or models: the caller's functions do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from tasks.render.interrupts import check_stop

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Lane:
    """One worker thread running jobs in submission order, at most `depth` of them not yet taken."""

    def __init__(self, name: str, depth: int):
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"shot-{name}")
        self._jobs: deque[Future] = deque()
        self._room = threading.Semaphore(depth)
        self.depth = depth
        self.wait_s = 0.0  # time the caller spent blocked on this lane

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        t0 = time.perf_counter()
        self._room.acquire()
        self.wait_s += time.perf_counter() - t0
        self._jobs.append(self._pool.submit(fn, *args))

    def take(self) -> Any:
        """The oldest job's result (waits for it); its exception is raised unchanged."""
        job = self._jobs.popleft()
        t0 = time.perf_counter()
        try:
            return job.result()
        finally:
            self.wait_s += time.perf_counter() - t0
            self._room.release()

    def ready(self) -> bool:
        return bool(self._jobs) and self._jobs[0].done()

    def close(self) -> None:
        """Drop jobs not yet started, wait for the running one."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def run_chunks(
    items: Sequence[T],
    read: Callable[[T], Any],
    generate: Callable[[T, Any], Any],
    write: Callable[[T, Any], None],
    *,
    depth: int = 2,
    overlap: bool = True,
    on_done: Callable[[T], None] | None = None,
) -> dict[str, float]:
    """Run `write(item, generate(item, read(item)))` for every item in order (see the module doc).

    Returns the seconds the calling thread waited: `wait_read` (for a chunk's input) and `wait_write`
    (backpressure: the writer was `depth` chunks behind, or the last writes at the end).
    """
    done = on_done or (lambda item: None)
    if not overlap:
        for item in items:
            check_stop()
            write(item, generate(item, read(item)))
            done(item)
        return {"wait_read": 0.0, "wait_write": 0.0}
    if depth < 1:
        raise ValueError(f"run_chunks: depth must be >= 1, got {depth}")
    reader, writer = _Lane("read", depth), _Lane("write", depth)

    def written(item: T, product: Any) -> T:
        write(item, product)
        return item

    try:
        ahead = 0
        while ahead < min(depth, len(items)):
            reader.submit(read, items[ahead])
            ahead += 1
        for item in items:
            got = reader.take()
            if ahead < len(items):
                reader.submit(read, items[ahead])
                ahead += 1
            check_stop()  # a safe point: every chunk generated so far is written or queued to be
            product = generate(item, got)
            while len(writer) >= depth or writer.ready():
                done(writer.take())
            writer.submit(written, item, product)
        while len(writer):
            done(writer.take())
    except BaseException:
        _finish_quietly(writer)
        raise
    finally:
        reader.close()
        writer.close()
    return {"wait_read": round(reader.wait_s, 3), "wait_write": round(writer.wait_s, 3)}


def _finish_quietly(writer: _Lane) -> None:
    """After an error elsewhere: let the queued writes finish (each is a whole chunk); log their errors."""
    while len(writer):
        try:
            writer.take()
        except Exception as e:  # the first error is the one being raised
            log.error("chunk write after an earlier error failed too: %s: %s", type(e).__name__, e)


def dub_chunk_deferred(session: Any, inp: Any) -> Callable[[], Any]:
    """A backend session's chunk as (model work now, CPU finish later): sessions that split the two
    implement `dub_chunk_deferred(inp) -> finish` (finish() returns the chunk's frames and touches no
    session state, so it may run on the writer thread while the next chunk generates); for the others
    the whole `dub_chunk(inp)` runs now and the finish only hands its frames over."""
    split = getattr(session, "dub_chunk_deferred", None)
    if callable(split):
        return split(inp)
    frames = session.dub_chunk(inp)
    return lambda: frames
