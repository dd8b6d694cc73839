"""Benchmark one shot through the whole per-shot path (`tasks.render.shot.render_shot_result` + the InfiniteTalk
backend): decode, gate, encoders, DiT, VAE, colour, composite, lossless encode.

Default (GPU): a synthetic 10-second 1280x720 shot at 24 fps, generated at the 480P bucket (448x896 for
16:9) with every model at its real size and random weights, built in memory and made resident for the
backend (no weights root is read):
  * DiT: Wan2.1-I2V-14B + InfiniteTalk audio layers, bf16 on the GPU (benchmarks/bench_dit.py's builder);
  * VAE: Wan2.1 VAE, dim 96, float32 on the GPU (benchmarks/bench_vae.py's builder);
  * CLIP ViT-H/14 (32 blocks, fp16, GPU); wav2vec2-base (12 x 768, fp32, GPU);
  * umT5-XXL (24 x 4096, bf16, on the CPU as `t5_cpu: true`), with a small stand-in tokenizer (the
    real one is not downloaded: the token count differs, the per-token cost does not); `--no-t5` skips it
    and uses a random 512 x 4096 context instead.
The shot runs with `infinitetalk.profile: true` (device syncs around every stage, so the split is exact),
`gate.policy: all` and `region.mode: full` (the test pattern has no face). Sampling steps default to 40
(official); DiT time scales linearly with steps, so `--steps 4` measures the same per-forward cost in a
tenth of the time (the JSON has seconds per DiT forward).

`--tiny`: the same path on the CPU with tiny random weights written to a temporary root in the official
layout (a smoke test of this script; numbers mean nothing).

Usage:
    python benchmarks/bench_shot.py [--seconds 10] [--steps 40] [--size 1280x720] [--json out.json]
    python benchmarks/bench_shot.py --tiny --json /tmp/shot.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tasks.config.pipeline import load_config  # noqa: E402
from tasks.infinitetalk import InfiniteTalkBackend, load_spec, resolve_options  # noqa: E402
from tasks.infinitetalk.cache import cached_tensors  # noqa: E402
from tasks.infinitetalk.options import resolve_device  # noqa: E402
from tasks.infinitetalk.resident import RESIDENT  # noqa: E402
from tasks.media.audio import prepare_dialogue  # noqa: E402
from tasks.media.ffmpeg import ffmpeg_exe  # noqa: E402
from tasks.media.probe import probe  # noqa: E402
from tasks.render.shot import ShotJob, render_shot_result  # noqa: E402
from tasks.timeline.plan import plan_shot  # noqa: E402
from tasks.timeline.shots import Shot  # noqa: E402

log = logging.getLogger("bench_shot")

# report rows: (label, timing keys of the ShotResult summed into it)
STAGES = (
    ("decode", ("decode", "gate")),
    ("encoders", ("encoders", "clip")),
    ("DiT", ("dit",)),
    ("VAE", ("vae",)),
    ("colour", ("colour",)),
    ("composite", ("crop", "composite")),
    ("encode", ("encode", "join")),
    ("compile warm-up", ("warm_up",)),  # inside the shot: a size the load did not warm
    ("model load", ("load",)),
)


def make_shot(path: Path, seconds: float, size: tuple[int, int], fps: int) -> None:
    """A synthetic H.264 shot (moving test pattern)."""
    w, h = size
    cmd = [
        ffmpeg_exe(), "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate={fps}:duration={seconds}",
        "-c:v", "libx264", "-preset", "veryfast", "-crf", "18", "-pix_fmt", "yuv420p", str(path),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def make_dub(path: Path, seconds: float) -> None:
    """The committed test speech, repeated to `seconds` at 16 kHz."""
    speech, sr = sf.read(ROOT / "tests" / "data" / "speech.wav", dtype="float32")
    n = round(seconds * sr)
    sf.write(str(path), np.resize(speech, n), sr, subtype="FLOAT")


def _randomize(module: torch.nn.Module, device: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """Meta-built module -> empty storage on `device` -> N(0, 1/fan_in) weights, unit norms, zero biases."""
    module = module.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, math.prod(p.shape[1:]) ** -0.5, generator=gen)
    return module.eval().requires_grad_(False)


def real_size_models(work: Path, with_t5: bool) -> dict[str, Any]:
    """Every component at its real size with random weights (see the module docstring)."""
    from bench_dit import build_random_model
    from bench_vae import random_vae
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    from model.config import dit_preset
    from model.network.clip import CLIP_CONFIGS, ClipImageEncoder, build_clip
    from model.network.t5 import T5_CONFIGS, T5TextEncoder, build_umt5, load_tokenizer
    from model.network.vae_net import VAEConfig
    from model.network.wav2vec import AudioEncoder
    from model.weights.tiny import write_tiny_tokenizer

    out: dict[str, Any] = {"dit": build_random_model(dit_preset("infinitetalk-14b"))}
    out["vae"] = random_vae(VAEConfig(dim=96, z_dim=16), "cuda", torch.float32)
    with torch.device("meta"):
        clip = build_clip(CLIP_CONFIGS["vit-h-14"], device="meta")
    clip = _randomize(clip, "cuda", torch.float16, 1)
    emb = getattr(clip, "vision_model", clip).embeddings
    emb.position_ids.copy_(
        torch.arange(emb.position_ids.shape[-1], device="cuda").expand_as(emb.position_ids)
    )
    out["clip"] = ClipImageEncoder(clip)
    with torch.device("meta"):
        w2v = Wav2Vec2Model(Wav2Vec2Config())
    out["audio"] = AudioEncoder(_randomize(w2v, "cuda", torch.float32, 2))
    if with_t5:
        with torch.device("meta"):
            t5 = build_umt5(T5_CONFIGS["umt5-xxl"])
        t5 = _randomize(t5, "cpu", torch.bfloat16, 3)
        t5.encoder.embed_tokens = t5.shared
        out["t5"] = T5TextEncoder(t5, load_tokenizer(write_tiny_tokenizer(work / "tokenizer")))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench_shot."))
    fps = 24
    size = tuple(int(v) for v in args.size.lower().split("x"))
    film, dub = work / "shot.mp4", work / "dub.wav"
    make_shot(film, args.seconds, size, fps)
    make_dub(dub, args.seconds)
    overrides = [
        "backend.name=infinitetalk", f"workspace.root={work / 'ws'}", "gate.policy=all", "region.mode=full",
        "qc.enabled=false", "infinitetalk.profile=true", "audio.length_policy=fit",
    ]  # fmt: skip
    if args.steps is not None:
        overrides.append(f"infinitetalk.steps={args.steps}")
    if args.batch_branches:
        overrides.append("infinitetalk.batch_branches=true")
    t0 = time.perf_counter()
    if args.tiny:
        from model.weights.tiny import write_tiny_root

        root = write_tiny_root(work / "weights")
        overrides += [f"infinitetalk.weights={root}", "infinitetalk.device=cpu"]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("bench_shot: the real-size run needs a CUDA device (use --tiny on a CPU)")
        root = work / "weights"  # never read: the components are installed below
        root.mkdir()
        overrides += [
            f"infinitetalk.weights={root}",
            "infinitetalk.mode=infinitetalk-480",
            "frames.bucket=480",
        ]
    cfg = load_config(overrides=overrides)
    opts = resolve_options(cfg)
    device = resolve_device(opts.device)
    if not args.tiny:
        components = real_size_models(work, with_t5=not args.no_t5)
        RESIDENT.install(root, load_spec(opts, device), components)
        if args.no_t5:  # a random context stands in for umT5's (cached like the real one would be)
            _fake_prompt_cache(cfg, work)
    build_s = time.perf_counter() - t0

    info = probe(film)
    track = prepare_dialogue(
        dub, frame_count=info.frame_count, fps=info.fps, cfg=cfg.audio, out_wav=work / "d.wav"
    )
    plan = plan_shot(Shot(0, 0, info.frame_count), info.fps, cfg.plan)
    job = ShotJob(
        info.to_dict(), plan.to_dict(), track.to_dict(), (0, track.n_samples), str(work / "out.mkv"),
        cfg.to_dict(), work_dir=str(work / "run"),
    )  # fmt: skip
    backend = InfiniteTalkBackend({}, config=cfg)
    dit = backend.models("dit")["dit"]
    calls: list[int] = []
    hook = dit.register_forward_pre_hook(lambda module, inputs: calls.append(1))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    try:
        result = render_shot_result(job, backend=backend)
    finally:
        hook.remove()
    t = result["timings_s"]
    stages = {label: round(sum(t.get(k, 0.0) for k in keys), 3) for label, keys in STAGES}
    stages["other"] = round(t["total"] - sum(stages.values()), 3)
    return {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "tiny": args.tiny,
        "shot": {
            "seconds": args.seconds,
            "source": f"{size[0]}x{size[1]}@{fps}",
            "frames": plan.num_frames,
            "model_frames": plan.model_frames,
            "chunks": len(plan.chunks),
        },  # fmt: skip
        "steps": backend.opts.steps or "preset",
        "dit_calls": len(calls),
        "dit_s_per_call": round(t.get("dit", 0.0) / max(1, len(calls)), 4),
        "build_s": round(build_s, 1),
        "wall_s": t["total"],
        "stages_s": stages,
        "timings_s": t,
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device.startswith("cuda")
        else None,
        "dubbed": result["dubbed"],
        "reason": result["reason"],
        "note": "random weights; umT5 tokenizer is a small stand-in"
        + (" (umT5 skipped)" if args.no_t5 else ""),
    }


def _fake_prompt_cache(cfg: Any, work: Path) -> None:
    """Pre-write the per-film prompt cache with a random 512 x 4096 context (as if umT5 had run)."""
    backend = InfiniteTalkBackend({}, config=cfg)
    gen = torch.Generator().manual_seed(4)

    def random_context() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        ctx = {k: torch.randn(512, 4096, generator=gen) for k in ("context", "context_null")}
        return ctx, {"prompt": "random (umT5 skipped)"}

    cached_tensors(backend.prompt_cache_path(work / "run" / "film"), random_context)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=None, help="shot length (default 10; --tiny: 1)")
    p.add_argument("--steps", type=int, default=None, help="sampling steps (default: the mode's preset)")
    p.add_argument("--size", default=None, help="source WxH (default 1280x720; --tiny: 320x180)")
    p.add_argument("--batch-branches", action="store_true", help="guidance branches as one batched DiT call")
    p.add_argument("--no-t5", action="store_true", help="skip umT5 (random context instead)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run with tiny random weights")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (1.0 if args.tiny else 10.0)
    args.size = args.size or ("320x180" if args.tiny else "1280x720")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    out = run(args)
    width = max(len(k) for k in out["stages_s"])
    print(
        f"device {out['device']}  torch {out['torch']}  build {out['build_s']} s  peak {out['peak_gib']} GiB"
    )
    s = out["shot"]
    print(
        f"shot {s['seconds']} s {s['source']}: {s['frames']} frames -> {s['model_frames']} model frames, "
        f"{s['chunks']} chunks; {out['dit_calls']} DiT calls, {out['dit_s_per_call']} s each"
    )
    for k, v in out["stages_s"].items():
        print(f"  {k:<{width}}  {v:9.3f} s  {100 * v / out['wall_s']:5.1f} %")
    print(f"  {'total':<{width}}  {out['wall_s']:9.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
