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

The pool worker that keeps N such ranks resident is `model.runtime.shot_worker.ShotWorker`; its test hook
(`FAULT_ENV`, read there) makes a rank kill itself at a given DiT forward, counted here.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from model.network.attention import attention

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
