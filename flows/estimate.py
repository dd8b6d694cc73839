"""`dubflow estimate`: what a film will cost before any GPU work, and the chunk price groups are sized by.

Probes the film, finds its shots, plans their chunks and runs the dub gate on each shot (speech in the
dub track's slice; for shots with speech, the face analysis: who on screen speaks, `tasks.decision.shot_decision`),
then prices the dubbed shots' chunks with the benchmark figures of the config's `estimate` section:

    GPU s = load_s + sum over chunks of (steps run x guidance branches x dit_forward_s + vae_chunk_s) x scale

`scale` is the chunk's latent frames over a full chunk's (a short last chunk costs less; attention makes
the real saving a little larger). A shot with a two-speaker segment adds one `load_s` (the multi DiT is
loaded in its place, `tasks.infinitetalk.multi`; its second audio stream is ~free). Figures that are not measured yet (null) are reported as missing and
the total is then a lower bound. TeaCache savings are not modelled (the estimate is an upper bound then).
Per-chunk CPU work (frame decode, colour, composite, FFV1 encode: ~3.5 s per 480P chunk in
benchmarks/bench_shot.py) is not counted either.

`chunk_price` is the one pricing rule: the film run sizes its shot groups (`flows.groups.GpuCost`) with
the same function, filling unmeasured figures with the `cost.fallback_*` stand-ins.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.prepare import LocalSteps, prepare_film
from tasks.config import PipelineConfig
from tasks.decision.cast import check_cast
from tasks.errors import ConfigError
from tasks.infinitetalk.multi import switch_load_s
from tasks.media.probe import VideoInfo
from tasks.timeline.plan import ShotPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShotEstimate:
    """One shot: the gate's decision and its chunks' GPU seconds (0 when not dubbed)."""

    index: int
    start_frame: int
    end_frame: int
    dub: bool
    reason: str
    chunks: int
    gpu_s: float
    # dubbed regions: [{"start_frame", "end_frame" (film frames), "box" (display pixels), "speaker", "score"}]
    regions: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class FilmEstimate:
    """The whole film: shots, the figures used, and the expected GPU time."""

    source: str
    frames: int
    fps: str
    display_width: int
    display_height: int
    mode: str
    precision: str
    steps: int
    branches: int
    dit_forward_s: float | None
    vae_chunk_s: float | None
    load_s: float | None
    shots: tuple[ShotEstimate, ...]
    missing: tuple[str, ...]  # figures that are not measured (null in the config)
    characters: tuple[dict[str, Any], ...] = ()  # the film's characters (tasks.decision.cast), when linked

    @property
    def dubbed(self) -> list[ShotEstimate]:
        return [s for s in self.shots if s.dub]

    @property
    def total_s(self) -> float:
        dubbed = self.dubbed
        return (self.load_s or 0.0) * bool(dubbed) + sum(s.gpu_s for s in dubbed)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shots"] = [{**dataclasses.asdict(s), "regions": list(s.regions)} for s in self.shots]
        d["missing"] = list(self.missing)
        d["dubbed_shots"] = len(self.dubbed)
        d["passthrough_shots"] = len(self.shots) - len(self.dubbed)
        d["dubbed_chunks"] = sum(s.chunks for s in self.dubbed)
        d["total_s"] = round(self.total_s, 1)
        d["lower_bound"] = bool(self.missing)
        return d

    def format(self) -> str:
        """The human-readable report `dubflow estimate` prints."""
        dubbed = self.dubbed
        chunks = sum(s.chunks for s in dubbed)
        lines = [
            f"{self.source}: {len(self.shots)} shots, {self.frames} frames at {self.fps} fps",
            f"mode {self.mode} ({self.precision}), {self.steps} steps x {self.branches} guidance branches",
            "",
            f"{'shot':>4}  {'frames':>10}  {'chunks':>6}  {'dub':>3}  {'GPU':>8}  reason",
        ]
        for s in self.shots:
            span = f"{s.start_frame}-{s.end_frame}"
            lines.append(
                f"{s.index:04d}  {span:>10}  {s.chunks:>6}  {'yes' if s.dub else 'no':>3}  "
                f"{_hms(s.gpu_s) if s.dub else '-':>8}  {s.reason}"
            )
        lines += [
            "",
            f"dubbed: {len(dubbed)} shots ({sum(s.end_frame - s.start_frame for s in dubbed)} frames, {chunks} chunks); "
            f"passthrough: {len(self.shots) - len(dubbed)} shots",
            f"expected GPU time: {'at least ' if self.missing else ''}{_hms(self.total_s)} "
            f"(model load {_fig(self.load_s)}, DiT forward {_fig(self.dit_forward_s)}, VAE per chunk "
            f"{_fig(self.vae_chunk_s)})",
        ]
        if self.missing:
            lines.append(f"not measured (null in estimate:): {', '.join(self.missing)}")
        for c in self.characters:
            lines.append(f"character {c['id']}{' = ' + c['name'] if c['name'] else ''}: shots {c['shots']}")
        return "\n".join(lines)


def _fig(x: float | None) -> str:
    return "unknown" if x is None else f"{x:g} s"


def _hms(seconds: float) -> str:
    s = round(seconds)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h}:{m:02d}:{s:02d}"


def latent_frames(frames: int) -> int:
    """Latent frames of a 4n+1-frame chunk."""
    return 1 + (frames - 1) // 4


def shot_gpu_s(plan: ShotPlan, per_full_chunk_s: float) -> float:
    """GPU seconds of a shot's chunks, each scaled by its latent frames over a full chunk's."""
    full = latent_frames(plan.frame_num)
    return sum(per_full_chunk_s * latent_frames(c.num_frames) / full for c in plan.chunks)


@dataclass(frozen=True)
class ChunkPrice:
    """GPU seconds of one full chunk under a config's InfiniteTalk settings, and the figures behind it.

    `missing` names the `estimate:` figures that are null for this mode/precision; `fallbacks` names the
    ones replaced by a `cost.fallback_*` stand-in (only when asked for: group sizing), the others count 0.
    """

    mode: str
    precision: str  # key of estimate.dit_forward_s.<mode>: dtype or quant, "fp8" for fp8 GEMMs, +fp8attn
    steps: int  # denoising steps run per chunk (after denoise_strength)
    branches: int  # guidance branches = DiT forwards per step
    dit_forward_s: float | None
    vae_chunk_s: float | None
    load_s: float | None  # one process's start-up: imports + loading every component
    missing: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()

    @property
    def chunk_s(self) -> float:
        """steps x branches x dit_forward_s + vae_chunk_s (unknown figures count 0)."""
        return self.steps * self.branches * (self.dit_forward_s or 0.0) + (self.vae_chunk_s or 0.0)

    def describe(self) -> str:
        """One line for logs: the formula with its figures and where unmeasured ones came from."""
        line = (
            f"{self.mode} ({self.precision}): {self.steps} steps x {self.branches} branches x "
            f"{_fig(self.dit_forward_s)} + VAE {_fig(self.vae_chunk_s)} = {self.chunk_s:.1f} s per full chunk, "
            f"model load {_fig(self.load_s)}"
        )
        if self.fallbacks:
            line += f"; not measured, stand-ins used: {', '.join(self.fallbacks)}"
        elif self.missing:
            line += f"; not measured (counted 0): {', '.join(self.missing)}"
        return line


def chunk_price(cfg: PipelineConfig, *, fallbacks: bool = False) -> ChunkPrice:
    """The price of one full chunk from `cfg`'s `infinitetalk:` settings (with `backend.options`) and
    `estimate:` figures: the one pricing rule of `dubflow estimate` and of shot-group sizing.

    `fallbacks=True` replaces each null figure with its `cost.fallback_*` stand-in (group sizing must
    size groups even in tiny mode or at an unmeasured precision); pure, no I/O.
    """
    from model.guidance import guidance_branches
    from model.sampler import sampler_preset
    from tasks.infinitetalk import resolve_options

    overrides = cfg.backend.options if cfg.backend.name == "infinitetalk" else {}
    opts = resolve_options(cfg, overrides, need_weights=False)
    preset = sampler_preset(opts.mode)
    steps = opts.steps if opts.steps is not None else preset.sampling_steps
    run = dataclasses.replace(preset, sampling_steps=steps, denoise_strength=opts.denoise_strength)
    branches = len(guidance_branches(opts.text_guide_scale, opts.audio_guide_scale))
    if opts.mode == "tiny":
        precision = "float32"  # tiny mode always runs float32
    else:
        # fp8 `auto` (the fast preset) is priced as on: the figures are an H200's, which has fp8
        precision = "fp8" if opts.fp8_compute else (opts.quant if opts.quant != "none" else opts.dtype)
        precision += "+fp8attn" if opts.fp8_attention else ""
    mode, est = opts.mode, cfg.estimate
    vae_key = mode if mode == "tiny" or opts.vae_dtype == "float32" else f"{mode}+{opts.vae_dtype}"
    wanted = (  # (the figure's key under estimate:, its value, the cost: key of its stand-in)
        (f"dit_forward_s.{mode}.{precision}", _lookup(est.dit_forward_s.get(mode), precision), "fallback_dit_forward_s"),
        (f"vae_chunk_s.{vae_key}", _lookup(est.vae_chunk_s, vae_key), "fallback_vae_chunk_s"),
        (f"load_s.{mode}", _lookup(est.load_s, mode), "fallback_load_s"),
    )  # fmt: skip
    values: list[float | None] = []
    missing: list[str] = []
    used: list[str] = []
    for name, value, stand_in in wanted:
        if value is not None:
            value = _check(value, "estimate", name)
        else:
            missing.append(name)
            if fallbacks:
                value = _check(getattr(cfg.cost, stand_in), "cost", stand_in)
                used.append(f"{name} -> cost.{stand_in}={value:g}")
        values.append(value)
    fwd, vae, load = values
    return ChunkPrice(
        mode=mode, precision=precision, steps=steps - run.start_step, branches=branches, dit_forward_s=fwd,
        vae_chunk_s=vae, load_s=load, missing=tuple(missing), fallbacks=tuple(used),
    )  # fmt: skip


def _lookup(table: Any, key: str) -> Any:
    """`table[key]` of an `estimate:` figure table (None when absent or null)."""
    return table.get(key) if isinstance(table, dict) else None


def _check(value: Any, section: str, key: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ConfigError(section, f"{key}: expected a finite number of seconds >= 0, got {value!r}")
    return float(value)


def estimate_film(
    source: str | Path,
    audio: str | Path,
    cfg: PipelineConfig,
    stems: dict[str, str] | None = None,
    *,
    work_dir: str | Path | None = None,
) -> FilmEstimate:
    """Shots, gate decisions, chunks and expected GPU seconds of dubbing `source` with `audio` (and the
    per-character dub ``stems`` {NAME: file}: characters and who speaks when, `tasks.decision.cast`): the
    film preparation (`flows.prepare.prepare_film`) as plain calls, then the price of each dubbed shot.
    The face analyses and embeddings are kept under ``work_dir`` (default: a temporary folder), where a
    later estimate finds them."""
    price = chunk_price(cfg)  # the one pricing rule, shared with shot-group sizing (checks the options first)
    check_cast(cfg, stems)  # stills exist, stems name characters: before any decoding
    with tempfile.TemporaryDirectory(prefix="dubflow-estimate-") as scratch:
        steps = LocalSteps(cfg, Path(scratch), Path(work_dir) if work_dir else None)
        film = prepare_film(str(source), str(audio), cfg, steps, stems=stems)
    out = []
    for r in film.records:
        plan, d = ShotPlan.from_dict(r["plan"]), r["decision"]
        regions = tuple(d["regions"])
        gpu = (
            shot_gpu_s(plan, price.chunk_s) + switch_load_s(list(regions), price.load_s or 0.0)
            if d["dub"]
            else 0.0
        )
        out.append(
            ShotEstimate(
                r["index"],
                plan.start_frame,
                plan.end_frame,
                d["dub"],
                d["reason"],
                len(plan.chunks),
                gpu,
                regions,
            )
        )
    width, height = VideoInfo.from_dict(film.video).display_size
    return FilmEstimate(
        source=str(source), frames=film.shots["frame_count"], fps=str(film.shots["fps"]), display_width=width,
        display_height=height, mode=price.mode, precision=price.precision, steps=price.steps,
        branches=price.branches, dit_forward_s=price.dit_forward_s, vae_chunk_s=price.vae_chunk_s,
        load_s=price.load_s, shots=tuple(out), missing=price.missing,
        characters=film.cast.characters if film.cast is not None else (),
    )  # fmt: skip
