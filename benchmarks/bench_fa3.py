"""FlashAttention-3 fp8 (`fa3-fwd`) against cuDNN fp8 at the DiT's self-attention shapes, and the windowed path.

Per crop bucket (L = 21 latent frames x the bucket's patch grid; 448x896 is L = 32,928) and [1, 40, L, 128]
laid out (B, L, H, D) as the DiT makes them: the product's backends end to end (`cudnn_fp8`: k/v mean
removal, per-tensor e4m3, cuDNN's fp8 graph; `fa3_fp8`: the same with per-head scales and FA3's fp8
kernel), each kernel alone on pre-quantized inputs, both bf16 kernels, and `fa3_fp8` under frame-window
plans (`model.network.sparse_attention`, `--windows W:G` = window:group). Error: relative L2 of the first
`--check-queries` query rows against a float32 reference over all keys (windowed rows: against the float32
reference under the same mask, which checks the gather; and against dense, the lossy part). Inputs: q, k
~ N(0, s^2) (logit std s^2 = 3), v ~ N(0, 1), plus a per-channel offset on k and v (as trained DiTs have).
Timing: CUDA events, 2 warm-ups, median of `--repeats`.

    python3 benchmarks/bench_fa3.py --json $OUT/fa3.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model.network import cudnn_attention as ca  # noqa: E402
from model.network import fa3_attention as fa3  # noqa: E402
from model.network.sparse_attention import SparseSettings, window_mask, window_plan, window_scope  # noqa: E402

BUCKETS = {"448x896": (28, 56), "512x768": (32, 48), "576x704": (36, 44), "640x640": (40, 40)}
FRAMES = 21


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


def reference(q, k, v, rows, scale, mask=None) -> torch.Tensor:
    """float32 softmax(q k^T) v of the first `rows` queries; q/k/v (B, H, L, D) -> (B, H, rows, D)."""
    s = torch.einsum("bhqd,bhkd->bhqk", q[:, :, :rows].float(), k.float()) * scale
    if mask is not None:
        s = s.masked_fill(~mask[:rows].to(s.device), float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v.float())


def rel_l2(out, ref) -> float:
    o = out[:, :, : ref.shape[2]].float()
    return float((o - ref).norm() / ref.norm())


def measure(bucket: str, args, g, dev) -> dict:
    rows_px = BUCKETS[bucket]
    t0 = rows_px[0] * rows_px[1]
    b, h, d, L = 1, 40, 128, FRAMES * t0
    scale = 1.0 / math.sqrt(d)
    flops = 4 * b * h * L * L * d

    def make(mult: float, offset: float) -> torch.Tensor:
        x = torch.randn(b, L, h, d, generator=g, device=dev) * mult
        x = x + offset * torch.randn(1, 1, h, d, generator=g, device=dev)
        return x.to(torch.bfloat16).transpose(1, 2)  # (B, H, L, D) view of (B, L, H, D)

    s = args.sharpness
    q, k, v = make(s, 0.0), make(s, 2.0), make(1.0, 2.0)
    rows = args.check_queries
    ref = reference(q, k, v, rows, scale)
    runner = ca.CudnnAttention()
    (cq8, cdq), (ck8, cdk), (cv8, cdv) = ca.quantize_fp8(q), ca.quantize_fp8(k), ca.quantize_fp8(v)
    cdesc = torch.stack([cdq, cdk, cdv])
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    (fq8, fdq), (fk8, fdk), (fv8, fdv) = (fa3.quantize_per_head(x) for x in (qt, kt, vt))
    out: dict = {"L": L, "tflop": flops / 1e12, "rows": {}}

    def row(name, fn, check=True, ref_=ref, flop=flops, extra=None):
        try:
            t = time_cuda(fn, args.repeats)
            err = rel_l2(fn(), ref_) if check else None
            r = {"ms": t * 1e3, "tflops": flop / t / 1e12, "rel_l2": err, **(extra or {})}
        except Exception as exc:  # one failing kernel is reported, the rest still measured
            r = {"error": f"{type(exc).__name__}: {exc}"}
        out["rows"][name] = r
        print(f"  {bucket} {name:34s} {json.dumps(r)}", flush=True)
        torch.cuda.empty_cache()

    with ca.attention_scope(runner):
        row("cudnn_bf16", lambda: ca.sdpa_bf16(q, k, v, None, scale))
        row("cudnn_fp8 (product path)", lambda: ca.sdpa_fp8(q, k, v, None, scale))
        row("cudnn_fp8 kernel", lambda: runner(cq8, ck8, cv8, scale, cdesc), check=False)
    row("fa3_bf16", lambda: fa3.sdpa_bf16(q, k, v, None, scale))
    row("fa3_fp8 (product path)", lambda: fa3.sdpa_fp8(q, k, v, None, scale))
    row("fa3_fp8 kernel", lambda: fa3.fa3_fp8_op(fq8, fk8, fv8, fdq, fdk, fdv, scale), check=False)
    for spec in args.windows.split(","):
        if not spec:
            continue
        w, grp = (int(x) for x in spec.split(":"))
        plan = window_plan(FRAMES, t0, SparseSettings(window=w, group=grp), device=dev)
        mask = window_mask(plan)[:rows].to(dev)
        masked_ref = reference(q, k, v, rows, scale, mask)
        with window_scope(plan):
            fn = lambda: fa3.sdpa_fp8(q, k, v, None, scale)  # noqa: E731
            row(f"fa3_fp8 window {w} group {grp}", fn, ref_=masked_ref, flop=flops * plan.density,
                extra={"density": plan.density, "rel_l2_vs_dense": rel_l2(fn(), ref)})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--buckets", default=",".join(BUCKETS))
    p.add_argument("--windows", default="1:3,2:3,3:3,2:1,3:7")
    p.add_argument("--sharpness", type=float, default=3.0**0.5)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--check-queries", type=int, default=256)
    p.add_argument("--json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_fa3.py needs a CUDA device")
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    head = f"device {props.name}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}"
    head += f"  fa3 available {fa3.available(dev)}"
    print(head, flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    results = {"env": head, "buckets": {b: measure(b, args, g, dev) for b in args.buckets.split(",")}}
    print("bucket   L       kernel                              ms     TFLOP/s  rel_l2")
    for bucket, res in results["buckets"].items():
        for name, r in res["rows"].items():
            if "error" in r:
                print(f"{bucket:8s} {res['L']:6d}  {name:34s} {r['error'][:60]}")
            else:
                err = "" if r["rel_l2"] is None else f"{r['rel_l2']:.2e}"
                print(f"{bucket:8s} {res['L']:6d}  {name:34s} {r['ms']:7.2f} {r['tflops']:7.0f}  {err}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
