"""Speed of the dubflow DiT paths on one GPU, every figure next to the floor measured in the same run.

One process measures, in this order (each section is skipped when the time budget `--budget-s`
would not cover it; skipped and failed sections are listed in the output):

  rates      the card's bf16 GEMM rate at the model's shapes (L x 5120 x {5120, 13824}, L x 13824 x
             5120), fp8 row-wise `torch._scaled_mm` at the same shapes, a separate activation
             quantization pass, and self-attention [1, 40, L, 128] through SDPA flash vs cuDNN
  bf16       480P forward: eager with plain SDPA (the old path), eager with the `auto` backend
             (cuDNN first), regional `torch.compile` of the blocks; a kernel profile of the compiled
             forward; full sampling steps (3-call and 2-call guidance, sequential vs batched
             branches, through `model.sampling.sampler.denoise_chunk`); 720P forward
  teacache   the cost of a reused (skipped) call and the share of computed calls over a 40-step
             schedule under the official rule (random weights: the share is this model's, not a
             trained one's)
  fp8        the same model converted in place (`model.weights.fp8.convert_to_fp8`): eager (quantization
             unfused) and compiled forward, drift vs the bf16 output, steps, 720P
  fp8attn    bf16 and fp8-GEMM forwards with self-attention as cuDNN's fp8 kernel (backend
             `cudnn_fp8`, `model.network.cudnn_attention`), drift vs the bf16 compiled output, kernel profile;
             with --fp8-attention the later sections keep that backend
  offload    fp8 blocks streamed from pinned host memory (`model.runtime.offload.BlockOffload`) under a
             24 GiB cap (`torch.cuda.set_per_process_memory_fraction`)
  vae        Wan VAE encode / decode of 81 frames at 480P, fp32 and bf16 (`bench_vae.random_vae`)
  encoders   CLIP ViT-H/14 on one frame (per chunk) and umT5-XXL on 512 tokens (per shot)
  chunk      whole chunks through `model.sampling.stream.stream_generate` (fast mode: 4 steps, fp8, 1 call)
             with split DiT / VAE / encoders, CPU post-processing inline vs on a `Prefetcher`
             thread, and GPU idle %; quality mode (40 steps, 3 calls) composed from measured parts

Floor (FLOPs of one forward from the config, `bench_dit.forward_flops`): linear 2 L P_tok +
self-attention 4 L^2 D N + cross-attention and small terms; floor seconds = FLOPs / (bf16 GEMM
rate at the model's shapes, measured above). ratio = measured / floor. Timing: CUDA events, warm-up
first, median of the repeats; random weights built on the GPU (meta -> to_empty -> normal_).

    python3 benchmarks/bench_speed.py --json $OUT/speed.json --md $OUT/speed.md
    python benchmarks/bench_speed.py --tiny        # CPU smoke run of every section (tiny model)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
import time
import traceback
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_dit import SIZES, build_random_model, forward_flops  # noqa: E402
from bench_vae import random_vae  # noqa: E402

from model.config import DIT_PRESETS, DiTConfig  # noqa: E402
from model.network.dit import InfiniteTalkDiT  # noqa: E402
from model.network.dit_blocks import sinusoidal_embedding  # noqa: E402
from model.network.teacache import TeaCache, TeaCacheConfig  # noqa: E402
from model.network.vae_net import VAEConfig  # noqa: E402
from model.runtime.compile import compile_blocks, compiled_graph_count  # noqa: E402
from model.runtime.offload import BlockOffload  # noqa: E402
from model.runtime.prefetch import Prefetcher  # noqa: E402
from model.sampling.conditioning import Conditioning  # noqa: E402
from model.sampling.sampler import SamplerSettings, denoise_chunk, timestep_schedule  # noqa: E402
from model.sampling.stream import stream_generate  # noqa: E402
from model.weights.fp8 import convert_to_fp8, quantize_rows  # noqa: E402

GIB = 2**30
T_START = time.perf_counter()  # the budget counts from process start (imports included)


# ---------------------------------------------------------------------------------------------
# timing helpers
# ---------------------------------------------------------------------------------------------


class Clock:
    """CUDA-event (or host-clock on CPU) timing of a callable: warm-up, then the median of repeats."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, warmup: int = 1, repeats: int = 2, keep: dict | None = None) -> dict:
        out = None
        for _ in range(warmup):
            out = fn()
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                out = fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                out = fn()
                times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() / GIB if self.cuda else None
        if keep is not None:
            keep["out"] = out
        del out
        return {"seconds": statistics.median(times), "all": times, "peak_gib": peak, "n": repeats}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> dict:
    """max-abs and L2 relative error of a against b."""
    a, b = a.detach().double(), b.detach().double()
    return {
        "max_rel": float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)),
        "l2_rel": float((a - b).norm() / b.norm().clamp_min(1e-30)),
    }


class GpuMeter:
    """Sums device time of marked regions (CUDA events) to compare with wall time (GPU idle %)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.pairs: dict[str, list] = {}

    @contextlib.contextmanager
    def region(self, name: str):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self.pairs.setdefault(name, []).append((a, b))
        else:
            t0 = time.perf_counter()
            yield
            self.pairs.setdefault(name, []).append(time.perf_counter() - t0)

    def seconds(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return {k: sum(a.elapsed_time(b) for a, b in v) / 1e3 for k, v in self.pairs.items()}
        return {k: sum(v) for k, v in self.pairs.items()}


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.tiny = args.tiny
        self.cuda = not args.tiny
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.clock = Clock(self.cuda)
        self.t_start = T_START
        self.results: dict = {"sections": {}, "skipped": [], "failed": {}}
        self.rows: list[dict] = []  # the table
        self.config: DiTConfig = DIT_PRESETS["tiny"] if self.tiny else DIT_PRESETS["infinitetalk-14b"]
        self.sizes = {"480p": (4, 6), "720p": (6, 8)} if self.tiny else SIZES  # latent h, w
        self.frames = 3 if self.tiny else 21  # latent frames (81 video frames)
        self.warmup, self.repeats = (1, 1) if self.tiny else (1, 2)
        self.model: InfiniteTalkDiT | None = None
        self.gemm_rate: float | None = None  # TFLOP/s
        self.compile_backend = "eager" if self.tiny else "inductor"
        self.state: dict = {}

    # --- bookkeeping ---

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def remaining(self) -> float:
        return self.args.budget_s - self.elapsed()

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {msg}", flush=True)

    def save(self) -> None:
        if self.args.json:
            self.args.json.parent.mkdir(parents=True, exist_ok=True)
            self.args.json.write_text(json.dumps({**self.results, "rows": self.rows}, indent=2, default=str))

    def section(self, name: str, est_s: float, fn, reserve_s: float = 0.0) -> None:
        """Run fn() if the budget covers est_s plus what later must-run sections reserve."""
        if self.args.only and name not in self.args.only:
            return
        if not self.tiny and self.remaining() - reserve_s < est_s:
            self.log(
                f"skip {name}: {self.remaining():.0f}s left, needs ~{est_s:.0f}s (+{reserve_s:.0f}s reserved)"
            )
            self.results["skipped"].append(name)
            return
        t0 = time.perf_counter()
        self.log(f"section {name} (est {est_s:.0f}s)")
        try:
            self.results["sections"][name] = fn() or {}
        except Exception as exc:  # report and go on: one broken path must not cost the whole lease
            self.log(f"FAILED {name}: {exc!r}")
            self.results["failed"][name] = traceback.format_exc(limit=6)
            if self.cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        self.results.setdefault("section_seconds", {})[name] = time.perf_counter() - t0
        self.log(f"section {name} done in {time.perf_counter() - t0:.1f}s")
        self.save()

    def row(
        self, what: str, size: str, seconds: float, floor_s: float | None, peak: float | None, **extra
    ) -> None:
        r = {
            "what": what,
            "size": size,
            "seconds": seconds,
            "floor_s": floor_s,
            "ratio": None if not floor_s else seconds / floor_s,
            "peak_gib": peak,
            **extra,
        }
        self.rows.append(r)
        ratio = "" if r["ratio"] is None else f" ratio {r['ratio']:.2f}"
        self.log(f"ROW {what} {size}: {seconds:.3f}s{ratio} peak {peak}")

    # --- inputs ---

    def inputs(self, size: str, batch: int = 1, speakers: int = 1, seed: int = 1) -> dict:
        c, dev, dtype = self.config, self.device, self.dtype
        h, w = self.sizes[size]
        f_pix = 1 + c.vae_scale * (self.frames - 1)
        g = torch.Generator(device=dev).manual_seed(seed)

        def rnd(*shape):
            return torch.randn(*shape, device=dev, generator=g).to(dtype)

        return {
            "x": torch.randn(batch, c.out_dim, self.frames, h, w, device=dev, generator=g),
            "t": torch.full((batch,), 900.0, device=dev),
            "context": rnd(batch, c.text_len, c.text_dim),
            "clip_fea": rnd(1, c.clip_tokens, c.clip_dim),
            "y": rnd(1, c.in_dim - c.out_dim, self.frames, h, w),
            "audio": rnd(speakers, f_pix, c.audio_window, c.audio_blocks, c.audio_channels),
            "ref_target_masks": torch.ones(3, h, w, device=dev),
        }

    def forward(self, inp: dict, **kw) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(
                inp["x"], inp["t"], inp["context"], inp["clip_fea"], inp["y"], inp["audio"],
                inp["ref_target_masks"], **kw,
            )  # fmt: skip

    def floor(self, size: str, calls: int = 1, speakers: int = 1) -> float | None:
        if not self.gemm_rate:
            return None
        h, w = self.sizes[size]
        flops = forward_flops(self.config, self.frames, h, w, speakers)["total"]
        return calls * flops / (self.gemm_rate * 1e12)

    # --- sections ---

    def env(self) -> dict:
        info = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if self.cuda else "cpu",
            "tiny": self.tiny,
            "argv": sys.argv,
        }
        if self.cuda:
            info["capability"] = list(torch.cuda.get_device_capability())
            info["cudnn"] = torch.backends.cudnn.version()
            info["total_gib"] = torch.cuda.get_device_properties(0).total_memory / GIB
        self.results["env"] = info
        self.log(f"env {info}")
        return info

    def rates(self) -> dict:
        c = self.config
        tokens = 64 if self.tiny else 32760
        d, f = c.dim, c.ffn_dim
        shapes = {"qkvo LxDxD": (tokens, d, d), "ffn1 LxDxF": (tokens, d, f), "ffn2 LxFxD": (tokens, f, d)}
        out: dict = {"bf16": {}, "fp8": {}}
        reps = 2 if self.tiny else 10
        for name, (m, k, n) in shapes.items():
            a = torch.randn(m, k, device=self.device, dtype=self.dtype)
            b = torch.randn(n, k, device=self.device, dtype=self.dtype)
            t = self.clock.time(lambda a=a, b=b: a @ b.t(), warmup=2, repeats=reps)["seconds"]
            out["bf16"][name] = 2 * m * k * n / t / 1e12
            if self.cuda:
                qa, sa = quantize_rows(a)
                qb, sb = quantize_rows(b)
                t8 = self.clock.time(
                    lambda qa=qa, qb=qb, sa=sa, sb=sb: torch._scaled_mm(
                        qa, qb.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16
                    ),
                    warmup=2,
                    repeats=reps,
                )["seconds"]
                out["fp8"][name] = 2 * m * k * n / t8 / 1e12
                out.setdefault("quantize_pass_ms", {})[name] = (
                    self.clock.time(lambda a=a: quantize_rows(a), warmup=2, repeats=reps)["seconds"] * 1e3
                )
            del a, b
        # FLOP-weighted rate over one block's GEMMs: 8 D x D (self q k v o, cross q o, audio q proj) + 2 FFN
        flops = {"qkvo LxDxD": 8 * d * d, "ffn1 LxDxF": d * f, "ffn2 LxFxD": d * f}
        total = sum(flops.values())
        self.gemm_rate = total / sum(flops[k] / out["bf16"][k] for k in flops)
        out["bf16_model_rate"] = self.gemm_rate
        if out["fp8"]:
            out["fp8_model_rate"] = total / sum(flops[k] / out["fp8"][k] for k in flops)
        n = 256 if self.tiny else 8192
        a = torch.randn(n, n, device=self.device, dtype=self.dtype)
        out["bf16_8192"] = (
            2 * n**3 / self.clock.time(lambda a=a: a @ a, warmup=2, repeats=reps)["seconds"] / 1e12
        )
        del a
        # self-attention at the 480P shape, SDPA flash vs cuDNN
        from torch.nn.attention import SDPBackend, sdpa_kernel

        heads, hd = c.num_heads, c.head_dim
        q, k, v = (torch.randn(1, heads, tokens, hd, device=self.device, dtype=self.dtype) for _ in range(3))
        attn_flops = 4 * tokens * tokens * hd * heads
        out["attention"] = {}
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
        if self.tiny:
            backends = {"math": SDPBackend.MATH}
        for name, be in backends.items():
            try:

                def run(be=be, q=q, k=k, v=v):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q, k, v)

                t = self.clock.time(run, warmup=2, repeats=3 if self.cuda else 1)["seconds"]
                out["attention"][name] = attn_flops / t / 1e12
            except RuntimeError as exc:
                out["attention"][name] = f"unavailable: {exc}"[:200]
        del q, k, v
        self.log(f"rates {json.dumps(out, default=str)}")
        return out

    def build(self) -> dict:
        t0 = time.perf_counter()
        if self.tiny:
            from model.weights.tiny import random_dit_state

            model = InfiniteTalkDiT(self.config)
            model.load_state_dict(random_dit_state(self.config, seed=0))
            self.model = model.eval().requires_grad_(False)
        else:
            self.model = build_random_model(self.config)
            torch.cuda.synchronize()
        n = sum(p.numel() for p in self.model.parameters())
        return {"build_s": time.perf_counter() - t0, "params": n}

    def bf16_forward(self) -> dict:
        out = {}
        inp = self.inputs("480p")
        self.state["inp480"] = inp
        label = "bf16" if self.cuda else "fp32"
        outs = {}
        for backend in ("sdpa", "auto"):
            self.model.attn_backend = backend
            keep: dict = {}
            try:
                r = self.clock.time(lambda: self.forward(inp), warmup=1, repeats=1, keep=keep)
            except Exception as exc:  # a kernel rejecting a shape must not stop the run: fall back
                self.log(f"backend {backend} failed: {exc!r}")
                out[backend] = f"failed: {exc!r}"[:300]
                continue
            self.row(f"{label} eager attn={backend}", "480p", r["seconds"], self.floor("480p"), r["peak_gib"])
            out[backend] = r
            outs[backend] = keep["out"].float().cpu()
        self.model.attn_backend = "auto" if "auto" in outs else "sdpa"
        self.state["eager_out"] = outs[self.model.attn_backend]
        if len(outs) == 2:
            out["auto_vs_sdpa"] = rel_err(outs["auto"], outs["sdpa"])
            self.log(f"auto vs sdpa {out['auto_vs_sdpa']}")
        return out

    def bf16_compiled(self) -> dict:
        inp = self.state["inp480"]
        compile_blocks(self.model, backend=self.compile_backend)
        g0 = compiled_graph_count()
        t0 = time.perf_counter()
        try:
            ref = self.forward(inp)
            self.clock.sync()
        except Exception:
            torch.compiler.set_stance("force_eager")  # later sections then measure eager
            self.results["compile_fallback"] = "bf16 compile failed: eager from here on"
            raise
        compile_s = time.perf_counter() - t0
        r = self.clock.time(lambda: self.forward(inp), warmup=0, repeats=self.repeats)
        label = "bf16" if self.cuda else "fp32"
        self.row(
            f"{label} compiled", "480p", r["seconds"], self.floor("480p"), r["peak_gib"], compile_s=compile_s
        )
        self.state["bf16_out"] = ref.float().cpu()
        self.state["compile_s"] = compile_s
        return {
            **r,
            "compile_s": compile_s,
            "graphs": compiled_graph_count() - g0,
            "vs_eager": rel_err(self.state["bf16_out"], self.state["eager_out"]),
        }

    def profile(self) -> dict:
        """Kernel time by name for one compiled 480P forward (where the remaining time goes)."""
        from torch.profiler import ProfilerActivity, profile

        inp = self.state["inp480"]
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        with profile(activities=acts) as prof:
            self.forward(inp)
            self.clock.sync()
        from torch.autograd import DeviceType

        rows = []
        for e in prof.key_averages():
            if self.cuda and getattr(e, "device_type", None) != DeviceType.CUDA:
                continue  # kernels only (CPU-side ops would count their kernels twice)
            ms = (e.self_device_time_total if self.cuda else e.self_cpu_time_total) / 1e3
            rows.append((e.key, ms, e.count))
        kernels = sorted(rows, key=lambda r: -r[1])
        total = sum(r[1] for r in kernels)
        top = [{"name": n[:110], "ms": round(ms, 2), "count": cnt} for n, ms, cnt in kernels[:25]]
        for t in top[:12]:
            self.log(f"  prof {t['ms']:9.1f} ms x{t['count']:5d}  {t['name']}")
        return {"top": top, "total_ms": total}

    def steps(self, tag: str, reserve_s: float = 0.0) -> dict:
        """One full sampling step through denoise_chunk: 3 and 2 calls, sequential vs batched."""
        c, dev, dtype = self.config, self.device, self.dtype
        inp = self.state["inp480"]
        g = torch.Generator(device=dev).manual_seed(3)
        context_null = torch.randn(1, c.text_len, c.text_dim, device=dev, generator=g).to(dtype)
        latent = inp["x"][:1].float()
        motion = latent[:, :, :1].clone()
        out = {}
        order = [(3, False), (3, True), (2, True), (2, False)]
        fwd = 2.5 if tag == "fp8" else 3.5  # rough seconds per 480P call, for the budget check only
        compiled_batch = False
        for calls, batched in order:
            need = calls * fwd * (2 if batched else 1)
            if batched and not compiled_batch:
                need += self.state.get("compile_s", 60.0)
            if not self.tiny and self.remaining() - reserve_s < need:
                self.log(f"skip step {tag} {calls}-call batched={batched}: budget (needs ~{need:.0f}s)")
                continue
            compiled_batch = compiled_batch or batched
            settings = SamplerSettings(
                sampling_steps=1, text_guide_scale=5.0 if calls == 3 else 1.0, batch_branches=batched
            )
            ts = timestep_schedule(1, settings.shift).to(dev)

            def step(settings=settings, ts=ts):
                with torch.inference_mode():
                    return denoise_chunk(
                        self.model, latent, motion, ts, start_step=0, context=inp["context"][:1],
                        context_null=context_null, clip_fea=inp["clip_fea"], y=inp["y"],
                        audio=inp["audio"], ref_target_masks=inp["ref_target_masks"], settings=settings,
                        generator=torch.Generator(device=dev).manual_seed(0), draw_motion_noise=False,
                    )  # fmt: skip

            # batched steps meet the batch>=2 graph first: that warm-up (compile) is not timed
            r = self.clock.time(step, warmup=1 if batched else 0, repeats=1)
            name = f"{tag}{self.attn_note} step {calls}-call {'batched' if batched else 'sequential'}"
            self.row(name, "480p", r["seconds"], self.floor("480p", calls), r["peak_gib"])
            out[f"{calls}_{'batched' if batched else 'sequential'}"] = r
        return out

    @property
    def attn_note(self) -> str:
        """Row-label suffix when the DiT runs cuDNN fp8 attention (--fp8-attention)."""
        return " + fp8 attn" if self.model is not None and self.model.attn_backend == "cudnn_fp8" else ""

    def forward_720(self, tag: str) -> dict:
        inp = self.inputs("720p")
        r = self.clock.time(lambda: self.forward(inp), warmup=1, repeats=1)
        self.row(f"{tag} compiled{self.attn_note}", "720p", r["seconds"], self.floor("720p"), r["peak_gib"])
        return r

    def teacache(self) -> dict:
        """Cost of a reused call, and the share of computed calls over the 40-step schedule."""
        c, dev = self.config, self.device
        steps = 40
        ts = timestep_schedule(steps, 7.0).to(dev)[:-1]
        cache = TeaCache(TeaCacheConfig(threshold=0.2), sample_steps=steps)
        with torch.inference_mode():
            e = self.model.time_embedding(sinusoidal_embedding(ts, c.freq_dim))  # (steps, dim)
            e0 = self.model.time_projection(e).unflatten(1, (6, c.dim))
            for i in range(steps):
                if cache.should_compute("cond", e[i : i + 1], e0[i : i + 1]):
                    cache.store_residual("cond", torch.zeros(1, device=dev))
        computed = sum(d.computed for d in cache.decisions)
        inp = self.state["inp480"]
        reuse = TeaCache(TeaCacheConfig(threshold=1e9, use_ret_steps=False), sample_steps=100)
        self.forward(inp, teacache=reuse)  # computes and stores the residual
        r = self.clock.time(lambda: self.forward(inp, teacache=reuse), warmup=1, repeats=3)
        assert not reuse.decisions[-1].computed
        self.row("teacache reused call", "480p", r["seconds"], None, r["peak_gib"])
        return {"computed_of_40": computed, "reused_call": r}

    def fp8(self) -> dict:
        if "inp480" not in self.state:  # focused rerun (--only): no bf16 sections before this one
            self.state["inp480"] = self.inputs("480p")
        if not any(getattr(b, "_compiled_call_impl", None) for b in self.model.blocks):
            compile_blocks(self.model, backend=self.compile_backend)
        t0 = time.perf_counter()
        n = convert_to_fp8(self.model)
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        convert_s = time.perf_counter() - t0
        inp = self.state["inp480"]
        out: dict = {"converted": n, "convert_s": convert_s}
        # eager fp8: the activation quantization runs as separate passes
        try:
            if self.args.only:
                raise RuntimeError("skipped in a focused (--only) run")
            with torch.compiler.set_stance("force_eager"):
                r = self.clock.time(lambda: self.forward(inp), warmup=1, repeats=1)
            self.row(
                f"fp8{self.attn_note} eager (unfused quant)",
                "480p",
                r["seconds"],
                self.floor("480p"),
                r["peak_gib"],
            )
            out["eager"] = r
        except Exception as exc:  # keep the compiled measurement below
            out["eager"] = f"failed: {exc!r}"
            self.log(f"fp8 eager failed: {exc!r}")
        t1 = time.perf_counter()
        try:
            res = self.forward(inp)
            self.clock.sync()
        except Exception:
            torch.compiler.set_stance("force_eager")  # offload / chunk / steps then run eager fp8
            self.results["compile_fallback"] = "fp8 compile failed: eager from here on"
            raise
        compile_s = time.perf_counter() - t1
        r = self.clock.time(lambda: self.forward(inp), warmup=0, repeats=self.repeats)
        self.row(
            f"fp8 compiled{self.attn_note}",
            "480p",
            r["seconds"],
            self.floor("480p"),
            r["peak_gib"],
            compile_s=compile_s,
        )
        out["compiled"] = {**r, "compile_s": compile_s}
        self.state["fp8_out"] = res.float().cpu()
        if "bf16_out" in self.state:
            out["drift_vs_bf16_compiled"] = rel_err(res.float().cpu(), self.state["bf16_out"])
            out["drift_vs_bf16_eager"] = rel_err(res.float().cpu(), self.state["eager_out"])
            out["bf16_compiled_vs_eager"] = rel_err(self.state["bf16_out"], self.state["eager_out"])
            self.log(f"fp8 drift {out['drift_vs_bf16_compiled']}")
        return out

    def fp8_attention(self, tag: str) -> dict:
        """The model as it is now (bf16 or fp8 GEMMs), self-attention as cuDNN's fp8 kernel."""
        if "inp480" not in self.state:
            self.state["inp480"] = self.inputs("480p")
        inp = self.state["inp480"]
        if not any(getattr(b, "_compiled_call_impl", None) for b in self.model.blocks):
            compile_blocks(self.model, backend=self.compile_backend)
        previous = self.model.attn_backend
        self.model.attn_backend = "cudnn_fp8"
        try:
            t0 = time.perf_counter()
            res = self.forward(inp)
            self.clock.sync()
            compile_s = time.perf_counter() - t0
            r = self.clock.time(lambda: self.forward(inp), warmup=0, repeats=self.repeats)
            what = f"{tag} compiled + fp8 attention (cuDNN)"
            self.row(what, "480p", r["seconds"], self.floor("480p"), r["peak_gib"], compile_s=compile_s)
            out: dict = {**r, "compile_s": compile_s}
            res = res.float().cpu()
            for ref in ("bf16_out", "fp8_out"):
                if ref in self.state:
                    out[f"drift_vs_{ref}"] = rel_err(res, self.state[ref])
                    self.log(f"{what} drift vs {ref}: {out[f'drift_vs_{ref}']}")
            if tag == "fp8":
                out["profile"] = self.profile()
        finally:
            if not self.args.fp8_attention:
                self.model.attn_backend = previous
        return out

    def offload(self) -> dict:
        inp = self.state["inp480"]
        cap_gib = 24.0
        t0 = time.perf_counter()
        off = BlockOffload(self.model, self.device, slots=2)
        setup_s = time.perf_counter() - t0
        out = {"setup_s": setup_s, "block_gib": off.block_bytes / GIB}
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(cap_gib * GIB / total)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            off.device_buffers[0].copy_(off.host[-1], non_blocking=True)
            b.record()
            b.synchronize()
            out["h2d_gb_s"] = off.block_bytes / (a.elapsed_time(b) / 1e3) / 1e9
            out["resident_gib_after_offload"] = torch.cuda.memory_allocated() / GIB
        g0 = compiled_graph_count()
        keep: dict = {}
        try:
            r = self.clock.time(lambda: self.forward(inp), warmup=1, repeats=self.repeats, keep=keep)
        finally:
            if self.cuda:
                torch.cuda.set_per_process_memory_fraction(1.0)
        out["recompiles"] = compiled_graph_count() - g0
        if "fp8_out" in self.state:
            out["vs_resident_fp8"] = rel_err(keep["out"].float().cpu(), self.state["fp8_out"])
            self.log(f"offload vs resident {out['vs_resident_fp8']}")
        self.row(
            f"fp8 compiled{self.attn_note} + block offload ({cap_gib:.0f} GiB cap)", "480p", r["seconds"], self.floor("480p"),
            r["peak_gib"], h2d_gb_s=out.get("h2d_gb_s"),
        )  # fmt: skip
        out["forward"] = r
        if self.args.offload_chunk and self.cuda:  # whole chunks while offloaded, under the same cap
            torch.cuda.set_per_process_memory_fraction(cap_gib * GIB / total)
            try:
                torch.cuda.reset_peak_memory_stats()
                out["chunk"] = self.chunk(note=f" + block offload, {cap_gib:.0f} GiB cap")
                out["chunk_peak_gib"] = torch.cuda.max_memory_allocated() / GIB
                self.log(f"chunks under the cap: peak {out['chunk_peak_gib']:.1f} GiB")
            finally:
                torch.cuda.set_per_process_memory_fraction(1.0)
        t1 = time.perf_counter()
        off.remove()  # back to resident for the sections after this one
        out["remove_s"] = time.perf_counter() - t1
        return out

    def vae(self) -> dict:
        cfg = VAEConfig(dim=8) if self.tiny else VAEConfig()
        h, w = (32, 48) if self.tiny else (480, 832)
        frames = 9 if self.tiny else 81
        out = {}
        for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            if self.tiny and dname == "bf16":
                continue
            vae = random_vae(cfg, str(self.device), dtype)
            g = torch.Generator(device=self.device).manual_seed(2)
            video = torch.rand(1, 3, frames, h, w, device=self.device, generator=g) * 2 - 1
            lat = torch.randn(1, 16, 1 + (frames - 1) // 4, h // 8, w // 8, device=self.device, generator=g)
            if self.cuda:
                torch.cuda.empty_cache()
            weights = torch.cuda.memory_allocated() / GIB if self.cuda else 0.0
            enc = self.clock.time(lambda vae=vae, video=video: vae.encode(video), warmup=1, repeats=1)
            dec = self.clock.time(lambda vae=vae, lat=lat: vae.decode(lat), warmup=1, repeats=1)
            self.row(f"VAE {dname} encode {frames}f", "480p", enc["seconds"], None, enc["peak_gib"])
            self.row(f"VAE {dname} decode {frames}f", "480p", dec["seconds"], None, dec["peak_gib"])
            out[dname] = {"encode": enc, "decode": dec, "base_gib": weights}
            if self.cuda:
                out[dname]["decode_bytes_per_pixel"] = (dec["peak_gib"] - weights) * GIB / (h * w)
            if dname == "fp32":
                self.state["vae"] = vae
        return out

    def encoders(self) -> dict:
        out = {}
        from model.network.clip import CLIP_CONFIGS, ClipImageEncoder, build_clip

        name = "tiny-1280" if self.tiny else "vit-h-14"
        with torch.device(self.device):
            clip_model = build_clip(CLIP_CONFIGS[name], device=self.device)
        clip = ClipImageEncoder(clip_model.to(torch.float16 if self.cuda else torch.float32))
        frame = torch.rand(1, 3, 1, 480, 832, device=self.device) * 2 - 1
        r = self.clock.time(lambda: clip.encode(frame), warmup=1, repeats=3)
        self.row("CLIP ViT-H/14 one frame (per chunk)", "480p", r["seconds"], None, r["peak_gib"])
        out["clip"] = r
        self.state["clip"] = clip
        if not self.tiny and self.remaining() > 120:
            from model.network.t5 import T5Config, build_umt5

            with torch.device(self.device):
                t5 = build_umt5(T5Config()).to(torch.bfloat16).eval()
            ids = torch.randint(0, 256384, (1, 512), device=self.device)
            mask = torch.ones(1, 512, dtype=torch.long, device=self.device)

            def run():
                with torch.inference_mode():
                    return t5(input_ids=ids, attention_mask=mask).last_hidden_state

            r = self.clock.time(run, warmup=1, repeats=3)
            self.row("umT5-XXL 512 tokens (per shot)", "-", r["seconds"], None, r["peak_gib"])
            out["t5"] = r
            del t5
            torch.cuda.empty_cache()
        return out

    def chunk(self, note: str = "") -> dict:
        """Whole chunks through stream_generate (fast mode), CPU post-processing inline vs overlapped."""
        c, dev, dtype = self.config, self.device, self.dtype
        vae_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[self.args.chunk_vae]
        vae = self.state.get("vae") if vae_dtype == torch.float32 else None
        if vae is None:
            vae = random_vae(VAEConfig(dim=8) if self.tiny else VAEConfig(), str(dev), vae_dtype)
        clip = self.state.get("clip")
        height, width = (32, 48) if self.tiny else (480, 832)
        frame_num, motion = (9, 1) if self.tiny else (81, 9)
        chunks = self.args.chunks
        n_frames = frame_num + (chunks - 1) * (frame_num - motion)
        g = torch.Generator(device=dev).manual_seed(4)
        meter = GpuMeter(self.cuda)
        dit = self.model

        class TimedDiT:
            """fast mode without guidance: at text/audio scales 1 the sampler makes one `cond` call per
            step (`model.sampling.guidance.guidance_branches`); this only times it."""

            def __call__(self, x, *, t, context, clip_fea, y, audio, ref_target_masks, **kw):
                with meter.region("dit"):
                    return dit(x, t, context, clip_fea, y, audio, ref_target_masks, **kw)

            def timestep_modulation(self, t):
                return dit.timestep_modulation(t)

        class TimedVAE:
            def encode(self, video):
                with meter.region("vae_encode"):
                    return vae.encode(video)

            def decode(self, latent):
                with meter.region("vae_decode"):
                    return vae.decode(latent)

        clip_out = torch.randn(1, c.clip_tokens, c.clip_dim, device=dev).to(dtype)

        def clip_fn(ref):
            with meter.region("clip"):
                return clip.encode(ref).to(dtype) if clip is not None else clip_out

        cond = Conditioning(
            context=torch.randn(1, c.text_len, c.text_dim, device=dev, generator=g).to(dtype),
            context_null=torch.randn(1, c.text_len, c.text_dim, device=dev, generator=g).to(dtype),
            audio=[
                torch.randn(n_frames, c.audio_blocks, c.audio_channels, device=dev, generator=g).to(dtype)
            ],
            ref_target_masks=torch.ones(3, height // 8, width // 8, device=dev),
            clip_fn=clip_fn,
        )
        ref_frame = torch.rand(3, 1, height, width, device=dev, generator=g) * 2 - 1
        settings = SamplerSettings(
            frame_num=frame_num, motion_frames=motion, sampling_steps=4, shift=5.0,
            text_guide_scale=1.0, audio_guide_scale=1.0, batch_branches=True, color_correction_strength=0.0,
        )  # fmt: skip
        canvas_hw = (1080, 1920) if not self.tiny else (64, 96)

        def post_process(frames_u8: np.ndarray) -> int:
            """Stand-in CPU work per chunk: colour statistics + match, paste into a full-HD canvas,
            lossless compression (zlib level 1 in place of the video encoder)."""
            f = frames_u8.astype(np.float32)
            mean, std = f.mean(axis=(1, 2), keepdims=True), f.std(axis=(1, 2), keepdims=True) + 1e-3
            f = np.clip((f - mean) / std * 50.0 + 128.0, 0, 255).astype(np.uint8)
            canvas = np.zeros((f.shape[0], *canvas_hw, 3), np.uint8)
            canvas[:, : f.shape[1], : f.shape[2]] = f
            return len(zlib.compress(canvas.tobytes(), 1))

        def run(mode: str) -> dict:
            meter.pairs.clear()
            pf = Prefetcher(depth=2, name="post")
            cpu_inline = 0.0
            marks: list[tuple[float, float]] = []  # (wall time, GPU busy so far) at each chunk end

            def on_chunk(out):
                nonlocal cpu_inline
                self.clock.sync()
                marks.append((time.perf_counter(), sum(meter.seconds().values())))
                u8 = ((out.frames.float() + 1) * 127.5).clamp(0, 255).to(torch.uint8)
                host = u8.permute(1, 2, 3, 0).contiguous().cpu().numpy()  # (T, H, W, 3)
                if mode == "prefetch":
                    while len(pf) >= pf.depth:  # backpressure: take the oldest writer's result first
                        pf.next()
                    pf.submit(post_process, host, name=f"post chunk {out.spec.index}")
                else:
                    t0 = time.perf_counter()
                    post_process(host)
                    cpu_inline += time.perf_counter() - t0

            self.clock.sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                stream_generate(
                    TimedDiT(), TimedVAE(), cond=cond, settings=settings,
                    reference_frame_fn=lambda i, s: ref_frame, on_chunk=on_chunk, collect=False,
                )  # fmt: skip
            pf.drain()
            self.clock.sync()
            wall = time.perf_counter() - t0
            pf.close()
            gpu = meter.seconds()
            busy = sum(gpu.values())
            res = {
                "wall_s": wall,
                "per_chunk_s": wall / chunks,
                "gpu_s": gpu,
                "gpu_idle_pct": 100.0 * (1 - busy / wall),
                "cpu_post_s": pf.busy_seconds if mode == "prefetch" else cpu_inline,
                "vae": self.args.chunk_vae,
                "chunks": chunks,
            }
            if len(marks) >= 3:  # steady state: between the first and the last chunk end (no ramp, no tail)
                span, gpu_span = marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]
                res["steady_per_chunk_s"] = span / (len(marks) - 1)
                res["steady_gpu_idle_pct"] = 100.0 * (1 - gpu_span / span)
            label = f"chunk fast fp8{self.attn_note}{note} 4 steps 1 call, VAE {self.args.chunk_vae}, {chunks} chunks, CPU post {mode}"
            self.row(
                label, "480p", res["per_chunk_s"], None, None,
                gpu_idle_pct=res["gpu_idle_pct"], split={k: v / chunks for k, v in gpu.items()},
            )  # fmt: skip
            if "steady_per_chunk_s" in res:
                self.row(
                    f"  steady state (chunks 2..{chunks}, {mode})", "480p", res["steady_per_chunk_s"], None, None,
                    gpu_idle_pct=res["steady_gpu_idle_pct"], split={},
                )  # fmt: skip
            return res

        out = {}
        for mode in self.args.chunk_modes:
            if mode == "inline" and not self.tiny and self.remaining() < 60:
                continue
            out[mode] = run(mode)
        return out

    def composed(self) -> dict:
        """Quality mode (40 steps, 3 calls) per chunk from measured parts; fast mode 2 calls likewise."""
        s = self.results["sections"]
        chunk = s.get("chunk", {}).get("prefetch")
        if not chunk:
            return {}
        gpu = chunk["gpu_s"]
        chunks = 2
        non_dit = chunk["per_chunk_s"] - gpu.get("dit", 0.0) / chunks  # VAE, CLIP, host work per chunk
        out = {"non_dit_per_chunk_s": non_dit}
        for tag in ("fp8", "bf16"):
            steps = s.get(f"{tag}_steps", {})
            for calls, key in ((3, "3_batched"), (2, "2_batched"), (3, "3_sequential")):
                if key in steps:
                    n = 40 if calls == 3 else 4
                    total = n * steps[key]["seconds"] + non_dit
                    mode = "quality 40 steps" if calls == 3 else "fast 4 steps"
                    label = f"chunk {mode} {tag} {calls}-call {key.split('_')[1]} (composed)"
                    self.row(label, "480p", total, None, None)
                    out[label] = total
        return out


def table(run: Run) -> str:
    r = run.results
    env = r.get("env", {})
    rates = r["sections"].get("rates", {})
    lines = [
        f"device {env.get('device')}  torch {env.get('torch')}  cudnn {env.get('cudnn')}  {env.get('date')}",
    ]
    if rates:
        lines.append(
            "bf16 GEMM model shapes "
            + ", ".join(f"{k} {v:.0f}" for k, v in rates["bf16"].items())
            + f" -> {rates['bf16_model_rate']:.0f} TFLOP/s (8192^3: {rates['bf16_8192']:.0f})"
        )
        if rates.get("fp8"):
            lines.append(
                "fp8 _scaled_mm rowwise "
                + ", ".join(f"{k} {v:.0f}" for k, v in rates["fp8"].items())
                + f" -> {rates['fp8_model_rate']:.0f} TFLOP/s; separate quantize pass ms "
                + ", ".join(f"{v:.2f}" for v in rates.get("quantize_pass_ms", {}).values())
            )
        att = rates.get("attention", {})
        lines.append(
            "attention [1,H,L,Dh] "
            + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in att.items())
            + " TFLOP/s"
        )
    lines.append(
        f"| {'what':58} | {'size':5} | {'s':>8} | {'floor s':>7} | {'ratio':>5} | {'peak GiB':>8} | note |"
    )
    lines.append("|" + "---|" * 7)
    for row in run.rows:
        floor = "" if row["floor_s"] is None else f"{row['floor_s']:.3f}"
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        peak = "" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"
        note = []
        if "compile_s" in row:
            note.append(f"compile {row['compile_s']:.0f}s")
        if "gpu_idle_pct" in row:
            note.append(f"GPU idle {row['gpu_idle_pct']:.1f}%")
            note.append("split " + ", ".join(f"{k} {v:.2f}s" for k, v in row["split"].items()))
        if row.get("h2d_gb_s"):
            note.append(f"H2D {row['h2d_gb_s']:.1f} GB/s")
        lines.append(
            f"| {row['what']:58} | {row['size']:5} | {row['seconds']:8.3f} | {floor:>7} | {ratio:>5} | {peak:>8} | {'; '.join(note)} |"
        )
    if r["skipped"]:
        lines.append(f"skipped (budget): {', '.join(r['skipped'])}")
    if r["failed"]:
        lines.append(f"FAILED: {', '.join(r['failed'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke run of every section with the tiny model")
    p.add_argument("--budget-s", type=float, default=420.0, help="skip sections that would run past this")
    p.add_argument("--only", nargs="*", default=None, help="run only these sections")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--md", type=Path, default=None, help="write the table (markdown) here")
    p.add_argument(
        "--chunk-vae", choices=("fp32", "bf16"), default="fp32", help="VAE dtype of the chunk runs"
    )
    p.add_argument(
        "--fp8-attention", action="store_true", help="keep cuDNN fp8 attention for the sections after fp8attn"
    )
    p.add_argument(
        "--offload-chunk",
        action="store_true",
        help="offload section: also whole chunks while offloaded, under the cap",
    )
    p.add_argument("--chunks", type=int, default=2, help="chunks per chunk run (>= 3 gives steady state)")
    p.add_argument("--chunk-modes", nargs="+", default=["prefetch", "inline"], choices=("prefetch", "inline"))
    args = p.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        p.error("needs CUDA; use --tiny for a CPU smoke run")
    torch._dynamo.config.cache_size_limit = 16  # bf16/fp8 x batch 1/2-3 x speakers share one code object
    run = Run(args)
    run.section("env", 0, run.env)
    run.section("rates", 20, run.rates)
    run.section("build", 10, run.build)
    if run.model is None:
        print(table(run))
        return 1
    # Sections in priority order of what each later one needs; bf16 must run before the in-place fp8
    # conversion. `reserve_s` keeps time for the fp8 / offload / chunk sections that follow.
    run.section("bf16_forward", 20, run.bf16_forward)
    run.section("bf16_compiled", 80, run.bf16_compiled)
    # time the fp8 / offload / VAE / chunk sections need (one more compile, ~4 forwards, ~2 chunks)
    later = 0 if args.tiny else run.state.get("compile_s", 60.0) + 110
    run.section("profile", 6, run.profile, reserve_s=later)
    run.section("teacache", 6, run.teacache, reserve_s=later)
    run.section("bf16_fp8attn", 30, lambda: run.fp8_attention("bf16"), reserve_s=later)
    run.section("bf16_720p", 25, lambda: run.forward_720("bf16"), reserve_s=later)
    run.section("bf16_steps", 12, lambda: run.steps("bf16", reserve_s=later), reserve_s=later)
    run.section("fp8", 80, run.fp8)
    run.section("fp8_fp8attn", 30, lambda: run.fp8_attention("fp8"))
    run.section("offload", 25, run.offload, reserve_s=60)
    run.section("vae", 15, run.vae, reserve_s=40)
    run.section("chunk", 30, run.chunk)
    run.section("fp8_steps", 30, lambda: run.steps("fp8"))
    run.section("composed", 0, run.composed)
    run.section("fp8_720p", 18, lambda: run.forward_720("fp8"))
    run.section("encoders", 12, run.encoders)
    text = table(run)
    if args.md:
        args.md.write_text(text + "\n")
    run.save()
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
