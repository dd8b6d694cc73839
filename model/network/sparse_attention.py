"""Static frame-window self-attention (lossy, opt-in): each query frame sees a temporal band plus a sink.

The DiT's self-attention tokens are ordered (latent frame, row, column), `frame_tokens` per latent frame.
Queries are taken in groups of `group` consecutive latent frames; a group [a, b) attends to the keys of
latent frame 0 (the sink: the reference / motion frame every frame is anchored to) and of the frames
[a - window, b + window). With `window >= frames` every group sees every key, i.e. dense attention.

Why this shape: it is what a varlen attention kernel runs without a mask (queries of a group are
contiguous; each group's keys are gathered once per call), so FlashAttention-3's fp8 varlen kernel
(`model.network.fa3_attention`) runs it at its dense rate on the kept fraction (`WindowPlan.density`). No spatial
narrowing (Radial Attention's) is done: that needs a block-sparse kernel, and none with fp8 runs on sm90.

The plan is made by the DiT per forward (`window_plan`, only on the sampling steps the settings allow:
`SparseSettings.dense_steps` first steps stay dense; the step comes from `model.sampling.step`) and made active for the block loop with
`window_scope`; the kernels read it with `active_plan` inside their opaque ops, so a compiled block
serves dense and windowed steps alike. `grouped_attention` is the device-independent path (gathered keys,
any SDPA kernel): the CPU's, and the reference the fp8 kernel is checked against.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class SparseSettings:
    """`infinitetalk.sparse_window` and friends: None window = dense (the default)."""

    window: int  # latent frames each side of a query group
    group: int = 3  # query latent frames per group (one gather of keys per group)
    dense_steps: int = 1  # the first sampling steps of a chunk run dense

    def __post_init__(self) -> None:
        if self.window < 0 or self.group < 1 or self.dense_steps < 0:
            raise ValueError(f"sparse attention: window >= 0, group >= 1, dense_steps >= 0, got {self}")


@dataclass(frozen=True)
class WindowPlan:
    """One grid's windowed self-attention: query groups and the gathered key indices, per batch sample."""

    frames: int
    frame_tokens: int
    window: int
    group: int
    batch: int
    key_index: torch.Tensor  # (K_total,) int64: token indices into the flattened (B * L) keys, group by group
    cu_q: torch.Tensor  # (G * B + 1,) int32 cumulative query lengths
    cu_k: torch.Tensor  # (G * B + 1,) int32 cumulative gathered-key lengths
    max_q: int
    max_k: int
    spans: tuple[tuple[int, int, tuple[int, ...]], ...]  # per group: query frames [a, b) and its key frames

    @property
    def tokens(self) -> int:
        return self.frames * self.frame_tokens

    @property
    def density(self) -> float:
        """Kept fraction of the dense attention's query-key pairs."""
        kept = sum((b - a) * len(keys) for a, b, keys in self.spans)
        return kept / (self.frames * self.frames)


def key_frames(a: int, b: int, frames: int, window: int) -> tuple[int, ...]:
    """Key latent frames of the query frames [a, b): frame 0 plus [a - window, b + window), in order."""
    band = range(max(0, a - window), min(frames, b + window))
    return tuple(sorted({0, *band}))


def window_plan(
    frames: int,
    frame_tokens: int,
    settings: SparseSettings,
    *,
    batch: int = 1,
    device: torch.device | str = "cpu",
) -> WindowPlan:
    """The plan of a (frames x frame_tokens)-token self-attention with `batch` samples."""
    spans = []
    for a in range(0, frames, settings.group):
        b = min(frames, a + settings.group)
        spans.append((a, b, key_frames(a, b, frames, settings.window)))
    tokens = frames * frame_tokens
    per_frame = torch.arange(frame_tokens)  # (T0,)
    pieces, q_lens, k_lens = [], [], []
    for sample in range(batch):
        for a, b, keys in spans:
            index = torch.cat([f * frame_tokens + per_frame for f in keys]) + sample * tokens  # (K_g,)
            pieces.append(index)
            q_lens.append((b - a) * frame_tokens)
            k_lens.append(index.numel())

    def cumulative(lengths: list[int]) -> torch.Tensor:
        return F.pad(torch.tensor(lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0)).to(device)

    return WindowPlan(
        frames=frames, frame_tokens=frame_tokens, window=settings.window, group=settings.group, batch=batch,
        key_index=torch.cat(pieces).to(device), cu_q=cumulative(q_lens), cu_k=cumulative(k_lens),
        max_q=max(q_lens), max_k=max(k_lens), spans=tuple(spans),
    )  # fmt: skip


def window_mask(plan: WindowPlan) -> torch.Tensor:
    """The plan as a boolean (L, L) mask, True = attend (tests and kept-mass figures; small grids only)."""
    frame_mask = torch.zeros(plan.frames, plan.frames, dtype=torch.bool)  # (F_q, F_k)
    for a, b, keys in plan.spans:
        frame_mask[a:b, list(keys)] = True
    t0 = plan.frame_tokens
    return frame_mask.repeat_interleave(t0, 0).repeat_interleave(t0, 1)  # (L, L)


def kept_mass(q: torch.Tensor, k: torch.Tensor, plan: WindowPlan, scale: float) -> torch.Tensor:
    """Per query, the dense softmax's probability mass inside the plan's window. q, k (B, L, H, D) -> (B, H, L)."""
    logits = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale  # (B, H, L, L)
    probs = logits.softmax(-1)
    return (probs * window_mask(plan).to(probs.device)).sum(-1)


_ACTIVE: contextvars.ContextVar[WindowPlan | None] = contextvars.ContextVar(
    "dubflow_window_plan", default=None
)


@contextlib.contextmanager
def window_scope(plan: WindowPlan | None) -> Iterator[None]:
    """Make `plan` the self-attention window of the calls inside the scope (None: dense)."""
    token = _ACTIVE.set(plan)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_plan(key_tokens: int) -> WindowPlan | None:
    """The active plan if it covers a self-attention over `key_tokens` keys (cross-attention: None)."""
    plan = _ACTIVE.get()
    return plan if plan is not None and plan.tokens == key_tokens else None


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: WindowPlan, scale: float
) -> torch.Tensor:
    """Windowed attention by gathered keys and one SDPA per group. q/k/v (B, L, H, D) -> (B, L, H, D)."""
    b, n, h, d = q.shape
    qf, kf, vf = (t.reshape(b * n, h, t.shape[-1]) for t in (q, k, v))  # (B*L, H, D)
    ks, vs = kf.index_select(0, plan.key_index), vf.index_select(0, plan.key_index)  # (K_total, H, D)
    cu_q, cu_k = plan.cu_q.tolist(), plan.cu_k.tolist()
    out = torch.empty_like(qf if v.shape[-1] == d else qf.new_empty(b * n, h, v.shape[-1]))
    for i in range(len(cu_q) - 1):
        qs = qf[cu_q[i] : cu_q[i + 1]].transpose(0, 1)  # (H, Lq_g, D)
        kg, vg = (t[cu_k[i] : cu_k[i + 1]].transpose(0, 1) for t in (ks, vs))  # (H, Lk_g, D)
        out[cu_q[i] : cu_q[i + 1]] = F.scaled_dot_product_attention(qs, kg, vg, scale=scale).transpose(0, 1)
    return out.reshape(b, n, h, -1)
