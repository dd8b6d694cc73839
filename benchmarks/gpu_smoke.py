"""GPU smoke run of the product: a real-size random weights root on local disk, then one shot through
the product's per-shot path (`tasks.render.shot.render_shot_result` + the InfiniteTalk backend) per config.

What runs is what a user runs: `model.weights.loading.load_models` reads the root (safetensors mmap, LoRA merge,
fp8 conversion, compile, the `offload: auto` decision, VAE), the backend's default settings apply, and
only these are set: the weights root and `infinitetalk.mode` (the product default is tiny mode),
`gate.policy: all` + `region.mode: full` (the test pattern has no face), `qc.enabled: false` (QC
previews need an H.264 encoder) and `infinitetalk.profile: true` (device syncs around each stage, so the
split is exact). Runs (each in its own process, so model load and peak memory are its own):
  * default: the default config; `--default-steps N` (default 2) sampling steps instead of 40, as the DiT
    time scales linearly with steps (the JSON has seconds per DiT call);
  * fast: `infinitetalk.preset: fast` plus the root's step-distill LoRA (benchmarks/real_root.py writes
    a random one in the lightx2v format);
  * real: a real talking head (tests/data/talking/head1.mp4 looped, scaled onto a 1920x1080 frame) with
    the default gate and region mode and the fast preset; its dub decision (face analysis, region plan)
    is taken by the planning step (`prepare_decision`, as a film run prepares shots) before the load's
    warm-up, which then compiles at every model size the decision uses (the face-crop bucket);
  * gguf: the `--gguf Q8_0|Q4_K` random real-size GGUF root (`real_root.write_gguf_root`: the DiT as GGUF,
    the rest symlinked from the root) at `--default-steps` steps (no LoRA merges into GGUF). It needs the
    GGUF file's size free beside the root (17.7 GB for Q8_0): on the H200's 64 GB disk remove the base
    root's DiT shards first (the gguf run never reads them); the writer says so before writing.
`--cap-gib N` caps each run's CUDA allocator at N GiB (`torch.cuda.set_per_process_memory_fraction`,
benchmarks/smoke_real.py) before anything is allocated: the H200 as a 24 or 16 GiB card.
The shot: 10 s of 1280x720 at 24 fps (a moving test pattern, H.264; `--clip FILE` uses a given one) with
the committed test speech repeated as the dub.
Reported per run: model load (process start + imports, DiT/VAE/CLIP to the GPU, then the load's compile
warm-up at the shot's model size, `tasks.infinitetalk.warmup`), the film preparation (umT5 prompt embedding
and wav2vec2 features of the whole dub track: once per film, cached), then the shot as a resident worker
renders it (models loaded and warm, the film's features cached): the per-stage split, GPU idle % from
chunk 2's first DiT call to the last one (NVML utilisation sampled every 20 ms), peak memory (torch
allocator and NVML), DiT calls and seconds per call, H200-s per second of video (shot wall time / video
seconds). The `vae` run also checks the conditioning-clip encode with reuse bit-identical on the device.

`--tiny`: the same on the CPU with the tiny random root (and a tiny LoRA): a smoke test of this script
for CI and development; its numbers mean nothing.

Usage:
    python benchmarks/gpu_smoke.py [--work /tmp/smoke] [--runs default,fast] [--json OUT.json]
    python benchmarks/gpu_smoke.py --tiny --json /tmp/smoke.json
    python benchmarks/gpu_smoke.py --gpus-per-shot 2 --runs default,fast   # 2-GPU sequence parallelism

`--gpus-per-shot N` sets `infinitetalk.gpus_per_shot: N` in every run: the backend's ShotWorker ranks
(GPUs 0..N-1) hold the models, so "models" is the ranks' start, chunk walls come from the chunk ends,
DiT calls are not counted (they run in the ranks) and NVML peak memory is reported per GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

T_LAUNCH = float(os.environ.get("GPU_SMOKE_T0", time.time()))  # set by the parent: process start
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from smoke_real import apply_cap, make_real_shot, planned_sizes, real_overrides  # noqa: E402
from smoke_vae import vae_drift  # noqa: E402

log = logging.getLogger("gpu_smoke")

RUNS = ("default", "fast", "vae")  # also: fast-seq (fast with pipeline.overlap: false), real, gguf


def run_overrides(name: str, root: str, lora: str | None, args: argparse.Namespace) -> list[str]:
    """`--set` overrides of one run (see the module doc)."""
    out = [
        f"workspace.root={args.work}/ws-{name}", "gate.policy=all", "region.mode=full", "qc.enabled=false",
        "infinitetalk.profile=true", "audio.length_policy=fit", f"infinitetalk.weights={root}",
    ]  # fmt: skip
    out += ["infinitetalk.device=cpu"] if args.tiny else ["infinitetalk.mode=infinitetalk-480"]
    out += [f"infinitetalk.gpus_per_shot={args.gpus_per_shot}"] if args.gpus_per_shot > 1 else []
    if name == "real":  # a real face, the default gate and region mode, the fast preset (smoke_real.py)
        return real_overrides(out) + list(args.set or [])
    if name == "gguf":  # the GGUF root of --gguf (no LoRA merges into GGUF: the quality preset's steps)
        out = [o for o in out if not o.startswith("infinitetalk.weights=")]
        out += [f"infinitetalk.weights={args.work}/weights-gguf", f"infinitetalk.quant=gguf-{args.gguf}"]
        out.append(f"infinitetalk.steps={args.default_steps}")
    if name == "default":
        out.append(f"infinitetalk.steps={args.default_steps}")
    elif name.startswith("fast"):  # the step-distill LoRA is found in the root by the preset itself
        out += [f"infinitetalk.{kv}" for kv in args.fast.split(",") if kv]
        out += ["pipeline.overlap=false"] if name == "fast-seq" else []
    return out + list(args.set or [])


class GpuSampler:
    """NVML utilisation and memory of one GPU, sampled on a thread (no-op without a GPU or pynvml)."""

    def __init__(self, period_s: float = 0.02, index: int = 0):
        self.samples: list[tuple[float, int, int]] = []  # (time, util %, used bytes)
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no GPU, no NVML: nothing sampled
            self._nvml = None

    def __enter__(self) -> GpuSampler:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        nv, h = self._nvml, self._handle
        while not self._stop.is_set():
            util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            used = nv.nvmlDeviceGetMemoryInfo(h).used
            self.samples.append((time.perf_counter(), util, used))
            time.sleep(self.period_s)

    def idle_percent(self, t0: float, t1: float) -> float | None:
        window = [u for t, u, _ in self.samples if t0 <= t <= t1]
        return round(100.0 - sum(window) / len(window), 1) if window else None

    def peak_used_gib(self) -> float | None:
        return round(max(m for _, _, m in self.samples) / 2**30, 2) if self.samples else None


def frames_digest(path: Path) -> str:
    """SHA-256 of a video's decoded frames (the container's bytes differ between runs; the pixels must not)."""
    import hashlib

    from tasks.media.frames import iter_frames
    from tasks.media.probe import probe

    info = probe(path, frame_count="packets")
    h = hashlib.sha256()
    for frame in iter_frames(info, 0, info.frame_count):
        h.update(frame.tobytes())
    return h.hexdigest()


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    """One config in this process: load the models, render the shot, return its figures."""
    import torch

    from tasks import infinitetalk as it
    from tasks.config.pipeline import load_config
    from tasks.infinitetalk.options import resolve_device
    from tasks.infinitetalk.session import sampler_settings
    from tasks.infinitetalk.timing import Stopwatch
    from tasks.infinitetalk.tiny import tiny_hw
    from tasks.infinitetalk.warmup import warm_up_sizes
    from tasks.media.audio import prepare_dialogue
    from tasks.media.probe import probe
    from tasks.picture.geometry import ModelGeometry
    from tasks.render.shot import ShotJob
    from tasks.timeline.plan import plan_shot
    from tasks.timeline.shots import Shot

    import_s = time.time() - T_LAUNCH
    cap = apply_cap(args.cap_gib) if args.cap_gib and not args.tiny else None  # before any allocation
    work = Path(args.work)
    meta = json.loads((work / "root.json").read_text())
    cfg = load_config(overrides=run_overrides(args.one, meta["root"], meta["lora"], args))
    cuda = torch.cuda.is_available() and not args.tiny
    backend = it.InfiniteTalkBackend({}, config=cfg)
    t0 = time.perf_counter()
    calls: list[float] = []  # start time of every DiT call (in this process: gpus_per_shot 1 only)
    if args.gpus_per_shot > 1:  # the ShotWorker's ranks load the models; none in this process
        backend.shot_worker_config()
        hook = None
    else:
        models = backend.models("dit", "vae", "clip")
        hook = models["dit"].register_forward_pre_hook(
            lambda module, inputs: calls.append(time.perf_counter())
        )
    if cuda:
        torch.cuda.synchronize()
    models_s = time.perf_counter() - t0

    info = probe(work / ("real.mp4" if args.one == "real" else "shot.mp4"))
    run_dir = work / f"run-{args.one}"
    track = prepare_dialogue(
        work / "dub.wav",
        frame_count=info.frame_count,
        fps=info.fps,
        cfg=cfg.audio,
        out_wav=work / f"d-{args.one}.wav",
    )
    plan = plan_shot(Shot(0, 0, info.frame_count), info.fps, cfg.plan)

    def shot_job(out_name: str, config: Any) -> ShotJob:  # the film's caches in run_dir/film, shared
        return ShotJob(
            info.to_dict(), plan.to_dict(), track.to_dict(), (0, track.n_samples), str(run_dir / out_name),
            config.to_dict(), work_dir=str(run_dir),
        )  # fmt: skip

    job = shot_job("out.mkv", cfg)
    # the rest of the model load: the compile warm-up at every model size the shot uses (what the session
    # runs under "load" when the models are not warm yet), so the shot below is a resident worker's shot;
    # `real`: the planning step's decision first (face analysis on the CPU, kept for the render)
    geometry = ModelGeometry.for_video(info, cfg.frames.bucket)
    sizes = [tiny_hw(geometry.model_hw) if backend.tiny else geometry.model_hw]
    t0 = time.perf_counter()
    if args.one == "real":
        decision, sizes = planned_sizes(job, backend, cfg, info, plan, backend.tiny)
        log.info("planned decision: %s; model sizes %s", decision and decision.reason, sizes)
    plan_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm_up_sizes(backend, sizes, sampler_settings(backend.opts, cfg, plan, tiny=backend.tiny))
    warmup_s = time.perf_counter() - t0
    # once per film, not per shot: umT5 prompt embedding + wav2vec2 features of the whole dub track
    film_watch = Stopwatch("cpu", False)
    t0 = time.perf_counter()
    backend.prompt_embeddings(run_dir / "film", film_watch)
    backend.audio_features_file(run_dir / "film", Path(track.path), film_watch)
    film_s = time.perf_counter() - t0
    renders = []  # the shot rendered `--repeats` times, then again per `--then` variant (same process)
    kept = run_dir / "out.chunks" / "decision.json"  # `real`: the planning's decision, kept for the render
    decision_bytes = kept.read_bytes() if kept.is_file() else None
    variants = [("base", cfg, backend)]
    for k, extra in enumerate(args.then or []):
        base = run_overrides(args.one, meta["root"], meta["lora"], args)
        vcfg = load_config(overrides=[*base, *extra.split(";")])
        variants.append((f"then{k}:{extra}", vcfg, it.InfiniteTalkBackend({}, config=vcfg)))
    for label, vcfg, vbackend in variants:
        for r in range(args.repeats):
            name = "out.mkv" if (label, r) == ("base", 0) else f"{label.split(':')[0]}-{r}.mkv"
            if decision_bytes is not None:  # each render reads the planning's decision, as a film's shot
                seg = run_dir / f"{Path(name).stem}.chunks"
                seg.mkdir(parents=True, exist_ok=True)
                (seg / "decision.json").write_bytes(decision_bytes)
            got = render_once(shot_job(name, vcfg), vbackend, calls, plan, info, cuda, args)
            got["variant"], got["repeat"] = label, r
            renders.append(got)
            log.info(
                "[%s] %s repeat %d: %.2f GPU-s per video-s", args.one, label, r, got["gpu_s_per_video_s"]
            )
    if hook is not None:
        hook.remove()
    first = renders[0]
    spec = backend.load_spec(resolve_device(backend.opts.device))
    by_variant: dict[str, list[float]] = {}
    for got in renders:
        by_variant.setdefault(got["variant"], []).append(got["gpu_s_per_video_s"])
    return {
        **first,
        "run": args.one,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "overrides": run_overrides(args.one, meta["root"], meta["lora"], args),
        "spec": {
            k: str(getattr(spec, k))
            for k in (
                "device",
                "dtype",
                "vae_dtype",
                "fp8_compute",
                "fp8_attention",
                "attention_kernel",
                "sparse",
                "compile",
                "offload",
                "loras",
            )
        }
        | {"offload_reason": spec.offload_reason},
        "steps": backend.opts.steps,
        "load": {
            "import_s": round(import_s, 1),
            "models_s": round(models_s, 1),
            "compile_warmup_s": round(
                warmup_s, 1
            ),  # at load: two synthetic chunks (tasks.infinitetalk.warmup)
            "chunk1_extra_s": first["chunk1_extra_s"],  # chunk 1 wall - fastest chunk (first render)
            "film_prep_s": round(film_s, 1),  # once per film: umT5 + wav2vec2 load, prompt + audio features
            "plan_s": round(plan_s, 1),  # `real`: the planning step's decision (face analysis), off the GPU
            "warmup_sizes": [list(hw) for hw in sizes],
            "total_s": round(import_s + models_s + warmup_s, 1),
        },
        "cap_gib": args.cap_gib,
        "cap_fraction": cap,
        "gpus_per_shot": args.gpus_per_shot,
        "renders": renders,  # every render: its figures (the top level repeats the first one's)
        "medians": {v: round(statistics.median(xs), 3) for v, xs in by_variant.items()},  # GPU-s per video-s
    }


def render_once(
    job: Any, backend: Any, calls: list[float], plan: Any, info: Any, cuda: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One render of the shot by `backend` (models resident and warm, the film's caches made): its figures."""
    import torch

    from tasks.render.shot import render_shot_result

    calls.clear()  # the warm-up's, the film preparation's and earlier renders' DiT calls are not this one's
    chunk_ends: list[float] = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    others = [GpuSampler(index=i) for i in range(1, args.gpus_per_shot)]  # the ranks' other GPUs
    with GpuSampler() as sampler, contextlib.ExitStack() as stack:
        for other in others:
            stack.enter_context(other)
        t_shot = time.perf_counter()
        result = render_shot_result(
            job, backend=backend, on_progress=lambda f: chunk_ends.append(time.perf_counter())
        )
        shot_s = time.perf_counter() - t_shot
    t = result["timings_s"]
    from bench_shot import STAGES  # the per-shot benchmark's report rows (its "model load" row is 0 here)

    stages = {
        label: round(sum(t.get(k, 0.0) for k in keys), 3) for label, keys in STAGES if keys != ("load",)
    }
    if "sp_chunk" in t:  # gpus_per_shot > 1: the ranks' whole chunk (DiT + VAE + CLIP), timed here
        stages["SP chunk"] = t["sp_chunk"]
    stages["other"] = round(t["total"] - t.get("load", 0.0) - sum(stages.values()), 3)
    seconds = plan.num_frames / float(info.fps)
    per_chunk = max(1, len(calls) // len(plan.chunks))
    new_s = (plan.frame_num - plan.motion_frames) / plan.model_fps  # video seconds a middle chunk adds
    starts = [c - t_shot for c in calls[::per_chunk]]  # first DiT call of each chunk
    if not calls:  # gpus_per_shot > 1: chunk walls between chunk ends instead
        starts = [c - t_shot for c in chunk_ends]
    walls = [round(b - a, 2) for a, b in zip(starts, starts[1:], strict=False)]
    warmup = max(0.0, walls[0] - min(walls[1:])) if len(walls) > 1 else None  # compile warm-up in chunk 1
    # GPU idle: from chunk 2's first DiT call to the last chunk's last one (steady state, compile excluded)
    idle = sampler.idle_percent(calls[per_chunk], calls[-1]) if len(calls) > per_chunk + 1 else None
    return {
        "shot": {"seconds": round(seconds, 3), "frames": plan.num_frames, "chunks": len(plan.chunks)},
        "chunk1_extra_s": None if warmup is None else round(warmup, 1),
        "chunk_walls_s": walls,
        "dit_calls": len(calls),
        "dit_s_per_call": round(t.get("dit", 0.0) / max(1, len(calls)), 4),
        "shot_s": round(shot_s, 3),
        "stages_s": stages,
        "timings_s": t,
        "chunk_ends_s": [round(c - t_shot, 2) for c in chunk_ends],
        # the shot's tail: from the end of its last DiT call (last chunk's VAE, its paste + encode, join)
        "after_last_dit_s": round(shot_s - (calls[-1] - t_shot) - t.get("dit", 0.0) / len(calls), 2)
        if calls
        else None,
        "gpu_idle_pct": idle,
        "peak_alloc_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if cuda and args.gpus_per_shot == 1
        else None,  # this process's allocator: the ranks' own with gpus_per_shot > 1 (NVML per GPU)
        "peak_nvml_gib": sampler.peak_used_gib(),
        "peak_nvml_gib_per_gpu": [g.peak_used_gib() for g in (sampler, *others)],
        "frames_sha256": frames_digest(Path(result["path"])),  # the same frames on 1 and N GPUs?
        "gpu_s_per_video_s": round(shot_s / seconds, 2),
        "gpu_s_per_video_s_steady": round(statistics.median(walls[1:]) / new_s, 2)
        if len(walls) > 1
        else None,
    }


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """The weights root (written unless `root.json` says it is there) and the shot + dub files."""
    from bench_shot import make_dub, make_shot
    from real_root import write_real_root

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    meta_file = work / "root.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
    else:
        meta = write_real_root(work / "weights", tiny=args.tiny)
        meta_file.write_text(json.dumps(meta))
    runs = args.runs.split(",")
    if "gguf" in runs and not (work / "weights-gguf").is_dir():
        if not args.gguf:
            raise SystemExit("gpu_smoke: the gguf run needs --gguf Q8_0|Q4_K")
        from real_root import write_gguf_root

        meta["gguf"] = write_gguf_root(work / "weights-gguf", meta["root"], args.gguf, tiny=args.tiny)
    if "real" in runs and not (work / "real.mp4").is_file():
        make_real_shot(work / "real.mp4", args.seconds, (640, 360) if args.tiny else (1920, 1080))
    if args.clip:
        shutil.copyfile(args.clip, work / "shot.mp4")
    elif not (work / "shot.mp4").is_file():
        size = (320, 180) if args.tiny else (1280, 720)
        make_shot(work / "shot.mp4", args.seconds, size, 24)
    make_dub(work / "dub.wav", args.seconds)
    return meta


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The short table printed last."""
    lines = [f"root {meta['root']}: {meta['bytes'] or 0:.3g} bytes written in {meta['write_s']} s"]
    for r in results:
        if "error" in r:
            lines.append(f"[{r['run']}] FAILED: {r['error']}")
            continue
        if r["run"] == "vae":
            lines.append(f"[vae] {r}")
            continue
        s = r["shot"]
        lines.append(
            f"[{r['run']}] {r['device']}: load {r['load']['total_s']} s (imports {r['load']['import_s']} + models "
            f"{r['load']['models_s']} + warm-up {r['load']['compile_warmup_s']}), film prep "
            f"{r['load']['film_prep_s']} s, shot {s['seconds']} s / {s['chunks']} chunks in {r['shot_s']} s = "
            f"{r['gpu_s_per_video_s']} GPU-s per video-s; {r['dit_calls']} DiT calls x {r['dit_s_per_call']} s; "
            f"chunk walls {r['chunk_walls_s']}; GPU idle {r['gpu_idle_pct']} %; peak {r['peak_alloc_gib']} GiB alloc / {r['peak_nvml_gib']} GiB NVML"
        )
        lines.append("    " + "  ".join(f"{k} {v:.2f}" for k, v in r["stages_s"].items()))
        if len(r.get("renders", [])) > 1:  # --repeats / --then: every render, then the medians
            for g in r["renders"]:
                lines.append(
                    f"    {g['variant']} #{g['repeat']}: {g['gpu_s_per_video_s']} GPU-s per video-s, shot "
                    f"{g['shot_s']} s, {g['dit_calls']} DiT calls x {g['dit_s_per_call']} s, chunk walls "
                    f"{g['chunk_walls_s']}, after the last DiT call {g['after_last_dit_s']} s, frames {g['frames_sha256'][:12]}"
                )
            lines.append(f"    medians (GPU-s per video-s): {r['medians']}")
        lines.append(f"    spec {r['spec']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke run with the tiny random root")
    p.add_argument("--work", default=None, help="work folder (weights root, shot, runs; default: a temp dir)")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {RUNS}")
    p.add_argument("--default-steps", type=int, default=2, help="sampling steps of the default run")
    p.add_argument("--fast", default="preset=fast", help="infinitetalk overrides of the fast runs (k=v,k=v)")
    p.add_argument("--budget", type=float, default=None, help="skip runs that would start after this many s")
    p.add_argument("--set", action="append", help="another override for every run (section.key=value)")
    p.add_argument("--seconds", type=float, default=None, help="shot length (default 10; --tiny: 2)")
    p.add_argument("--clip", default=None, help="use this shot instead of generating one")
    p.add_argument("--timeout", type=float, default=540, help="seconds per run")
    p.add_argument("--json", default=None, help="write every figure here")
    p.add_argument("--gpus-per-shot", type=int, default=1, help="infinitetalk.gpus_per_shot of every run")
    p.add_argument("--cap-gib", type=float, default=None, help="cap the CUDA allocator (a 24 / 16 GiB card)")
    p.add_argument("--gguf", default=None, help="the gguf run's random real-size root type: Q8_0 | Q4_K")
    p.add_argument("--repeats", type=int, default=1, help="renders of the shot per run (median reported)")
    p.add_argument("--then", action="append", help="after the repeats, render again (as many times) with "
                   "these extra overrides, same process and models (k=v;k=v: sampler-only keys, e.g. "
                   "infinitetalk.step_subset=[0,1,2])")  # fmt: skip
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: one run in this process
    args = p.parse_args(argv)
    args.seconds = args.seconds or (2.0 if args.tiny else 10.0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if args.one:
        out = vae_drift(args) if args.one == "vae" else one_run(args)
        Path(args.json).write_text(json.dumps(out, indent=1))
        return 0
    args.work = args.work or tempfile.mkdtemp(prefix="gpu_smoke.")
    meta = prepare(args)
    results = []
    t_start = time.time()
    for name in args.runs.split(","):
        if args.budget is not None and time.time() - t_start > args.budget:
            results.append({"run": name, "error": f"skipped: past the {args.budget} s budget"})
            continue
        out_json = Path(args.work) / f"{name}.json"
        cmd = [sys.executable, __file__, "--one", name, "--work", args.work, "--json", str(out_json)]
        cmd += [
            "--default-steps",
            str(args.default_steps),
            "--fast",
            args.fast,
            "--seconds",
            str(args.seconds),
        ]
        cmd += ["--tiny"] if args.tiny else []
        cmd += ["--gpus-per-shot", str(args.gpus_per_shot)]
        cmd += ["--cap-gib", str(args.cap_gib)] if args.cap_gib else []
        cmd += ["--gguf", args.gguf] if args.gguf else []
        cmd += ["--repeats", str(args.repeats)]
        for extra in args.then or []:
            cmd += ["--then", extra]
        for s in args.set or []:
            cmd += ["--set", s]
        env = {**os.environ, "GPU_SMOKE_T0": repr(time.time())}
        try:
            proc = subprocess.run(cmd, env=env, timeout=args.timeout, check=False)
            ok = proc.returncode == 0 and out_json.is_file()
            results.append(
                json.loads(out_json.read_text()) if ok else {"run": name, "error": f"exit {proc.returncode}"}
            )
        except subprocess.TimeoutExpired:
            results.append({"run": name, "error": f"timed out after {args.timeout} s"})
    if args.json:
        Path(args.json).write_text(json.dumps({"root": meta, "runs": results}, indent=1))
    print(report(results, meta))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
