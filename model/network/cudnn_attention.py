"""Fused attention through the cuDNN frontend graph API: bf16 and fp8 (Hopper) kernels.

Why not SDPA's cuDNN path: PyTorch builds its cuDNN attention graph for training (it always writes the
softmax statistics) and measured 567 TFLOP/s at the 480P self-attention shape on an H200, where the
inference graph built here skips the statistics. The fp8 graph takes e4m3 q/k/v with one scale per
tensor, quantizes the softmax probabilities inside the kernel and writes e4m3 in v's scale, which
`sdpa_fp8` turns back into bf16 (Hopper's kernel has no bf16 output: that is Blackwell-only). The
output is a convex combination of v's rows, so v's scale keeps it in range. (Hopper's fp8 kernel writes e4m3 only; the output
is a convex combination of v's rows, so v's scale keeps it in range and undoes it afterwards.)

Graphs are built once per (shapes, strides, dtype, scale, device) and kept by a `CudnnAttention`
object that the model owns; `attention_scope(runner)` makes it the one used by the calls inside the
scope (the DiT enters it around its block loop). Inside `torch.compile`d blocks the kernel is the
opaque custom op `dubflow::cudnn_sdpa`; the fp8 quantization of q/k/v (`quantize_fp8`) stays in torch
ops in front of it, so inductor fuses it into the qk-norm / RoPE kernels that produce q and k.

Needs a CUDA device and the `nvidia-cudnn-frontend` package (the `cuda` extra); the cuDNN library
itself is the one PyTorch ships.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value
# Softmax probabilities lie in [0, 1]; the kernel multiplies them by this before the e4m3 cast.
P_SCALE = 448.0
# Keys shorter than this stay bf16 on the fp8 path (cross-attention to text/CLIP/audio tokens is a
# fraction of a percent of the forward and fp8 would only add error there).
FP8_MIN_KEYS = 4096

_ACTIVE: contextvars.ContextVar[CudnnAttention | None] = contextvars.ContextVar(
    "dubflow_cudnn_attention", default=None
)


def _cudnn():
    try:
        import cudnn  # optional dependency, CUDA hosts only
    except ImportError as exc:
        raise RuntimeError(
            "attention backend 'cudnn'/'cudnn_fp8' needs the nvidia-cudnn-frontend package "
            "(pip install 'dubflow[cuda]')"
        ) from exc
    return cudnn


def available() -> bool:
    """True where the cuDNN frontend graphs can run: CUDA device and the frontend package importable."""
    if not torch.cuda.is_available():
        return False
    try:
        _cudnn()
    except RuntimeError:
        return False
    return True


def fp8_supported(device: torch.device | None = None) -> bool:
    """fp8 attention needs Hopper (sm90) or newer."""
    return available() and torch.cuda.get_device_capability(device) >= (9, 0)


@dataclass
class _Graph:
    graph: object
    q: object
    k: object
    v: object
    o: object
    workspace: torch.Tensor
    extras: dict  # frontend tensor -> device tensor (fp8 scales and amax outputs)
    descales: tuple  # frontend tensors of descale_q, descale_k, descale_v (fp8 only)
    plan: int | None = None  # autotuned plan index (None: the heuristics' first choice)
    plan_times: dict | None = None  # plan name -> measured seconds (autotune)


class CudnnAttention:
    """Owner of the built cuDNN attention graphs, one cuDNN handle per device; use one per model.

    `autotune`: build every plan the heuristics propose for a new graph and time each once on the
    first call's real inputs, then keep the fastest (like `torch.backends.cudnn.benchmark`).
    """

    def __init__(self, *, autotune: bool = False) -> None:
        self.autotune = autotune
        self._graphs: dict[tuple, _Graph] = {}
        self._handles: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self._graphs)

    def _handle(self, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._handles:
            with torch.cuda.device(index):
                self._handles[index] = _cudnn().create_handle()
        return self._handles[index]

    def _build(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, out_dtype) -> _Graph:
        cudnn = _cudnn()
        fp8 = q.dtype == FP8
        io = cudnn.data_type.FP8_E4M3 if fp8 else _cudnn_dtype(cudnn, q.dtype)
        handle = self._handle(q.device)
        graph = cudnn.pygraph(
            io_data_type=io,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        tq, tk, tv = (
            graph.tensor(dim=list(t.shape), stride=list(t.stride()), data_type=io) for t in (q, k, v)
        )
        extras: dict = {}
        descales: tuple = ()
        if fp8:

            def scalar(value: float | None):
                t = graph.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)
                if value is not None:
                    extras[t] = torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=q.device)
                return t

            descales = (scalar(None), scalar(None), scalar(None), scalar(None))  # q, k, v, scale_o
            o, _stats, amax_s, amax_o = graph.sdpa_fp8(
                q=tq,
                k=tk,
                v=tv,
                descale_q=descales[0],
                descale_k=descales[1],
                descale_v=descales[2],
                descale_s=scalar(1.0 / P_SCALE),
                scale_s=scalar(P_SCALE),
                scale_o=descales[3],
                generate_stats=False,
                attn_scale=scale,
            )
            for amax in (amax_s, amax_o):
                amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(
                    cudnn.data_type.FLOAT
                )
                extras[amax] = torch.empty((1, 1, 1, 1), dtype=torch.float32, device=q.device)
        else:
            o, _stats = graph.sdpa(q=tq, k=tk, v=tv, attn_scale=scale, generate_stats=False)
        b, h, lq, _ = q.shape
        dv = v.shape[-1]
        o.set_output(True).set_dim([b, h, lq, dv]).set_stride([lq * h * dv, dv, h * dv, 1]).set_data_type(
            _cudnn_dtype(cudnn, out_dtype)
        )
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        if self.autotune:
            graph.build_plans(cudnn.build_plan_policy.ALL)
            size = max(
                graph.get_workspace_size_plan_at_index(i) for i in range(graph.get_execution_plan_count())
            )
        else:
            graph.build_plans()
            size = graph.get_workspace_size()
        workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
        log.debug(
            "built cuDNN %s attention graph q%s k%s",
            "fp8" if fp8 else str(q.dtype),
            tuple(q.shape),
            tuple(k.shape),
        )
        return _Graph(graph, tq, tk, tv, o, workspace, extras, descales)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float,
        descale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """softmax(q k^T * scale) v for q (B, H, Lq, D), k/v (B, H, Lk, D) -> (B, H, Lq, Dv).

        bf16/fp16 inputs, or e4m3 inputs with `descale` (3,) float32 = 1/scale of q, k, v; the output
        is e4m3 in v's scale for fp8 inputs (multiply by descale[2]) and the input dtype otherwise,
        laid out (B, Lq, H, Dv) in memory.
        """
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        out_dtype = q.dtype
        key = (q.device, q.dtype, scale, *(tuple(t.shape) + tuple(t.stride()) for t in (q, k, v)))
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._build(q, k, v, scale, out_dtype)
        b, h, lq, _ = q.shape
        out = torch.empty((b, lq, h, v.shape[-1]), dtype=out_dtype, device=q.device).transpose(1, 2)
        pack = {entry.q: q, entry.k: k, entry.v: v, entry.o: out, **entry.extras}
        if entry.descales:
            if descale is None:
                raise ValueError("fp8 cuDNN attention needs the q/k/v descale factors")
            d = descale.to(torch.float32)
            d = torch.cat([d, 1.0 / d[2:]]).reshape(4, 1, 1, 1, 1)  # + scale_o = v's scale
            pack.update({t: d[i] for i, t in enumerate(entry.descales)})
        cudnn = _cudnn()
        handle = self._handle(q.device)
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(q.device).cuda_stream)
        if self.autotune and entry.plan is None:
            self._tune(entry, pack, handle)
        if entry.plan is None:
            entry.graph.execute(pack, entry.workspace, handle=handle)
        else:
            entry.graph.execute_plan_at_index(pack, entry.workspace, entry.plan, handle=handle)
        return out

    def _tune(self, entry: _Graph, pack: dict, handle) -> None:
        """Time every built plan twice on these inputs (host syncs: once per graph) and keep the fastest."""
        graph, times = entry.graph, {}
        for i in range(graph.get_execution_plan_count()):
            if graph.get_workspace_size_plan_at_index(i) > entry.workspace.numel():
                continue  # not built
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            try:
                graph.execute_plan_at_index(pack, entry.workspace, i, handle=handle)  # warm-up
                start.record()
                graph.execute_plan_at_index(pack, entry.workspace, i, handle=handle)
                end.record()
                end.synchronize()
            except Exception as exc:  # a plan that cannot run is just not a candidate
                log.debug("cuDNN attention plan %d failed: %s", i, exc)
                continue
            times[i] = start.elapsed_time(end) / 1e3
        if times:
            entry.plan = min(times, key=times.get)
            entry.plan_times = {graph.get_plan_name_at_index(i): t for i, t in times.items()}
            log.info(
                "cuDNN attention autotune: plan %s of %d",
                graph.get_plan_name_at_index(entry.plan),
                len(times),
            )


@contextlib.contextmanager
def attention_scope(runner: CudnnAttention | None) -> Iterator[None]:
    """Make `runner` the graph owner for the cuDNN attention calls inside the scope."""
    token = _ACTIVE.set(runner)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _runner() -> CudnnAttention:
    runner = _ACTIVE.get()
    if runner is None:  # a call outside any scope: correct, but builds its graph every time
        runner = CudnnAttention()
    return runner


def _cudnn_dtype(cudnn, dtype: torch.dtype):
    table = {
        torch.bfloat16: cudnn.data_type.BFLOAT16,
        torch.float16: cudnn.data_type.HALF,
        FP8: cudnn.data_type.FP8_E4M3,
    }
    if dtype not in table:
        raise ValueError(f"cuDNN attention takes bf16/fp16 (or fp8) tensors, got {dtype}")
    return table[dtype]


@torch.library.custom_op("dubflow::cudnn_sdpa", mutates_args=())
def cudnn_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, descale: torch.Tensor | None = None
) -> torch.Tensor:
    """The cuDNN attention kernel as an op `torch.compile` keeps opaque (see `CudnnAttention.__call__`)."""
    return _runner()(q, k, v, scale, descale)


@cudnn_sdpa.register_fake
def _(q, k, v, scale, descale=None):
    b, h, lq, _ = q.shape
    return q.new_empty((b, lq, h, v.shape[-1])).transpose(1, 2)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (e4m3 tensor with x's strides, descale) using one scale for the whole tensor (amax -> 448).

    Plain torch ops, so under `torch.compile` the amax and the cast fuse into the kernels around them.
    """
    amax = x.abs().amax().float().clamp(min=1e-6)  # () float32
    xq = (x.float() * (FP8_MAX / amax)).to(FP8)
    return xq, amax / FP8_MAX


def sdpa_bf16(q, k, v, mask, scale):
    """The `cudnn` attention backend: cuDNN frontend inference graph in the input dtype."""
    if mask is not None:
        raise ValueError("attention backend 'cudnn' takes no mask")
    return cudnn_sdpa(q, k, v, scale)


def sdpa_fp8(q, k, v, mask, scale):
    """The `cudnn_fp8` backend: e4m3 self-attention (keys >= FP8_MIN_KEYS), bf16 graph otherwise.

    Before quantizing, k and v lose their mean over the keys (per batch, head and channel): a
    per-query constant added to all logits leaves the softmax unchanged, and since every output row
    is a convex combination of v's rows, o = P (v - mean) + mean. Trained DiTs carry large
    per-channel offsets in k and v; without them the e4m3 grid is spent on the part that varies.
    """
    if mask is not None:
        raise ValueError("attention backend 'cudnn_fp8' takes no mask")
    if k.shape[-2] < FP8_MIN_KEYS:
        return cudnn_sdpa(q, k, v, scale)
    k_mean = k.float().mean(dim=-2, keepdim=True)  # (B, H, 1, D)
    v_mean = v.float().mean(dim=-2, keepdim=True)
    (q8, dq), (k8, dk), (v8, dv) = quantize_fp8(q), quantize_fp8(k - k_mean), quantize_fp8(v - v_mean)
    out = cudnn_sdpa(q8, k8, v8, scale, torch.stack([dq, dk, dv]))  # e4m3 in v's scale
    return (out.float() * dv + v_mean).to(q.dtype)
