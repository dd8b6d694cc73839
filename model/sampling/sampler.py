"""InfiniteTalk sampler: settings, the flow-matching schedule and the denoise step loop of one chunk.

Holds `SamplerSettings` and its presets, the shifted timestep schedule, the forward noising and
Euler update, the model/VAE protocols, and `denoise_chunk` (one chunk's Euler loop over the 2-3
guidance branches, sequential or batched into one DiT call). It must not hold chunk planning or
audio windows (`model.sampling.chunks`), conditioning (`model.sampling.conditioning`) or the chunk-to-chunk
streaming loop and its state (`model.sampling.stream`); it never loads files, calls text/image encoders per
step, or touches ffmpeg.

Model contract (see `model/network/dit.py`)::

    model(x (B,16,F,h,w), t=(B,), context=(B,Lt,Dt), clip_fea=(B,257,1280), y=(B,20,F,h,w),
          audio=(S,F_pix,5,12,768), ref_target_masks=(M,h,w), teacache=..., branch=name)
          -> (B,16,F,h,w)

VAE contract (see `model/network/vae.py`): ``encode(video (B,3,T,H,W) in [-1,1]) -> (B,16,F,h,w)`` scaled
latent, ``decode(latent) -> (B,3,T,H,W)`` clamped to [-1,1].
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from model.sampling.chunks import VAE_TIME_STRIDE, PlanPolicy
from model.sampling.conditioning import FrameEncoder, branch_inputs
from model.sampling.guidance import APGState, apg_combine, cfg_combine, guidance_branches
from model.sampling.step import sampling_step

ColorReference = Literal["chunk", "first"]


class VelocityModel(Protocol):
    """The DiT as the sampler calls it (`model.network.dit.InfiniteTalkDiT`)."""

    def __call__(
        self,
        x: torch.Tensor,
        *,
        t: torch.Tensor,
        context: torch.Tensor,
        clip_fea: torch.Tensor,
        y: torch.Tensor,
        audio: torch.Tensor,
        ref_target_masks: torch.Tensor | None,
        teacache: object | None,
        branch: str,
    ) -> torch.Tensor: ...


class LatentCodec(FrameEncoder, Protocol):
    """The VAE as the sampler uses it (`model.network.vae.WanVAE`): `FrameEncoder.encode` and `decode`."""

    def decode(self, latent: torch.Tensor) -> torch.Tensor: ...


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplerSettings:
    """Sampling parameters of one run (defaults = official InfiniteTalk 480p CLI defaults).

    plan: ``"dubflow"`` sizes the final chunk to the shot (see `plan_chunks`); ``"official"``
        reproduces generate_infinitetalk's chunking, mirrored audio padding and final cut.
    color_reference: ``"chunk"`` matches each chunk's colours to its own reference frame
        (dubflow default); ``"first"`` to the first chunk's (what the official code does).
    denoise_strength: 1.0 starts from pure noise; s < 1 starts from the source chunk's latent
        noised to the schedule's timestep at step ``N - int(N*s)`` and skips earlier steps.
    max_frames: only for the official plan (its ``max_frames_num``).
    batch_branches: evaluate a step's 2-3 guidance branches as one batched DiT call (same numbers
        up to float rounding; one TeaCache decision per step, under the branch name
        ``"cond+drop_text+uncond"``) instead of one call per branch.
    step_subset: run only these steps (indices into the ``sampling_steps`` schedule, increasing), the
        last one's Euler update going straight to 0 (lossy, opt-in: e.g. ``(0, 1, 2)`` of the 4-step
        distilled schedule). None runs every step.
    """

    frame_num: int = 81
    motion_frames: int = 9
    sampling_steps: int = 40
    shift: float = 7.0
    text_guide_scale: float = 5.0
    audio_guide_scale: float = 4.0
    use_apg: bool = False
    apg_momentum: float = -0.75
    apg_norm_threshold: float = 55.0
    color_correction_strength: float = 1.0
    color_reference: ColorReference = "chunk"
    denoise_strength: float = 1.0
    seed: int = 42
    plan: PlanPolicy = "dubflow"
    max_frames: int = 1000
    num_train_timesteps: int = 1000
    batch_branches: bool = False
    step_subset: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.frame_num < 1 or (self.frame_num - 1) % VAE_TIME_STRIDE:
            raise ValueError(f"SamplerSettings.frame_num must be 4n+1, got {self.frame_num}")
        if not 1 <= self.motion_frames < self.frame_num:
            raise ValueError(
                f"SamplerSettings.motion_frames must be in [1, frame_num), got {self.motion_frames}"
            )
        if self.sampling_steps < 1:
            raise ValueError(f"SamplerSettings.sampling_steps must be >= 1, got {self.sampling_steps}")
        if not 0.0 < self.denoise_strength <= 1.0:
            raise ValueError(
                f"SamplerSettings.denoise_strength must be in (0, 1], got {self.denoise_strength}"
            )
        if not 0.0 <= self.color_correction_strength <= 1.0:
            raise ValueError(
                "SamplerSettings.color_correction_strength must be in [0, 1], "
                f"got {self.color_correction_strength}"
            )
        if self.color_reference not in ("chunk", "first"):
            raise ValueError(
                f"SamplerSettings.color_reference must be chunk|first, got {self.color_reference!r}"
            )
        if self.plan not in ("dubflow", "official"):
            raise ValueError(f"SamplerSettings.plan must be dubflow|official, got {self.plan!r}")
        subset = self.step_subset
        if subset is not None and (
            not subset
            or list(subset) != sorted(set(subset))
            or subset[0] < 0
            or subset[-1] >= self.sampling_steps
        ):
            raise ValueError(
                f"SamplerSettings.step_subset must be increasing step indices in [0, {self.sampling_steps}), "
                f"got {subset}"
            )

    @property
    def steps_run(self) -> int:
        """Steps of the schedule that is run (`step_subset`'s length, else `sampling_steps`)."""
        return self.sampling_steps if self.step_subset is None else len(self.step_subset)

    @property
    def start_step(self) -> int:
        """Index of the first schedule step run (0 unless denoise_strength < 1)."""
        n = self.steps_run
        return n - min(int(n * self.denoise_strength), n)


SAMPLER_PRESETS: dict[str, SamplerSettings] = {
    "infinitetalk-480": SamplerSettings(shift=7.0),
    "infinitetalk-720": SamplerSettings(shift=11.0),
    "tiny": SamplerSettings(frame_num=13, motion_frames=5, sampling_steps=3),
}


def sampler_preset(name: str, **overrides: object) -> SamplerSettings:
    """A named preset (``infinitetalk-480``, ``infinitetalk-720``, ``tiny``) with field overrides."""
    if name not in SAMPLER_PRESETS:
        raise KeyError(f"unknown sampler preset {name!r}; known: {sorted(SAMPLER_PRESETS)}")
    return replace(SAMPLER_PRESETS[name], **overrides)


# --------------------------------------------------------------------------------------------
# Schedule and Euler update
# --------------------------------------------------------------------------------------------


def timestep_schedule(sampling_steps: int, shift: float, num_train_timesteps: int = 1000) -> torch.Tensor:
    """Shifted flow-matching timesteps: ``sampling_steps`` model timesteps then a final 0.

    ``t = linspace(T, 1, N)`` (float32) + [0], each mapped by ``T * s t' / (1 + (s-1) t')`` with
    ``t' = t/T`` in float32. Returns (N+1,) float32.
    """
    raw = np.linspace(num_train_timesteps, 1, sampling_steps, dtype=np.float32)
    t = torch.from_numpy(np.append(raw, np.float32(0.0)).astype(np.float32))  # (N+1,)
    t = t / num_train_timesteps
    t = shift * t / (1 + (shift - 1) * t)
    return t * num_train_timesteps


def run_schedule(settings: SamplerSettings) -> torch.Tensor:
    """The timesteps a run goes through: (steps_run + 1,) float32, the `step_subset` of the
    `sampling_steps` schedule (all of it by default) followed by the final 0."""
    full = timestep_schedule(settings.sampling_steps, settings.shift, settings.num_train_timesteps)
    if settings.step_subset is None:
        return full
    return full[[*settings.step_subset, settings.sampling_steps]]


def add_noise(
    original: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, num_train_timesteps: int = 1000
) -> torch.Tensor:
    """Flow-matching forward process ``(1 - t/T) x + (t/T) noise``.

    t: (B,) or (1,) timesteps, broadcast over the remaining dims of `original`.
    """
    s = t.float() / num_train_timesteps
    s = s.view(s.shape + (1,) * (original.dim() - s.dim()))
    return (1 - s) * original + s * noise


def euler_update(
    latent: torch.Tensor,
    velocity: torch.Tensor,
    t: torch.Tensor,
    t_next: torch.Tensor,
    num_train_timesteps: int = 1000,
) -> torch.Tensor:
    """One Euler step ``x + (-v) (t - t_next)/T``; t, t_next: (1,) or (B,) tensors."""
    dt = (t - t_next) / num_train_timesteps
    dt = dt.view(dt.shape + (1,) * (latent.dim() - dt.dim()))
    return latent + (-velocity) * dt


# --------------------------------------------------------------------------------------------
# Batched guidance branches and the denoise step loop
# --------------------------------------------------------------------------------------------


def with_batch_dim(x: torch.Tensor, ndim: int) -> torch.Tensor:
    """`x` with a leading batch dim of 1 added unless it already has `ndim` dims."""
    return x if x.dim() == ndim else x.unsqueeze(0)


def _batched_branches(
    model: VelocityModel,
    latent: torch.Tensor,
    t: torch.Tensor,
    calls: dict[str, tuple[torch.Tensor, torch.Tensor]],
    clip_fea: torch.Tensor,
    y: torch.Tensor,
    ref_target_masks: torch.Tensor,
    teacache=None,
) -> dict[str, torch.Tensor]:
    """All guidance branches of one step as one DiT call of batch len(calls).

    Contexts are zero-padded to a common length (the DiT zero-pads to text_len anyway); audio is
    stacked per sample (B, S_max, F_pix, 5, 12, 768) with zero slots for branches with fewer
    speakers, which `audio_speakers` tells the DiT to ignore (null audio stays one speaker).
    """
    names = list(calls)
    contexts = [with_batch_dim(c, 3) for c, _ in calls.values()]  # (1, Lt_i, Dt) each
    length = max(c.shape[1] for c in contexts)
    context = torch.cat([F.pad(c, (0, 0, 0, length - c.shape[1])) for c in contexts])  # (B, Lt, Dt)
    audios = [a for _, a in calls.values()]  # (S_i, F_pix, 5, 12, 768) each
    slots = max(a.shape[0] for a in audios)
    audio = torch.stack([F.pad(a, (0, 0) * (a.dim() - 1) + (0, slots - a.shape[0])) for a in audios])
    out = model(
        latent.expand(len(names), -1, -1, -1, -1),
        t=t.expand(len(names)),
        context=context,
        clip_fea=clip_fea,
        y=y,
        audio=audio,  # (B, S_max, F_pix, 5, 12, 768)
        ref_target_masks=ref_target_masks,
        audio_speakers=[a.shape[0] for a in audios],
        teacache=teacache,
        branch="+".join(names),
    ).float()  # (B, 16, F, h, w)
    return {name: out[i : i + 1] for i, name in enumerate(names)}


def denoise_chunk(
    model: VelocityModel,
    latent: torch.Tensor,
    motion_latent: torch.Tensor,
    timesteps: torch.Tensor,
    *,
    start_step: int,
    context: torch.Tensor,
    context_null: torch.Tensor,
    clip_fea: torch.Tensor,
    y: torch.Tensor,
    audio: torch.Tensor,
    ref_target_masks: torch.Tensor,
    settings: SamplerSettings,
    generator: torch.Generator,
    draw_motion_noise: bool,
    teacache=None,
) -> torch.Tensor:
    """Euler sampling of one chunk from ``timesteps[start_step]`` to 0.

    latent: (1, 16, F, h, w) initial latent; motion_latent: (1, 16, T_m, h, w), written clean into
    the first T_m latent frames before every step and after every update. With
    ``draw_motion_noise`` one ``randn`` of the motion-latent shape is drawn before the loop and
    after every update: the official loop writes ``add_noise(motion, that noise, t)`` there and
    immediately overwrites it with the clean latent, so only the draws matter (they shift the
    noise of later chunks); the dead write is skipped.
    """
    t_m = motion_latent.shape[2]
    # official plan mode keeps the official call pattern (it never drops below 2 calls)
    audio_scale = None if settings.plan == "official" else settings.audio_guide_scale
    branches = guidance_branches(settings.text_guide_scale, audio_scale)
    calls = branch_inputs(branches, context, context_null, audio)
    apg = APGState(settings.apg_momentum, settings.apg_norm_threshold) if settings.use_apg else None

    def motion_noise() -> None:
        if draw_motion_noise:
            torch.randn(
                motion_latent.shape, generator=generator, dtype=torch.float32, device=generator.device
            )

    motion_noise()
    latent = latent.clone()
    batched = settings.batch_branches and len(calls) > 1
    if teacache is not None and hasattr(model, "timestep_modulation"):  # TeaCache decisions: no sync per call
        teacache.prepare_schedule(
            model.timestep_modulation,
            timesteps[start_step : settings.steps_run],
            len(calls) if batched else 1,
        )
    for i in range(start_step, settings.steps_run):
        t, t_next = timesteps[i : i + 1], timesteps[i + 1 : i + 2]  # (1,), (1,)
        latent[:, :, :t_m] = motion_latent
        with sampling_step(i - start_step):  # the DiT's per-step choices (dense or windowed attention)
            if batched:
                preds = _batched_branches(model, latent, t, calls, clip_fea, y, ref_target_masks, teacache)
            else:
                preds = {
                    name: model(
                        latent,
                        t=t,
                        context=ctx,
                        clip_fea=clip_fea,
                        y=y,
                        audio=aud,
                        ref_target_masks=ref_target_masks,
                        teacache=teacache,
                        branch=name,
                    ).float()
                    for name, (ctx, aud) in calls.items()
                }
        if apg is not None:
            velocity = apg_combine(preds, settings.text_guide_scale, settings.audio_guide_scale, apg)
        else:
            velocity = cfg_combine(preds, settings.text_guide_scale, settings.audio_guide_scale)
        latent = euler_update(latent, velocity, t, t_next, settings.num_train_timesteps)
        motion_noise()
        latent[:, :, :t_m] = motion_latent
    return latent
