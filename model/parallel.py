"""Sequence parallelism for the DiT over torch.distributed, and a worker that keeps N ranks resident.

Layout (Ulysses). Ranks own whole latent frames: the F latent frames are split into contiguous,
balanced shares (21 frames on 4 ranks: 6, 5, 5, 5), so every token-local step (norms, FFN,
text/CLIP cross-attention, and the per-frame audio cross-attention) runs on the rank's own tokens
without communication. Self-attention needs the whole sequence: one all-to-all turns the rank's
(tokens, all heads) q/k/v into (all tokens, its share of heads), attention runs, and a second
all-to-all turns the result back. Head shares may be uneven (40 heads on 3 ranks: 14, 13, 13);
counts that divide balance best (40 heads: 2, 4, 5 or 8 ranks). RoPE tables are sliced at each
token's global position, so rotated q/k are identical to the single-process ones.

Two speakers: the reference map of every token is its attention to the tokens of latent frame 0
(rank 0's first frame), so rank 0 broadcasts the rotated frame-0 keys; the min/max normalisation of
the map runs over all tokens, so the per-rank extrema are all-reduced. The argmax and the 1D RoPE
positions stay per token. The head output is gathered so every rank holds the same full velocity:
the sampler runs unchanged on every rank with identical latents, and only the writer decodes
(`RankZeroCodec`) and writes.

With fewer latent frames than ranks a call runs replicated (every rank computes everything).

`ShotWorker` starts N processes once per pool worker (one GPU each), builds the models once per
rank, and then runs shot jobs: rank 0 takes each job record from the parent and broadcasts it, all
ranks run the handler, rank 0 returns the result. A rank that fails (an exception, or killed by a
signal, e.g. the OOM killer) fails the job with a one-line `ShotWorkerError` naming that rank; the
worker then stops all its ranks and must be started again. Test hook, inert unless set: the environment
variable DUBFLOW_SP_FAULT="RANK:JOB:FORWARD", present when the ranks start, makes rank RANK SIGKILL itself
at the start of the FORWARD-th DiT forward of its JOB-th job (both counted from 1 since its setup), so a
test can kill a rank mid-chunk deterministically.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

from model.attention import attention

logger = logging.getLogger(__name__)

FAULT_ENV = "DUBFLOW_SP_FAULT"  # test hook, see the module docstring


def balanced_shares(total: int, parts: int) -> tuple[int, ...]:
    """Split `total` items into `parts` contiguous shares differing by at most one (larger first)."""
    if parts < 1:
        raise ValueError(f"balanced_shares: parts must be >= 1, got {parts}")
    base, extra = divmod(total, parts)
    return tuple(base + (i < extra) for i in range(parts))


# ----------------------------------------------------------------------------------------------
# Per-call token shards: what the DiT calls at its communication points
# ----------------------------------------------------------------------------------------------


class TokenShard:
    """The communication hook of one DiT forward; this base class is the single-process identity.

    Token tensors are (B, L, ...) with tokens in (frame, row, column) order; a shard owns the
    contiguous tokens of its latent frames.
    """

    world_size = 1

    def frames(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's latent frames of x along `dim` (x covers all frames)."""
        return x

    def tokens(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's tokens of x along `dim` (x covers all tokens)."""
        return x

    def self_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
        """Attention of this rank's queries over the keys of all ranks. (B, L_r, H, D) each -> (B, L_r, H, D)."""
        return attention(q, k, v, backend=backend)

    def first_frame(self, x: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        """The tokens of latent frame 0 (B, L_r, ...) -> (B, frame_tokens, ...), on every rank."""
        return x[:, :frame_tokens]

    def extrema(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Min and max of x (..., L_r) over the token axis of all ranks -> two (..., 1)."""
        return x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)

    def gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L_r, C) on each rank -> (B, L, C), the same on every rank."""
        return x

    def agree(self, flag: bool) -> bool:
        """A host-side decision taken identically on every rank (rank 0's value wins)."""
        return flag


LOCAL_SHARD = TokenShard()


class UlyssesShard(TokenShard):
    """The shard of one rank for one token grid: whole latent frames, Ulysses self-attention."""

    def __init__(self, sp: SequenceParallel, frames: int, frame_tokens: int):
        self.group = sp.group if sp.group is not None else dist.group.WORLD
        self.rank = sp.rank
        self.world_size = sp.world_size
        self.src = sp.writer_global_rank
        shares = balanced_shares(frames, sp.world_size)
        self.frame_start = sum(shares[: sp.rank])
        self.frame_stop = self.frame_start + shares[sp.rank]
        self.token_counts = [n * frame_tokens for n in shares]  # tokens per rank
        self.token_start = self.frame_start * frame_tokens
        self.token_stop = self.frame_stop * frame_tokens
        self.frame_tokens = frame_tokens

    def frames(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return x.narrow(dim, self.frame_start, self.frame_stop - self.frame_start)

    def tokens(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        return x.narrow(dim, self.token_start, self.token_stop - self.token_start)

    def self_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
        b, n, h, d = q.shape
        heads = balanced_shares(h, self.world_size)
        if heads[-1] == 0:
            raise ValueError(f"sequence parallel: {h} heads cannot be split over {self.world_size} ranks")
        mine = heads[self.rank]
        # 1. (tokens, all heads) -> (all tokens, my heads): send rank j (n, 3, B, h_j, D) of q/k/v
        send = q.new_empty(n * 3 * b * h * d)
        offset = 0
        for j, hj in enumerate(heads):
            h0 = sum(heads[:j])
            part = send[offset : offset + n * 3 * b * hj * d].view(n, 3, b, hj, d)
            for i, x in enumerate((q, k, v)):
                part[:, i].copy_(x[:, :, h0 : h0 + hj].transpose(0, 1))  # (n, B, h_j, D)
            offset += part.numel()
        recv = self._all_to_all(
            send,
            out_sizes=[m * 3 * b * mine * d for m in self.token_counts],
            in_sizes=[n * 3 * b * hj * d for hj in heads],
        )
        full = recv.view(-1, 3, b, mine, d)  # (L, 3, B, h_r, D)
        qf, kf, vf = (full[:, i].transpose(0, 1) for i in range(3))  # (B, L, h_r, D) each
        out = attention(qf, kf, vf, backend=backend)  # (B, L, h_r, D)

        # 2. (all tokens, my heads) -> (my tokens, all heads): send rank j its tokens (n_j, B, h_r, D)
        back = self._all_to_all(
            out.transpose(0, 1).contiguous().view(-1),
            out_sizes=[n * b * hi * d for hi in heads],
            in_sizes=[m * b * mine * d for m in self.token_counts],
        )
        result = q.new_empty(b, n, h, d)
        offset = 0
        for i, hi in enumerate(heads):
            h0 = sum(heads[:i])
            chunk = back[offset : offset + n * b * hi * d].view(n, b, hi, d)
            result[:, :, h0 : h0 + hi] = chunk.transpose(0, 1)
            offset += chunk.numel()
        return result  # (B, n, H, D)

    def first_frame(self, x: torch.Tensor, frame_tokens: int) -> torch.Tensor:
        if frame_tokens != self.frame_tokens:
            raise ValueError(
                f"first_frame: {frame_tokens} tokens per frame, shard was built for {self.frame_tokens}"
            )
        if self.rank == 0:
            frame = x[:, :frame_tokens].contiguous()
        else:
            frame = x.new_empty(x.shape[0], frame_tokens, *x.shape[2:])
        return _wait(funcol.broadcast(frame, 0, self.group))  # functional ops take group ranks

    def extrema(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = torch.cat([x.amax(-1, keepdim=True), -x.amin(-1, keepdim=True)], dim=-1)  # (..., 2)
        both = _wait(funcol.all_reduce(both, "max", self.group))
        return -both[..., 1:], both[..., :1]

    def gather_tokens(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        rest = x.shape[2:]
        width = math.prod(rest)
        local = x.transpose(0, 1).reshape(-1)  # (n, B, ...) flat
        out = self._all_to_all(
            local.repeat(self.world_size),  # the same block to every rank
            out_sizes=[m * b * width for m in self.token_counts],
            in_sizes=[local.numel()] * self.world_size,
        )
        return out.view(-1, b, *rest).transpose(0, 1).contiguous()  # (B, L, ...)

    def agree(self, flag: bool) -> bool:
        device = torch.device("cuda", torch.cuda.current_device()) if _uses_cuda(self.group) else None
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.broadcast(value, self.src, group=self.group)
        return bool(value.item())  # host sync: TeaCache decisions are host-side already

    def _all_to_all(self, x: torch.Tensor, out_sizes: list[int], in_sizes: list[int]) -> torch.Tensor:
        return _wait(funcol.all_to_all_single(x, out_sizes, in_sizes, self.group))


def _wait(x: torch.Tensor) -> torch.Tensor:
    """Finish a functional collective (eager: waits; compiled: a graph node)."""
    return funcol.wait_tensor(x)


def _uses_cuda(group: dist.ProcessGroup | None) -> bool:
    return dist.get_backend(group) == "nccl"


# ----------------------------------------------------------------------------------------------
# The process-level object
# ----------------------------------------------------------------------------------------------


class SequenceParallel:
    """This process's place in a sequence-parallel group (world 1 = single process).

    Attach it to the DiT (`sp.attach(model)`); every forward then splits its tokens over the group.
    Usable as a context manager: leaving it destroys a process group it created.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        device: torch.device | str = "cpu",
        owns_group: bool = False,
    ):
        self.group = group
        self.device = torch.device(device)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.writer_global_rank = dist.get_global_rank(group, 0) if self.distributed and group else 0
        self._owns_group = owns_group
        self._shards: dict[tuple[int, int], TokenShard] = {}  # per-grid shards of this run
        self.forwards = 0  # DiT forwards (calls of `shard`) since the current job began
        self.kill_at_forward: int | None = None  # the DUBFLOW_SP_FAULT test hook of this job; None = off

    @classmethod
    def init_from_env(cls, backend: str | None = None, *, timeout_s: float = 1800.0) -> SequenceParallel:
        """Join the group described by torchrun-style env (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

        No WORLD_SIZE (or 1) gives a single-process object. Backend default: nccl with CUDA
        (rank r uses cuda:LOCAL_RANK), else gloo on CPU.
        """
        world = int(os.environ.get("WORLD_SIZE", "1"))
        use_cuda = torch.cuda.is_available() if backend is None else backend == "nccl"
        backend = backend or ("nccl" if use_cuda else "gloo")
        if world == 1 and not dist.is_initialized():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            return cls(device=torch.device("cuda", local) if use_cuda else "cpu")
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing and not dist.is_initialized():
            raise RuntimeError(f"SequenceParallel.init_from_env: WORLD_SIZE={world} but {missing} not set")
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
        device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        owns = False
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=timeout_s),
                device_id=device if device.type == "cuda" else None,
            )
            owns = True
        return cls(None, device=device, owns_group=owns)

    def is_writer(self) -> bool:
        """True on the rank that decodes and writes (rank 0 of the group)."""
        return self.rank == 0

    def attach(self, model: torch.nn.Module) -> torch.nn.Module:
        """Set this object as the model's communication hook (checks the head split)."""
        heads = model.config.num_heads
        if self.world_size > heads:
            raise ValueError(f"sequence parallel: {self.world_size} ranks > {heads} attention heads")
        if heads % self.world_size:
            logger.warning("%d heads over %d ranks: uneven head shares", heads, self.world_size)
        model.sp = self
        return model

    def shard(self, grid: tuple[int, int, int]) -> TokenShard:
        """The hook for one forward on a (frames, rows, columns) token grid."""
        self.forwards += 1
        if self.kill_at_forward == self.forwards:  # test hook: die as an OOM-killed rank dies, mid-chunk
            logger.warning("%s: rank %d kills itself at DiT forward %d", FAULT_ENV, self.rank, self.forwards)
            os.kill(os.getpid(), signal.SIGKILL)
        frames, rows, cols = grid
        if self.world_size == 1 or frames < self.world_size:
            return LOCAL_SHARD  # too few frames to split: every rank computes everything
        key = (frames, rows * cols)
        shard = self._shards.get(key)
        if shard is None:
            shard = self._shards[key] = UlyssesShard(self, frames, rows * cols)
        return shard

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's picklable object on every rank (host-side; job records, shapes)."""
        if self.world_size == 1:
            return obj
        box = [obj if self.is_writer() else None]
        dist.broadcast_object_list(box, src=self.writer_global_rank, group=self.group)
        return box[0]

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's tensor (in place into x on the other ranks)."""
        if self.world_size > 1:
            dist.broadcast(x, self.writer_global_rank, group=self.group)
        return x

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Destroy the process group if this object created it."""
        self._shards.clear()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def __enter__(self) -> SequenceParallel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SequenceParallel(rank={self.rank}, world_size={self.world_size}, device={self.device})"


# ----------------------------------------------------------------------------------------------
# VAE on the writer only
# ----------------------------------------------------------------------------------------------


class LatentCodec(Protocol):
    def encode(self, video: torch.Tensor) -> torch.Tensor: ...

    def decode(self, latent: torch.Tensor) -> torch.Tensor: ...


class RankZeroCodec:
    """The sampler's VAE under sequence parallelism: rank 0 encodes/decodes, the others receive.

    The sampler needs the decoded video on every rank (motion frames of the next chunk, colour
    correction), so the writer's result is broadcast; running the VAE replicated would take the same
    wall time but could leave the ranks' latents a rounding apart. `vae` may be None off rank 0.
    """

    def __init__(self, sp: SequenceParallel, vae: LatentCodec | None):
        if sp.is_writer() and vae is None:
            raise ValueError("RankZeroCodec: the writer rank needs the VAE")
        self.sp = sp
        self.vae = vae

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return self._run("encode", video)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        return self._run("decode", latent)

    def _run(self, method: str, x: torch.Tensor) -> torch.Tensor:
        if self.sp.world_size == 1:
            return getattr(self.vae, method)(x)
        out = getattr(self.vae, method)(x).contiguous() if self.sp.is_writer() else None
        meta = self.sp.broadcast_object(None if out is None else (tuple(out.shape), str(out.dtype)))
        if out is None:
            shape, dtype = meta
            out = torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device=x.device)
        return self.sp.broadcast(out)


# ----------------------------------------------------------------------------------------------
# A pool worker owning N GPUs
# ----------------------------------------------------------------------------------------------

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
