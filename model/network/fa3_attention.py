"""FlashAttention-3 forward kernels on Hopper (PyPI `fa3-fwd`): the `fa3_fp8` and `fa3` attention backends.

`fa3-fwd` 0.0.3 is a third-party build of FlashAttention-3's forward (Dao-AILab/flash-attention `hopper/`,
BSD-3-Clause upstream; the wheel's classifier says Apache-2.0 and it ships no licence file): sm90 kernels
for bf16 and fp8 e4m3, dense and varlen, built against CUDA 13 and torch's stable C ABI (cp39-abi3). It is
optional (`pip install fa3-fwd==0.0.3` on a CUDA 13 torch >= 2.10); without it these backends refuse at load.

fp8 self-attention (keys >= FP8_MIN_KEYS): as `cudnn_fp8`, k and v lose their mean over the keys first
(softmax is shift-invariant per query; the output is a convex combination of v's rows, so the mean is
added back), then q, k, v are quantized to e4m3 with one scale per (sample, head): FA3 takes per-head
descales, a finer grid than cuDNN's one scale per tensor. FA3 writes bf16 (cuDNN's Hopper fp8 kernel
writes e4m3), so the output loses no precision on the way out. Cross-attention runs FA3's bf16 kernel.

With a `model.network.sparse_attention.WindowPlan` active (a lossy opt-in) the fp8 self-attention runs FA3's
varlen kernel over the plan's query groups and gathered keys instead of the dense kernel.
"""

from __future__ import annotations

import functools

import torch

from model.network.cudnn_attention import FP8, FP8_MAX, FP8_MIN_KEYS
from model.network.sparse_attention import active_plan


@functools.cache
def _interface():
    try:
        import fa3_fwd_interface  # optional dependency: PyPI fa3-fwd (sm90, CUDA 13 torch)
    except (ImportError, OSError) as exc:
        raise RuntimeError(f"attention backend 'fa3'/'fa3_fp8' needs the fa3-fwd package: {exc}") from exc
    return fa3_fwd_interface


def available(device: torch.device | None = None) -> bool:
    """True where FA3 runs: a Hopper (sm90) CUDA device and `fa3-fwd` importable."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(device) != (9, 0):
        return False
    try:
        _interface()
    except RuntimeError:
        return False
    return True


def _forward(q, k, v, scale, descales=(None, None, None), varlen=None) -> torch.Tensor:
    """FA3 forward. q (B, Lq, H, D), k/v (B, Lk, H, D) (or packed (N, H, D) with `varlen`) -> like q, bf16."""
    cu_q, cu_k, max_q, max_k = varlen if varlen is not None else (None, None, None, None)
    out, *_ = _interface()._flash_attn_forward(
        q, k, v, None, None, None, None,  # k_new, v_new, qv, out
        cu_q, cu_k, None, None, None, max_q, max_k,  # cu_seqlens q/k/k_new, seqused q/k, max seqlens
        None, None, None, None, None, None,  # page_table, kv_batch_idx, leftpad_k, rotary cos/sin/seqlens
        *descales, scale,
    )  # fmt: skip
    return out


def quantize_per_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, L, H, D) -> (e4m3 x, descale (B, H) float32): one scale per sample and head (amax -> 448)."""
    amax = x.abs().amax(dim=(1, 3)).float().clamp(min=1e-6)  # (B, H)
    xq = (x.float() * (FP8_MAX / amax)[:, None, :, None]).to(FP8)
    return xq, amax / FP8_MAX


@torch.library.custom_op("dubflow::fa3_fp8", mutates_args=())
def fa3_fp8_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """e4m3 q/k/v (B, L, H, D) with descales (B, H) -> bf16 (B, Lq, H, D); the active window plan, if any."""
    plan = active_plan(k.shape[1])
    if plan is None:
        return _forward(q, k, v, scale, (dq, dk, dv))
    b, n, h, d = q.shape
    if plan.batch != b:
        raise ValueError(f"window plan made for batch {plan.batch}, attention batch is {b}")
    qf, kf, vf = (t.reshape(b * n, h, t.shape[-1]) for t in (q, k, v))  # (B*L, H, D)
    ks, vs = kf.index_select(0, plan.key_index), vf.index_select(0, plan.key_index)  # (K_total, H, D)
    # varlen descales are per sequence (group); one sample's scale repeats over its groups
    groups = (plan.cu_q.numel() - 1) // b
    dq, dk, dv = (x.repeat_interleave(groups, dim=0) for x in (dq, dk, dv))  # (B*G, H)
    out = _forward(qf, ks, vs, scale, (dq, dk, dv), (plan.cu_q, plan.cu_k, plan.max_q, plan.max_k))
    return out.reshape(b, n, h, -1)


@fa3_fp8_op.register_fake
def _(q, k, v, dq, dk, dv, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.bfloat16)


def sdpa_fp8(q, k, v, mask, scale):
    """The `fa3_fp8` backend (q/k/v (B, H, L, D) views of (B, L, H, D) tensors): fp8 self-attention,
    bf16 FA3 for short key sets (cross-attention)."""
    if mask is not None:
        raise ValueError("attention backend 'fa3_fp8' takes no mask")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, L, H, D)
    if kt.shape[1] < FP8_MIN_KEYS:
        return _forward(qt, kt, vt, scale).transpose(1, 2)
    k_mean = kt.float().mean(dim=1, keepdim=True)  # (B, 1, H, D)
    v_mean = vt.float().mean(dim=1, keepdim=True)
    (q8, dq), (k8, dk), (v8, dv) = (
        quantize_per_head(qt),
        quantize_per_head(kt - k_mean),
        quantize_per_head(vt - v_mean),
    )
    out = fa3_fp8_op(q8, k8, v8, dq, dk, dv, scale)  # (B, L, H, D) bf16
    return (out.float() + v_mean).to(q.dtype).transpose(1, 2)


def sdpa_bf16(q, k, v, mask, scale):
    """The `fa3` backend: FA3's bf16 kernel (no mask)."""
    if mask is not None:
        raise ValueError("attention backend 'fa3' takes no mask")
    return _forward(*(x.transpose(1, 2) for x in (q, k, v)), scale).transpose(1, 2)
