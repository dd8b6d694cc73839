"""A pool worker owning N GPUs: N rank processes started once, models built once per rank, shot jobs run.

`ShotWorker` starts N processes once per pool worker (one GPU each), builds the models once per
rank, and then runs shot jobs: rank 0 takes each job record from the parent and broadcasts it, all
ranks run the handler, rank 0 returns the result. A rank that fails (an exception, or killed by a
signal, e.g. the OOM killer) fails the job with a one-line `ShotWorkerError` naming that rank; the
worker then stops all its ranks and must be started again. Test hook, inert unless set: the environment
variable DUBFLOW_SP_FAULT (`model.network.parallel.FAULT_ENV`) = "RANK:JOB:FORWARD", present when the ranks start,
makes rank RANK SIGKILL itself at the start of the FORWARD-th DiT forward of its JOB-th job (both counted
from 1 since its setup), so a test can kill a rank mid-chunk deterministically.
The sequence-parallel layout the ranks run is `model.network.parallel`'s; this file holds only the processes.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as mp

from model.network.parallel import FAULT_ENV, SequenceParallel

logger = logging.getLogger(__name__)

Setup = Callable[[SequenceParallel], Any]
Handler = Callable[[SequenceParallel, Any, dict], Any]


class ShotWorkerError(RuntimeError):
    """A rank of a ShotWorker failed; the worker is closed and must be started again.

    The message is one line naming the rank; `rank` is that rank (None: no answer in time) and
    `details` the failing rank's traceback where it sent one.
    """

    def __init__(self, message: str, rank: int | None = None, details: str = ""):
        super().__init__(message)
        self.rank = rank
        self.details = details


def fault_point(rank: int) -> tuple[int, int] | None:
    """(job, forward) at which `rank` kills itself per DUBFLOW_SP_FAULT ("RANK:JOB:FORWARD"); None = off."""
    value = os.environ.get(FAULT_ENV, "").strip()
    if not value:
        return None
    try:
        target, job, forward = (int(x) for x in value.split(":"))
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={value!r}: expected RANK:JOB:FORWARD (three integers)") from None
    return (job, forward) if target == rank else None


def _last_line(text: str) -> str:
    """The last non-empty line of a traceback (the exception and its message)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def free_port() -> int:
    """A TCP port that was free a moment ago on localhost (rendezvous of a local group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    backend: str | None,
    devices: Sequence[int] | None,
    setup: Setup,
    handle: Handler,
    jobs: Any,
    results: Any,
) -> None:
    """Body of one rank: join the group, build the models once, then run broadcast jobs until None."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank if devices is None else devices[rank]),
    )
    try:
        fault = fault_point(rank)
        with SequenceParallel.init_from_env(backend) as sp:
            state = setup(sp)
            results.put(("ready", rank, None))
            count = 0
            while True:
                job = jobs.get() if sp.is_writer() else None
                job = sp.broadcast_object(job)
                if job is None:
                    break
                count += 1
                sp.forwards = 0
                sp.kill_at_forward = fault[1] if fault is not None and fault[0] == count else None
                out = handle(sp, state, job)
                if sp.is_writer():
                    results.put(("done", rank, out))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
        raise


class ShotWorker:
    """N processes (one per GPU) started once; every job runs on all of them with N-way SP.

    setup(sp) -> state builds the resident models on each rank (e.g. load the DiT on sp.device and
    `sp.attach` it); handle(sp, state, job) runs one job record (a small picklable dict, e.g. a
    `ShotJob` dict) on every rank and must write outputs only where `sp.is_writer()`; rank 0's
    return value is what `run` returns. Both must be importable module-level functions (spawn).
    devices: CUDA ordinals per rank (default 0..N-1 of the visible devices).
    """

    def __init__(
        self,
        world_size: int,
        setup: Setup,
        handle: Handler,
        *,
        backend: str | None = None,
        devices: Sequence[int] | None = None,
        start_timeout_s: float = 1800.0,
    ):
        if world_size < 1:
            raise ValueError(f"ShotWorker: world_size must be >= 1, got {world_size}")
        if devices is not None and len(devices) != world_size:
            raise ValueError(f"ShotWorker: {len(devices)} devices for {world_size} ranks")
        self.world_size = world_size
        self._args = (backend, None if devices is None else tuple(devices), setup, handle)
        self._start_timeout_s = start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._jobs = None
        self._results = None
        self._procs = None

    def start(self) -> ShotWorker:
        """Spawn the ranks and wait until every rank has built its models."""
        if self._procs is not None:
            raise RuntimeError("ShotWorker.start: already started")
        self._jobs, self._results = self._ctx.Queue(), self._ctx.Queue()
        self._procs = mp.start_processes(
            _rank_main,
            args=(self.world_size, free_port(), *self._args, self._jobs, self._results),
            nprocs=self.world_size,
            join=False,
            start_method="spawn",
        )
        ready = 0
        while ready < self.world_size:
            kind, rank, payload = self._next_result(self._start_timeout_s, "starting")
            if kind != "ready":
                raise self._fail(f"rank {rank} reported {kind!r} before ready", rank)
            ready += 1
        return self

    @property
    def alive(self) -> bool:
        """Started and every rank process still running (a rank may die between jobs, e.g. OOM-killed)."""
        return self._procs is not None and all(p.is_alive() for p in self._procs.processes)

    @property
    def pids(self) -> tuple[int, ...]:
        """The rank processes' ids, rank 0 first (empty when not started)."""
        return () if self._procs is None else tuple(p.pid for p in self._procs.processes)

    def run(self, job: dict, timeout_s: float | None = None) -> Any:
        """Run one job on all ranks; returns rank 0's result (raises ShotWorkerError if a rank fails)."""
        if self._procs is None:
            raise RuntimeError("ShotWorker.run: not started")
        if job is None:
            raise ValueError("ShotWorker.run: job must not be None (None ends the worker)")
        self._jobs.put(job)
        kind, rank, payload = self._next_result(timeout_s, "running a job")
        if kind != "done":
            raise self._fail(f"rank {rank} reported {kind!r} while running a job", rank)
        return payload

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the ranks to finish and join them (those that do not exit in time are terminated, then
        killed): no rank process outlives this call."""
        if self._procs is None:
            return
        procs, self._procs = self._procs, None
        if all(p.is_alive() for p in procs.processes):  # else the others cannot finish without the dead one
            self._jobs.put(None)
            for p in procs.processes:
                p.join(timeout_s)
        for stop in ("terminate", "kill"):
            for p in procs.processes:
                if p.is_alive():
                    getattr(p, stop)()
                    p.join(5)
        for q in (self._jobs, self._results):
            q.cancel_join_thread()  # a job no rank read must not block this process's exit
            q.close()

    def _next_result(self, timeout_s: float | None, doing: str) -> tuple[str, int, Any]:
        """Next message from the ranks; raises if one reports an error or a rank dies silently."""
        waited = 0.0
        while True:
            try:
                kind, rank, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                waited += 1.0
                if any(not p.is_alive() for p in self._procs.processes):
                    raise self._dead(None, "", doing) from None
                if timeout_s is not None and waited >= timeout_s:
                    raise self._fail(f"no answer within {timeout_s:.0f} s while {doing}", None) from None
                continue
            if kind == "error":
                raise self._dead(rank, payload, doing)
            return kind, rank, payload

    def _dead(self, reporter: int | None, trace: str, doing: str) -> ShotWorkerError:
        """The error for a failed rank: one killed by a signal (its peers then fail in their collectives
        and report that) is named first, else the rank that reported, else the one that exited."""
        procs = self._procs.processes
        deadline = time.monotonic() + 2.0  # the reporter exits right after its report; by then a rank
        while reporter is not None and procs[reporter].exitcode is None and time.monotonic() < deadline:
            time.sleep(0.02)  # killed before it shows its exit code
        codes = [p.exitcode for p in procs]
        killed = [r for r, c in enumerate(codes) if c is not None and c < 0]
        if killed:
            r = killed[0]
            message = f"rank {r} (pid {procs[r].pid}) was killed by {_signal_name(-codes[r])} while {doing}"
            if reporter is not None and reporter != r:
                message += f"; rank {reporter} then failed: {_last_line(trace)}"
            return self._fail(message, r, trace)
        if reporter is not None:
            return self._fail(f"rank {reporter} failed while {doing}: {_last_line(trace)}", reporter, trace)
        r = next(r for r, c in enumerate(codes) if c is not None)
        return self._fail(f"rank {r} (pid {procs[r].pid}) exited with code {codes[r]} while {doing}", r)

    def _fail(self, message: str, rank: int | None, details: str = "") -> ShotWorkerError:
        if details:
            logger.error("ShotWorker: %s; the traceback a rank sent:\n%s", message, details)
        self.close(timeout_s=1.0)  # ranks blocked in a collective with the failed one never finish
        return ShotWorkerError(f"ShotWorker ({self.world_size} ranks): {message}", rank, details)

    def __enter__(self) -> ShotWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
