"""Self-attention kernels at the DiT's shapes: rate and error of every backend, side by side.

For [B, 40, L, 128] (L = 32,760 at 480P, 75,600 at 720P; q/k/v laid out (B, L, H, D) in memory as
the DiT produces them) it times SDPA flash, SDPA cuDNN, the cuDNN frontend bf16 inference graph
(`model.network.cudnn_attention`, backend `cudnn`) and its fp8 graph (backend `cudnn_fp8`: kernel alone on
pre-quantized inputs, and with the per-tensor quantization of q/k/v in eager torch ops, i.e. the
unfused worst case). Error: relative L2 (||o - ref|| / ||ref||) and max |o - ref| / max |ref| of the
first `--check-queries` query rows against a float32 reference over all keys. Inputs: q and k are
N(0, 1) times `--sharpness` (logit std = sharpness^2; 1 is a flat softmax, 3 is closer to trained
attention), v ~ N(0, 1). Timing: CUDA events, warm-up 2, median of `--repeats`.

    python3 benchmarks/bench_attention.py --sizes 480p,720p --json $OUT/attention.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.network import cudnn_attention as ca  # noqa: E402

TOKENS = {"480p": 21 * 30 * 52, "720p": 21 * 45 * 80}


def time_cuda(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def reference(q, k, v, rows: int, scale: float) -> torch.Tensor:
    """float32 softmax(q k^T) v of the first `rows` queries, (B, H, rows, D)."""
    s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, :rows].float(), k.float()) * scale
    return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v.float())


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o = out[:, :, : ref.shape[2]].float()
    return {
        "rel_l2": float((o - ref).norm() / ref.norm()),
        "rel_max": float((o - ref).abs().max() / ref.abs().max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="480p")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=40)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--sharpness", type=float, default=3.0**0.5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--check-queries", type=int, default=256)
    p.add_argument("--explore", action="store_true", help="also fp8 layouts and autotuned plans")
    p.add_argument("--json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA device")
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    head = f"device {props.name}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}"
    try:
        head += f"  cudnn-frontend {ca._cudnn().__version__} (backend {ca._cudnn().backend_version()})"
    except Exception as exc:  # report, keep measuring SDPA
        head += f"  cudnn-frontend unavailable: {exc}"
    print(head, flush=True)
    results: dict = {"env": head, "sizes": {}}
    g = torch.Generator(device=dev).manual_seed(0)
    runner = ca.CudnnAttention()
    for size in args.sizes.split(","):
        results["sizes"][size] = measure(size, args, runner, g, dev)
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def measure(size: str, args, runner, g, dev) -> dict:
    """Time and check every kernel at one size; prints its table."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, d, L = args.batch, args.heads, args.head_dim, TOKENS[size]
    scale = 1.0 / math.sqrt(d)
    flops = 4 * b * h * L * L * d

    def make(mult: float) -> torch.Tensor:
        x = torch.randn(b, L, h, d, generator=g, device=dev, dtype=torch.float32) * mult
        return x.to(torch.bfloat16).transpose(1, 2)  # (B, H, L, D) view of (B, L, H, D)

    q, k, v = make(args.sharpness), make(args.sharpness), make(1.0)
    ref = reference(q, k, v, args.check_queries, scale)
    (q8, dq), (k8, dk), (v8, dv) = ca.quantize_fp8(q), ca.quantize_fp8(k), ca.quantize_fp8(v)
    descale = torch.stack([dq, dk, dv])
    cases = {
        "sdpa_flash": lambda: _pinned(SDPBackend.FLASH_ATTENTION, q, k, v, sdpa_kernel),
        "sdpa_cudnn": lambda: _pinned(SDPBackend.CUDNN_ATTENTION, q, k, v, sdpa_kernel),
        "cudnn_bf16": lambda: runner(q, k, v, scale),
        "cudnn_fp8_kernel": lambda: runner(q8, k8, v8, scale, descale),
        "cudnn_fp8_with_quant": lambda: ca.sdpa_fp8(q, k, v, None, scale),
    }
    if args.explore:  # other layouts of the fp8 inputs, and every plan of each graph (autotune)
        tuned = ca.CudnnAttention(autotune=True)
        bhsd = [t.contiguous() for t in (q8, k8, v8)]
        cases.update(
            {
                "cudnn_bf16_autotuned": lambda: tuned(q, k, v, scale),
                "cudnn_fp8_autotuned": lambda: tuned(q8, k8, v8, scale, descale),
                "cudnn_fp8_bhsd": lambda: runner(*bhsd, scale, descale),
                "cudnn_fp8_bhsd_autotuned": lambda: tuned(*bhsd, scale, descale),
            }
        )
    rows = {}
    with ca.attention_scope(runner):
        for name, fn in cases.items():
            try:
                out = fn()
                if out.dtype == ca.FP8:  # the bare fp8 kernel writes e4m3 in v's scale
                    out = out.float() * dv
                torch.cuda.synchronize()
                err = errors(out, ref)
                t = time_cuda(fn, args.repeats)
                rows[name] = {"seconds": t, "tflops": flops / t / 1e12, **err}
            except Exception as exc:  # one failing kernel must not hide the others
                rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(size, name, json.dumps(rows[name]), flush=True)
    if args.explore:
        for key, g in tuned._graphs.items():
            print(
                "plans",
                key[1],
                key[3],
                json.dumps({n: round(t * 1e3, 2) for n, t in (g.plan_times or {}).items()}),
            )
    print(f"\n{size}  [{b},{h},{L},{d}]  sharpness {args.sharpness:.3f}")
    print(f"{'kernel':24s} {'ms':>9s} {'TFLOP/s':>8s} {'rel L2':>9s} {'rel max':>9s}")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:24s} {r['error']}")
        else:
            ms = r["seconds"] * 1e3
            print(f"{name:24s} {ms:9.2f} {r['tflops']:8.0f} {r['rel_l2']:9.2e} {r['rel_max']:9.2e}")
    return {"tokens": L, "flops": flops, "rows": rows}


def _pinned(kernel, q, k, v, sdpa_kernel):
    with sdpa_kernel(kernel):
        return F.scaled_dot_product_attention(q, k, v)


if __name__ == "__main__":
    main()
