"""One attention entry point for every DiT attention, with named backends.

Layout in and out is (B, L, H, D) (tokens before heads, as the Wan code keeps it). SDPA is the
reference backend; the `sdpa_*` variants pin one SDPA kernel (flash / cuDNN / memory-efficient / math)
through `torch.nn.attention.sdpa_kernel`, `auto` (the DiT default) lets SDPA pick by the priority
cuDNN > flash > efficient > math (cuDNN is the fastest on Hopper), and `reference` is the readable float32 softmax path used to
check the others. `cudnn` and `cudnn_fp8` run the cuDNN frontend's inference graphs
(`model.network.cudnn_attention`; CUDA only, fp8 on Hopper): their built graphs live in the runner that
`attention_context` is given. `fa3` and `fa3_fp8` run FlashAttention-3's bf16 / fp8 kernels
(`model.network.fa3_attention`; Hopper, optional `fa3-fwd` package); `fa3_fp8` also runs the frame-window plan of
`model.network.sparse_attention` when one is active, and `window_sdpa` is that plan on any device (SDPA per query
group; dense when no plan is active). Further kernels register themselves with `register_attention_backend`.

The official InfiniteTalk code attends to the full zero-padded text context (its `context_lens` is
None), so the DiT passes no mask; `k_lens` exists for callers that do want key-length masking.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from model.network import cudnn_attention, fa3_attention
from model.network.sparse_attention import active_plan, grouped_attention

# A backend takes q, k, v in (B, H, L, D) layout, an optional boolean mask broadcastable to
# (B, H, Lq, Lk) (True = attend) and the softmax scale; it returns (B, H, Lq, Dv).
AttentionBackend = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor
]

_BACKENDS: dict[str, AttentionBackend] = {}


def register_attention_backend(name: str) -> Callable[[AttentionBackend], AttentionBackend]:
    """Decorator adding a backend under `name` (import-time registration only)."""

    def wrap(fn: AttentionBackend) -> AttentionBackend:
        if name in _BACKENDS:
            raise ValueError(f"attention backend {name!r} is already registered")
        _BACKENDS[name] = fn
        return fn

    return wrap


def attention_backends() -> tuple[str, ...]:
    """Names of the registered backends."""
    return tuple(sorted(_BACKENDS))


@register_attention_backend("sdpa")
def _sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _pinned_sdpa(kernel: SDPBackend) -> AttentionBackend:
    def run(q, k, v, mask, scale):
        with sdpa_kernel(kernel):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    return run


register_attention_backend("sdpa_flash")(_pinned_sdpa(SDPBackend.FLASH_ATTENTION))
register_attention_backend("sdpa_cudnn")(_pinned_sdpa(SDPBackend.CUDNN_ATTENTION))
register_attention_backend("sdpa_efficient")(_pinned_sdpa(SDPBackend.EFFICIENT_ATTENTION))
register_attention_backend("sdpa_math")(_pinned_sdpa(SDPBackend.MATH))

# Fastest SDPA kernel first on Hopper: cuDNN (~570 TFLOP/s at the 480P self-attention shape on an H200)
# before flash (~360); the others are fallbacks for shapes/dtypes those two reject (fp32, CPU).
_PRIORITY = [
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


@register_attention_backend("auto")
def _sdpa_auto(q, k, v, mask, scale):
    """SDPA with the kernel priority cuDNN > flash > memory-efficient > math (traceable by dynamo)."""
    with sdpa_kernel(_PRIORITY, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


register_attention_backend("cudnn")(cudnn_attention.sdpa_bf16)
register_attention_backend("cudnn_fp8")(cudnn_attention.sdpa_fp8)
register_attention_backend("fa3")(fa3_attention.sdpa_bf16)
register_attention_backend("fa3_fp8")(fa3_attention.sdpa_fp8)


@register_attention_backend("window_sdpa")
def _window_sdpa(q, k, v, mask, scale):
    """The active frame-window plan (`model.network.sparse_attention`) by gathered keys and SDPA per query group;
    plain SDPA where none covers these keys. Eager only (the plan is read at call time): CPU runs."""
    plan = active_plan(k.shape[-2])
    if plan is None or mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    out = grouped_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), plan, scale)
    return out.transpose(1, 2)  # (B, H, L, Dv)


def attention_context(
    backend: str, runner: cudnn_attention.CudnnAttention | None = None
) -> contextlib.AbstractContextManager:
    """Context for a region of attention calls (e.g. the DiT's block loop) under `backend`.

    For `auto` it sets the SDPA kernel priority around the whole region, so that `torch.compile`,
    which picks the SDPA kernel while it traces a compiled block, sees cuDNN first too. For the
    cuDNN frontend backends `runner` keeps the graphs built inside the region for the next one.
    """
    if backend == "auto":
        return sdpa_kernel(_PRIORITY, set_priority=True)
    if backend.startswith("cudnn"):
        return cudnn_attention.attention_scope(runner)
    return contextlib.nullcontext()


@register_attention_backend("reference")
def _reference(q, k, v, mask, scale):
    """softmax(q k^T * scale) v computed in float32, the readable definition."""
    scores = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v.float())  # (B, H, Lq, Dv)
    return out.to(v.dtype)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    backend: str = "sdpa",
    k_lens: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Multi-head attention. q (B, Lq, H, D), k (B, Lk, H, D), v (B, Lk, H, Dv) -> (B, Lq, H, Dv).

    q, k and v must share one dtype (bf16, fp16 or fp32; CPU or CUDA). `k_lens` (B,) masks keys at
    positions >= k_lens[b]. `scale` defaults to 1/sqrt(D).
    """
    try:
        fn = _BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown attention backend {backend!r}; known: {attention_backends()}") from None
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    mask = None
    if k_lens is not None:
        positions = torch.arange(k.shape[1], device=k.device)  # (Lk,)
        mask = (positions[None, :] < k_lens[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, scale)  # (B, H, Lq, Dv)
    return out.transpose(1, 2)  # (B, Lq, H, Dv)
