"""Random inputs of one sampler chunk for the tiny DiT, and one `denoise_chunk` run over them (shared by
the sampler-path and TeaCache tests)."""

from __future__ import annotations

import torch

from model.config import DiTConfig
from model.sampling.sampler import SamplerSettings, denoise_chunk, timestep_schedule


def chunk_inputs(cfg: DiTConfig, speakers: int = 1, seed: int = 0) -> dict:
    """`denoise_chunk` keyword inputs: 2 latent frames of 4x4, 1 motion frame, `speakers` audio tracks and
    two speaker masks (left / right half)."""
    g = torch.Generator().manual_seed(seed)
    frames, h, w = 2, 4, 4
    f_pix = 1 + cfg.vae_scale * (frames - 1)
    masks = torch.zeros(3, h, w)
    masks[0, :, :2] = 1
    masks[1, :, 2:] = 1
    return {
        "latent": torch.randn(1, 16, frames, h, w, generator=g),
        "motion_latent": torch.randn(1, 16, 1, h, w, generator=g),
        "context": torch.randn(1, 6, cfg.text_dim, generator=g),
        "context_null": torch.randn(1, 4, cfg.text_dim, generator=g),
        "clip_fea": torch.randn(1, cfg.clip_tokens, cfg.clip_dim, generator=g),
        "y": torch.randn(1, 20, frames, h, w, generator=g),
        "audio": torch.randn(speakers, f_pix, cfg.audio_window, 12, 768, generator=g),
        "ref_target_masks": masks,
    }


def run_chunk(model, settings: SamplerSettings, inp: dict, teacache=None) -> torch.Tensor:
    """`denoise_chunk` over `chunk_inputs` with `settings`' own schedule and start step (no grad)."""
    with torch.no_grad():
        return denoise_chunk(
            model,
            inp["latent"],
            inp["motion_latent"],
            timestep_schedule(settings.sampling_steps, settings.shift),
            start_step=settings.start_step,
            context=inp["context"],
            context_null=inp["context_null"],
            clip_fea=inp["clip_fea"],
            y=inp["y"],
            audio=inp["audio"],
            ref_target_masks=inp["ref_target_masks"],
            settings=settings,
            generator=torch.Generator().manual_seed(0),
            draw_motion_noise=False,
            teacache=teacache,
        )
