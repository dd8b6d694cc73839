"""Sequence-parallel DiT: N GPUs against 1 on the same host, per forward and per 81-frame chunk.

Every rank builds the same random model (rank 0's weights are broadcast). For each measurement the
1-GPU baseline runs on rank 0 alone (the other ranks wait), then the same call runs with N-way
sequence parallelism on all ranks. Reported: median seconds (max over ranks), speed-up, peak memory
per GPU, and the relative difference of the SP output from the 1-GPU output (the two differ only by
bf16 rounding order: matmuls over fewer rows, attention over a head subset).

- forward: one DiT call at 480P (21 x 60 x 104 latent, 32760 tokens), bf16, 1 and 2 speakers.
- chunk: `stream_generate` of one 81-frame chunk (3 guidance branches per step, `--steps` steps,
  random full-size Wan VAE on rank 0 via `RankZeroCodec`, CLIP features given); `est_40_steps_s`
  extrapolates with the measured forward time.

    torchrun --nproc-per-node 2 benchmarks/bench_sp.py --json $OUT/sp.json   # 2 x H200
    python benchmarks/bench_sp.py --tiny --nproc 2                           # CPU smoke run (gloo)

Without torchrun's env the script starts `--nproc` local processes itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a plain checkout too

from model.config import DIT_PRESETS, DiTConfig
from model.network.dit import InfiniteTalkDiT
from model.network.parallel import RankZeroCodec, SequenceParallel
from model.network.vae import WanVAE

# name -> (latent frames, latent h, latent w); chunk pixels are 8x the latent size
from model.network.vae_net import VAE_CONFIGS, CausalVAE
from model.runtime.shot_worker import free_port
from model.sampling.conditioning import Conditioning, speaker_masks
from model.sampling.sampler import sampler_preset
from model.sampling.stream import stream_generate

SIZES = {"480p": (21, 60, 104), "720p": (21, 90, 160)}
TINY_SIZES = {"tiny": (5, 4, 6)}


def log(sp: SequenceParallel, *parts: object) -> None:
    if sp.is_writer():
        print(*parts, file=sys.stderr, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # CPU: process peak RSS (only grows)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------


def random_fill(module: torch.nn.Module, seed: int, dim: int) -> None:
    """Fan-in scaled normal weights, zero biases, unit norm gains (activations stay O(1))."""
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1 or name.endswith("gamma"):
                p.fill_(1.0)
            elif name.endswith("modulation"):
                p.normal_(0.0, dim**-0.5, generator=gen)
            else:
                p.normal_(0.0, math.prod(p.shape[1:]) ** -0.5, generator=gen)


def build_dit(sp: SequenceParallel, config: DiTConfig, dtype: torch.dtype) -> InfiniteTalkDiT:
    """Meta build -> dtype -> empty storage on this rank's device -> random fill -> rank 0's weights."""
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    model = model.to(dtype).to_empty(device=sp.device)
    random_fill(model, 0, config.dim)
    for p in model.parameters():
        sp.broadcast(p.data)
    return model.eval().requires_grad_(False)


def build_vae(sp: SequenceParallel, tiny: bool, dtype: torch.dtype) -> WanVAE | None:
    """Random Wan VAE on the writer only (the others receive its results through RankZeroCodec)."""
    if not sp.is_writer():
        return None
    with torch.device("meta"):
        model = CausalVAE(VAE_CONFIGS["tiny" if tiny else "wan2.1"])
    model = model.to(dtype).to_empty(device=sp.device)
    random_fill(model, 1, 96)
    return WanVAE(model)


# ----------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------


def timed(sp: SequenceParallel, fn: Callable[[], object], warmup: int, repeats: int, alone: bool) -> dict:
    """Median seconds (max over the ranks that run) and peak memory of fn; `alone`: rank 0 only."""
    runs = sp.is_writer() or not alone
    result = None
    reset_peak(sp.device)
    for _ in range(warmup):
        if runs:
            result = fn()
    times = []
    for _ in range(repeats):
        sp.barrier()
        t0 = time.perf_counter()
        if runs:
            result = fn()
            sync(sp.device)
        elapsed = torch.tensor([time.perf_counter() - t0 if runs else 0.0], device=sp.device)
        if sp.world_size > 1:
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=sp.group)
        times.append(float(elapsed))
    peaks = [peak_gib(sp.device)]
    if sp.world_size > 1:
        peaks = [None] * sp.world_size
        dist.all_gather_object(peaks, peak_gib(sp.device), group=sp.group)
    return {"seconds": statistics.median(times), "peak_gib": peaks[:1] if alone else peaks, "result": result}


def forward_inputs(sp: SequenceParallel, config: DiTConfig, grid: tuple[int, int, int], speakers: int, dtype):
    frames, h, w = grid
    dev = sp.device
    g = torch.Generator(device=dev).manual_seed(1)
    f_pix = 1 + config.vae_scale * (frames - 1)
    inp = {
        "x": torch.randn(1, config.out_dim, frames, h, w, device=dev, dtype=dtype, generator=g),
        "t": torch.tensor([900.0], device=dev),
        "context": torch.randn(1, config.text_len, config.text_dim, device=dev, dtype=dtype, generator=g),
        "clip_fea": torch.randn(1, config.clip_tokens, config.clip_dim, device=dev, dtype=dtype, generator=g),
        "y": torch.randn(
            1, config.in_dim - config.out_dim, frames, h, w, device=dev, dtype=dtype, generator=g
        ),
        "audio": torch.randn(
            speakers,
            f_pix,
            config.audio_window,
            config.audio_blocks,
            config.audio_channels,
            device=dev,
            generator=g,
        ).to(dtype),
    }
    masks = torch.zeros(3, h, w, device=dev)
    masks[0, :, : w // 2] = 1
    masks[1, :, w // 2 :] = 1
    inp["ref_target_masks"] = masks
    for value in inp.values():
        sp.broadcast(value)  # identical inputs on every rank
    return inp


def bench_forward(sp, model, config, name, grid, speakers, dtype, warmup, repeats) -> dict:
    inp = forward_inputs(sp, config, grid, speakers, dtype)

    def call():
        with torch.inference_mode():
            return model(**inp)

    model.sp = None
    one = timed(sp, call, warmup, repeats, alone=True)
    sp.attach(model)
    many = timed(sp, call, warmup, repeats, alone=False)
    model.sp = None
    row = {
        "bench": "forward",
        "size": name,
        "latent": list(grid),
        "tokens": grid[0] * (grid[1] // 2) * (grid[2] // 2),
        "speakers": speakers,
        "gpus": sp.world_size,
        "s_1gpu": one["seconds"],
        "s_sp": many["seconds"],
        "speedup": one["seconds"] / many["seconds"],
        "peak_gib_1gpu": one["peak_gib"][0],
        "peak_gib_sp": many["peak_gib"],
    }
    if sp.is_writer():
        row["rel_err_vs_1gpu"] = rel_err(many["result"], one["result"])
        row["max_abs_vs_1gpu"] = float((many["result"].float() - one["result"].float()).abs().max())
    return row


def bench_chunk(sp, model, vae, config, name, grid, speakers, steps, tiny, forward_s) -> dict:
    frames, h, w = grid
    n_frames = 1 + config.vae_scale * (frames - 1)
    px = (8 * h, 8 * w)
    dev = sp.device
    g = torch.Generator().manual_seed(2)  # CPU draws, moved: identical on every rank
    clip = torch.randn(1, config.clip_tokens, config.clip_dim, generator=g).to(dev)
    cond = Conditioning(
        context=torch.randn(1, config.text_len, config.text_dim, generator=g).to(dev),
        context_null=torch.randn(1, config.text_len, config.text_dim, generator=g).to(dev),
        audio=[
            torch.randn(n_frames, config.audio_blocks, config.audio_channels, generator=g)
            for _ in range(speakers)
        ],
        ref_target_masks=speaker_masks(None, speakers, px, px, (h, w)),
        clip_fn=lambda ref: clip,
    )
    reference = (torch.rand(3, 1, *px, generator=g) * 2 - 1).to(dev)
    preset = "tiny" if tiny else "infinitetalk-480"
    settings = sampler_preset(
        preset, frame_num=n_frames, motion_frames=1 if tiny else 9, sampling_steps=steps
    )
    branches = 3

    def run(codec):
        def call():
            with torch.inference_mode():
                out = stream_generate(
                    model,
                    codec,
                    cond=cond,
                    settings=settings,
                    reference_frame_fn=lambda i, s: reference,
                    generator=torch.Generator().manual_seed(settings.seed),
                )
            return out.latents[0], out.video

        return call

    model.sp = None
    one = timed(sp, run(vae), 0, 1, alone=True)
    sp.attach(model)
    many = timed(sp, run(RankZeroCodec(sp, vae)), 0, 1, alone=False)
    model.sp = None
    row = {
        "bench": "chunk",
        "size": name,
        "frames": n_frames,
        "speakers": speakers,
        "steps": steps,
        "model_calls": steps * branches,
        "gpus": sp.world_size,
        "s_1gpu": one["seconds"],
        "s_sp": many["seconds"],
        "speedup": one["seconds"] / many["seconds"],
        "peak_gib_1gpu": one["peak_gib"][0],
        "peak_gib_sp": many["peak_gib"],
    }
    if forward_s is not None:
        extra = (40 - steps) * branches
        row["est_40_steps_s_1gpu"] = one["seconds"] + extra * forward_s[0]
        row["est_40_steps_s_sp"] = many["seconds"] + extra * forward_s[1]
    if sp.is_writer():
        row["latent_rel_err_vs_1gpu"] = rel_err(many["result"][0], one["result"][0])
        row["video_rel_err_vs_1gpu"] = rel_err(many["result"][1], one["result"][1])
    return row


# ----------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------


def main_rank(args: argparse.Namespace) -> None:
    with SequenceParallel.init_from_env("gloo" if args.tiny else None) as sp:
        if args.tiny:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // sp.world_size))
        config = DIT_PRESETS["tiny"] if args.tiny else DIT_PRESETS["infinitetalk-14b"]
        dtype = torch.float32 if args.tiny else torch.bfloat16
        sizes = TINY_SIZES if args.tiny else {k: SIZES[k] for k in args.sizes.split(",")}
        t0 = time.perf_counter()
        model = build_dit(sp, config, dtype)
        vae = None if args.skip_chunk else build_vae(sp, args.tiny, dtype)
        device_name = torch.cuda.get_device_name(sp.device) if sp.device.type == "cuda" else "cpu"
        log(
            sp,
            f"{device_name} x{sp.world_size}  torch {torch.__version__}  build {time.perf_counter() - t0:.1f}s",
        )
        rows, forward_s = [], {}
        for name, grid in sizes.items():
            for speakers in [int(s) for s in args.speakers.split(",")]:
                row = bench_forward(sp, model, config, name, grid, speakers, dtype, args.warmup, args.repeats)
                forward_s[(name, speakers)] = (row["s_1gpu"], row["s_sp"])
                rows.append(row)
                log(sp, json.dumps(row))
            if not args.skip_chunk:
                speakers = args.chunk_speakers
                row = bench_chunk(
                    sp,
                    model,
                    vae,
                    config,
                    name,
                    grid,
                    speakers,
                    args.steps,
                    args.tiny,
                    forward_s.get((name, speakers)),
                )
                rows.append(row)
                log(sp, json.dumps(row))
        if sp.is_writer():
            report = {
                "device": device_name,
                "gpus": sp.world_size,
                "torch": torch.__version__,
                "dtype": str(dtype).removeprefix("torch."),
                "attn_backend": model.attn_backend,
                "rows": rows,
            }
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(report, indent=2))
            print(json.dumps(report, indent=2))


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    main_rank(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model on CPU with gloo (smoke run)")
    p.add_argument("--nproc", type=int, default=2, help="processes to start without torchrun env")
    p.add_argument("--sizes", default="480p", help="comma list of " + ",".join(SIZES))
    p.add_argument("--speakers", default="1,2", help="forward speaker counts")
    p.add_argument("--chunk-speakers", type=int, default=1)
    p.add_argument("--steps", type=int, default=4, help="sampling steps of the chunk run")
    p.add_argument("--skip-chunk", action="store_true")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the report here (rank 0)")
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.tiny:
        args.repeats, args.steps = min(args.repeats, 2), min(args.steps, 2)
    if "RANK" in os.environ:  # torchrun
        main_rank(args)
    else:
        mp.spawn(_spawned, args=(args.nproc, free_port(), args), nprocs=args.nproc)


if __name__ == "__main__":
    main()
