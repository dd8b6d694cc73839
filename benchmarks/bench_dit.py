"""Benchmark one InfiniteTalk DiT forward at the real 14B shape on CUDA, against an analytic floor.

The model is built on the meta device, cast to bf16 there, materialised on the GPU with `to_empty`
and filled in place with random values (no CPU init, no weights needed). Each size runs one forward
with realistic conditioning (text 512 x 4096, CLIP 257 x 1280, audio 81 x 5 x 12 x 768), timed with
CUDA events: warm-up calls, then the median of the repeats.

Analytic floor (FLOPs of one forward, B = 1, L video tokens, D = dim, N layers):
    linear     2 * L * P_tok                      P_tok = weights each token meets (config, ~14.05e9)
    self-attn  4 * L^2 * D * N                    (q k^T and p v)
    cross-attn 4 * L * (text_len + 257) * D * N   text + CLIP image tokens
             + 4 * L * (32 * speakers) * D * N    audio tokens of the token's own frame
    speaker map (2 speakers) 4 * L * T0 * D * N   T0 = tokens of the first latent frame
    context    N * (2 * (text_len + 257) * 2 D^2 + 2 * F_lat * 32 * speakers * 768 * 2 D)  (k/v projections)
    embeddings text MLP, CLIP MLP, audio projector (small)
The floor time is FLOPs / (the card's bf16 GEMM rate measured here on an 8192^3 matmul); the reported
ratio is measured time / floor time.

Usage: python benchmarks/bench_dit.py [--sizes 480p,720p] [--speakers 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.config import DiTConfig, dit_preset
from model.network.dit import InfiniteTalkDiT

SIZES = {"480p": (60, 104), "720p": (90, 160)}  # latent h, w (pixels / 8)


def gemm_tflops(n: int = 8192, warmup: int = 3, repeats: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * repeats / (start.elapsed_time(end) / 1e3) / 1e12


def build_random_model(config: DiTConfig) -> InfiniteTalkDiT:
    """Meta build -> bf16 -> empty CUDA storage -> in-place random init (fan-in scaled)."""
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    model = model.to(torch.bfloat16).to_empty(device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # norm weights
                p.fill_(1.0)
            elif name.endswith("modulation"):
                p.normal_(0.0, config.dim**-0.5, generator=gen)
            else:
                fan_in = math.prod(p.shape[1:])
                p.normal_(0.0, fan_in**-0.5, generator=gen)
    return model.eval().requires_grad_(False)


def forward_flops(config: DiTConfig, frames: int, h: int, w: int, speakers: int) -> dict[str, float]:
    pt, ph, pw = config.patch_size
    f_lat, nh, nw = frames // pt, h // ph, w // pw
    tokens = f_lat * nh * nw
    d, n = config.dim, config.num_layers
    ctx = config.text_len + config.clip_tokens
    n_audio = config.context_tokens * speakers
    f_pix = 1 + config.vae_scale * (frames - 1)
    inter, slot = config.intermediate_dim, config.audio_blocks * config.audio_channels
    terms = {
        "linear": 2.0 * tokens * config.per_token_linear_params(),
        "self_attn": 4.0 * tokens**2 * d * n,
        "cross_attn": 4.0 * tokens * (ctx + n_audio) * d * n,
        "speaker_map": 4.0 * tokens * (nh * nw) * d * n if speakers > 1 else 0.0,
        "context_proj": n * (2.0 * ctx * 2 * d * d + 2.0 * f_lat * n_audio * config.output_dim * 2 * d),
        "embeddings": 2.0 * config.text_len * (config.text_dim * d + d * d)
        + 2.0 * config.clip_tokens * (config.clip_dim**2 + config.clip_dim * d)
        + 2.0
        * speakers
        * (
            config.audio_window * slot * inter
            + (f_pix - 1) // config.vae_scale * config.audio_window_vf * slot * inter
            + f_lat * (inter * inter + inter * config.context_tokens * config.output_dim)
        ),
    }
    terms["total"] = sum(terms.values())
    terms["tokens"] = tokens
    return terms


def bench_size(model, config, size: str, frames: int, speakers: int, warmup: int, repeats: int) -> dict:
    h, w = SIZES[size]
    f_pix = 1 + config.vae_scale * (frames - 1)
    dev, bf16 = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(1, config.out_dim, frames, h, w, device=dev, dtype=bf16, generator=g)
    y = torch.randn(1, config.in_dim - config.out_dim, frames, h, w, device=dev, dtype=bf16, generator=g)
    t = torch.tensor([900.0], device=dev)
    context = torch.randn(1, config.text_len, config.text_dim, device=dev, dtype=bf16, generator=g)
    clip = torch.randn(1, config.clip_tokens, config.clip_dim, device=dev, dtype=bf16, generator=g)
    audio = torch.randn(
        speakers,
        f_pix,
        config.audio_window,
        config.audio_blocks,
        config.audio_channels,
        device=dev,
        dtype=bf16,
        generator=g,
    )
    masks = torch.zeros(3, h, w, device=dev)
    masks[0, :, : w // 2] = 1
    masks[1, :, w // 2 :] = 1

    def call():
        return model(x, t, context, clip, y, audio, masks)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        for _ in range(warmup):
            out = call()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    assert torch.isfinite(out).all(), "non-finite output"
    return {
        "size": size,
        "latent": [frames, h, w],
        "speakers": speakers,
        "seconds": statistics.median(times),
        "all_seconds": times,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="infinitetalk-14b")
    ap.add_argument("--sizes", default="480p,720p")
    ap.add_argument("--frames", type=int, default=21, help="latent frames (81 video frames -> 21)")
    ap.add_argument("--speakers", default="1", help="comma list, e.g. 1,2")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="sdpa", help="attention backend name (model.network.attention)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_dit needs a CUDA device")

    config = dit_preset(args.preset)
    t0 = time.perf_counter()
    model = build_random_model(config)
    model.attn_backend = args.backend
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    rate = gemm_tflops()
    rows = []
    for size in args.sizes.split(","):
        for speakers in (int(s) for s in args.speakers.split(",")):
            r = bench_size(model, config, size, args.frames, speakers, args.warmup, args.repeats)
            flops = forward_flops(config, args.frames, *SIZES[size], speakers)
            floor_s = flops["total"] / (rate * 1e12)
            r.update(
                tokens=int(flops["tokens"]),
                flops=flops,
                floor_seconds=floor_s,
                ratio_to_floor=r["seconds"] / floor_s,
                achieved_tflops=flops["total"] / r["seconds"] / 1e12,
            )
            rows.append(r)

    n_params = sum(p.numel() for p in model.parameters())
    print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  backend {args.backend}")
    print(
        f"params {n_params / 1e9:.2f}e9  P_tok {config.per_token_linear_params() / 1e9:.3f}e9  build {build_s:.1f}s"
    )
    print(f"bf16 GEMM 8192^3: {rate:.0f} TFLOP/s")
    head = f"{'size':6} {'spk':>3} {'tokens':>7} {'s/fwd':>8} {'floor s':>8} {'ratio':>6} {'TFLOP/s':>8} {'peak GiB':>9}"
    print(head)
    for r in rows:
        print(
            f"{r['size']:6} {r['speakers']:>3} {r['tokens']:>7} {r['seconds']:>8.3f} {r['floor_seconds']:>8.3f} "
            f"{r['ratio_to_floor']:>6.2f} {r['achieved_tflops']:>8.0f} {r['peak_gib']:>9.1f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "preset": args.preset,
            "backend": args.backend,
            "n_params": n_params,
            "per_token_params": config.per_token_linear_params(),
            "gemm_tflops": rate,
            "build_seconds": build_s,
            "rows": rows,
        }
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
