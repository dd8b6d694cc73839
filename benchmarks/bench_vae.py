"""Wan VAE speed and peak memory: encode / decode of one 81-frame chunk at 480P and 720P.

Real architecture (dim 96) with random weights on CUDA, float32 and bfloat16, untiled and tiled
(`--tile/--stride` px). Reports the median seconds over `--repeats` runs (after one warm-up) and the
peak CUDA memory of a call. `--tiny` runs a tiny model on small clips on the CPU (a smoke run; CPU
memory is reported as the process's peak RSS, which only grows).

    python benchmarks/bench_vae.py                # CUDA, full grid
    python benchmarks/bench_vae.py --json out.json
    python benchmarks/bench_vae.py --tiny          # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from model.network.tiling import TileSpec
from model.network.vae import WanVAE
from model.network.vae_net import CausalVAE, VAEConfig

SIZES = {"480p": (480, 832), "720p": (720, 1280)}
TINY_SIZES = {"32x48": (32, 48)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Row:
    size: str
    frames: int
    dtype: str
    tiled: str
    op: str
    seconds: float | None
    peak_gib: float | None
    note: str = ""


def random_vae(cfg: VAEConfig, device: str, dtype: torch.dtype, seed: int = 0) -> WanVAE:
    """Wan VAE with N(0, 1/fan_in) kernels and unit gains (activations stay O(1) through the net)."""
    with torch.device("meta"):
        model = CausalVAE(cfg)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.state_dict().items():
        if name.endswith("gamma"):
            state[name] = torch.ones(p.shape)
        elif name.endswith("bias"):
            state[name] = torch.zeros(p.shape)
        else:
            state[name] = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))
    model.load_state_dict({k: v.to(device, dtype) for k, v in state.items()}, assign=True)
    return WanVAE(model)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)


def measure(fn, device: str, repeats: int) -> tuple[float, float]:
    fn()  # warm-up (kernels, allocator)
    _sync(device)
    times, peak = [], 0.0
    for _ in range(repeats):
        _peak_reset(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        peak = max(peak, _peak_gib(device))
    return statistics.median(times), peak


def bench_size(
    vae: WanVAE,
    name: str,
    video: torch.Tensor,
    latent: torch.Tensor,
    tiling: TileSpec,
    dname: str,
    device: str,
    repeats: int,
) -> list[Row]:
    """Encode/decode rows for one clip size, untiled and tiled."""
    rows = []
    for tile in (None, tiling):
        label = "no" if tile is None else f"{tile.tile}/{tile.stride}"
        ops = {
            "encode": lambda t=tile: vae.encode(video, tiling=t),
            "decode": lambda t=tile: vae.decode(latent, tiling=t),
        }
        for op, fn in ops.items():
            try:
                sec, peak = measure(fn, device, repeats)
                rows.append(Row(name, video.shape[2], dname, label, op, sec, peak))
            except torch.cuda.OutOfMemoryError:
                rows.append(Row(name, video.shape[2], dname, label, op, None, None, "OOM"))
            print(_fmt(rows[-1]), file=sys.stderr, flush=True)
    return rows


def run(args: argparse.Namespace) -> list[Row]:
    device = "cpu" if args.tiny else args.device
    cfg = VAEConfig(dim=8) if args.tiny else VAEConfig()
    sizes = TINY_SIZES if args.tiny else {k: SIZES[k] for k in args.sizes}
    frames = 5 if args.tiny else args.frames
    tiling = TileSpec(32, 16) if args.tiny else TileSpec(args.tile, args.stride)
    repeats = 1 if args.tiny else args.repeats
    rows: list[Row] = []
    for dname in args.dtypes:
        vae = random_vae(cfg, device, DTYPES[dname])
        for sname, (h, w) in sizes.items():
            gen = torch.Generator(device=device).manual_seed(1)
            video = torch.rand(1, 3, frames, h, w, generator=gen, device=device) * 2 - 1
            latent = torch.randn(
                1, cfg.z_dim, 1 + (frames - 1) // 4, h // 8, w // 8, generator=gen, device=device
            )
            rows += bench_size(vae, sname, video, latent, tiling, dname, device, repeats)
    return rows


def _fmt(r: Row) -> str:
    sec = "—" if r.seconds is None else f"{r.seconds:8.2f}"
    mem = "—" if r.peak_gib is None else f"{r.peak_gib:8.2f}"
    return f"| {r.size:>7} | {r.frames:>3} | {r.dtype:>4} | {r.tiled:>7} | {r.op:>6} | {sec:>8} | {mem:>8} | {r.note} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="tiny model, small clips, CPU (smoke run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--tile", type=int, default=256, help="tile size in pixels (tiled rows)")
    p.add_argument("--stride", type=int, default=192, help="tile stride in pixels (tiled rows)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        p.error("CUDA not available; use --tiny for a CPU smoke run")
    torch.backends.cudnn.benchmark = False
    rows = run(args)
    device = "cpu" if args.tiny else torch.cuda.get_device_name()
    mem = "peak RSS GiB (process)" if args.tiny else "peak GiB"
    print(f"Wan VAE ({'tiny dim 8' if args.tiny else 'dim 96'}, random weights) on {device}")
    print(
        f"| {'size':>7} | {'T':>3} | {'dt':>4} | {'tiled':>7} | {'op':>6} | {'seconds':>8} | {mem} | note |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(_fmt(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "rows": [asdict(r) for r in rows]}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
