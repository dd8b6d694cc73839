"""Guidance maths for InfiniteTalk: text/audio classifier-free guidance and APG.

Pure functions of *named* model predictions, so the sampler loop never has to know which
combination it runs. Branch names are shared with the DiT's `branch` kwarg and the TeaCache:

* ``cond``       – real text context, real audio
* ``drop_text``  – null text context, real audio
* ``uncond``     – null text context, null (zero, batch-1) audio
* ``drop_audio`` – real text context, null audio (only when the text scale is 1)

With a text guidance scale of 1 only ``cond`` and ``drop_audio`` are needed (2 calls per step);
with both scales 1 (distilled 4-step LoRAs) guidance vanishes and ``cond`` alone is evaluated
(1 call); otherwise ``cond``, ``drop_text`` and ``uncond`` (3 calls), always in that order.

APG (adaptive projected guidance, arXiv:2410.02416) replaces each guidance difference by its
momentum-averaged, norm-clipped component orthogonal to the conditional prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

BRANCHES_FULL: tuple[str, ...] = ("cond", "drop_text", "uncond")
BRANCHES_TEXT_SCALE_1: tuple[str, ...] = ("cond", "drop_audio")
BRANCHES_NO_GUIDANCE: tuple[str, ...] = ("cond",)

_NORM_DIMS = (-4, -3, -2, -1)  # (C, T, H, W) of a latent, batch dims left alone


def _no_guidance(text_guide_scale: float, audio_guide_scale: float | None) -> bool:
    return (
        audio_guide_scale is not None
        and math.isclose(text_guide_scale, 1.0)
        and math.isclose(audio_guide_scale, 1.0)
    )


def guidance_branches(text_guide_scale: float, audio_guide_scale: float | None = None) -> tuple[str, ...]:
    """Model branches a step evaluates, in call order.

    1 when both scales are 1 (the combination is then exactly ``cond``), 2 when only the text
    scale is 1, else 3. Without `audio_guide_scale` the official 2/3-call rule applies.
    """
    if _no_guidance(text_guide_scale, audio_guide_scale):
        return BRANCHES_NO_GUIDANCE
    return BRANCHES_TEXT_SCALE_1 if math.isclose(text_guide_scale, 1.0) else BRANCHES_FULL


def cfg_combine(
    preds: dict[str, torch.Tensor], text_guide_scale: float, audio_guide_scale: float
) -> torch.Tensor:
    """Vanilla dual CFG: the velocity prediction before the Euler sign flip.

    3 branches: ``uncond + s_t (cond - drop_text) + s_a (drop_text - uncond)``;
    text scale 1: ``drop_audio + s_a (cond - drop_audio)``; both scales 1 with only ``cond``
    evaluated: ``cond``.
    """
    if set(preds) == set(BRANCHES_NO_GUIDANCE) and _no_guidance(text_guide_scale, audio_guide_scale):
        return preds["cond"]
    if math.isclose(text_guide_scale, 1.0):
        drop_audio = preds["drop_audio"]
        return drop_audio + audio_guide_scale * (preds["cond"] - drop_audio)
    cond, drop_text, uncond = preds["cond"], preds["drop_text"], preds["uncond"]
    return uncond + text_guide_scale * (cond - drop_text) + audio_guide_scale * (drop_text - uncond)


@dataclass
class MomentumBuffer:
    """Running average ``avg <- d + momentum * avg`` of one guidance difference (starts at 0)."""

    momentum: float
    running_average: torch.Tensor | None = None

    def update(self, diff: torch.Tensor) -> torch.Tensor:
        if self.running_average is None:
            self.running_average = diff.clone()
        else:
            self.running_average = diff + self.momentum * self.running_average
        return self.running_average


@dataclass
class APGState:
    """Per-run APG state: one momentum buffer per guidance difference.

    The official loop makes fresh buffers at the start of every chunk; the sampler does the same
    by building a new `APGState` per chunk. `last_norms` holds the diff norms (after momentum,
    before clipping) of the latest step, for logging and tests only.
    """

    momentum: float = -0.75
    norm_threshold: float = 55.0
    text: MomentumBuffer = field(init=False)
    audio: MomentumBuffer = field(init=False)
    last_norms: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.text = MomentumBuffer(self.momentum)
        self.audio = MomentumBuffer(self.momentum)


def adaptive_projected_guidance(
    diff: torch.Tensor,
    pred_cond: torch.Tensor,
    buffer: MomentumBuffer | None,
    norm_threshold: float,
    eta: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """APG of one guidance difference. Returns (guidance, ||diff|| after momentum).

    diff, pred_cond: (..., C, T, H, W); norms and projections are over the last four dims.
    The projection runs in float64 like the reference implementation.
    """
    if buffer is not None:
        diff = buffer.update(diff)
    norm = torch.linalg.vector_norm(diff, ord=2, dim=_NORM_DIMS, keepdim=True)  # (..., 1, 1, 1, 1)
    if norm_threshold > 0:
        diff = diff * torch.minimum(torch.ones_like(diff), norm_threshold / norm)
    d64, c64 = diff.double(), pred_cond.double()
    unit = c64 / torch.linalg.vector_norm(c64, ord=2, dim=_NORM_DIMS, keepdim=True).clamp_min(1e-12)
    parallel = (d64 * unit).sum(dim=_NORM_DIMS, keepdim=True) * unit
    orthogonal = d64 - parallel
    return (orthogonal.to(diff.dtype) + eta * parallel.to(diff.dtype)), norm


def apg_combine(
    preds: dict[str, torch.Tensor],
    text_guide_scale: float,
    audio_guide_scale: float,
    state: APGState,
) -> torch.Tensor:
    """Dual guidance with APG on both differences (velocity before the Euler sign flip).

    3 branches: ``cond + (s_t-1) APG(cond - drop_text) + (s_a-1) APG(drop_text - uncond)``;
    text scale 1: ``cond + (s_a-1) APG(cond - drop_audio)``. Buffers in `state` are updated.
    """
    cond = preds["cond"]
    if set(preds) == set(BRANCHES_NO_GUIDANCE) and _no_guidance(text_guide_scale, audio_guide_scale):
        return cond
    thr = state.norm_threshold
    if math.isclose(text_guide_scale, 1.0):
        g_audio, n_audio = adaptive_projected_guidance(cond - preds["drop_audio"], cond, state.audio, thr)
        state.last_norms = {"audio": n_audio}
        return cond + (audio_guide_scale - 1) * g_audio
    drop_text = preds["drop_text"]
    g_text, n_text = adaptive_projected_guidance(cond - drop_text, cond, state.text, thr)
    g_audio, n_audio = adaptive_projected_guidance(drop_text - preds["uncond"], cond, state.audio, thr)
    state.last_norms = {"text": n_text, "audio": n_audio}
    return cond + (text_guide_scale - 1) * g_text + (audio_guide_scale - 1) * g_audio
