"""InfiniteTalk's price (the backend's `price` and `shot_price` hooks): one full chunk under a config's
`infinitetalk:` settings (with `backend.options`) against the `estimate:` figures, and the model load a
two-speaker shot adds (the multi DiT swapped in, `tasks.infinitetalk.multi`). Pure, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from model.sampling.guidance import guidance_branches
from model.sampling.sampler import sampler_preset
from tasks.config.pipeline import PipelineConfig
from tasks.errors import ConfigError
from tasks.infinitetalk.options import resolve_options
from tasks.render.cost import ChunkPrice, shot_gpu_s
from tasks.timeline.plan import ShotPlan

TWO = "two"  # DubRegion.status of a two-speaker segment (tasks.infinitetalk.multi)


def chunk_price(cfg: PipelineConfig, *, fallbacks: bool = False) -> ChunkPrice:
    """The price of one full chunk from `cfg`'s `infinitetalk:` settings (with `backend.options`) and
    `estimate:` figures: the one pricing rule of `dubflow estimate` and of shot-group sizing.

    `fallbacks=True` replaces each null figure with its `cost.fallback_*` stand-in (group sizing must
    size groups even in tiny mode or at an unmeasured precision); pure, no I/O.
    """
    overrides = cfg.backend.options if cfg.backend.name == "infinitetalk" else {}
    opts = resolve_options(cfg, overrides, need_weights=False)
    preset = sampler_preset(opts.mode)
    steps = opts.steps if opts.steps is not None else preset.sampling_steps
    subset = None if opts.step_subset is None else tuple(opts.step_subset)
    run = dataclasses.replace(
        preset, sampling_steps=steps, step_subset=subset, denoise_strength=opts.denoise_strength
    )
    steps = run.steps_run
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


def switch_load_s(regions: Sequence[Mapping[str, Any]], load_s: float) -> float:
    """GPU seconds a shot adds for two speakers: two audio streams are ~free (the audio projection and
    cross-attention are a small part of a DiT block); the multi DiT must be resident, priced as one model
    load (the switch in; the switch back is the next one-speaker shot's)."""
    return load_s if any(r.get("status") == TWO and len(r.get("people") or ()) == 2 for r in regions) else 0.0


def shot_price(price: ChunkPrice, plan: ShotPlan, regions: Sequence[Mapping[str, Any]]) -> float:
    """GPU seconds of a dubbed shot: its chunks, plus one model load for a two-speaker segment."""
    return shot_gpu_s(plan, price.chunk_s) + switch_load_s(regions, price.load_s or 0.0)
