"""InfiniteTalk's audio adapter: per-frame wav2vec2 windows -> `context_tokens` audio tokens per latent frame.

Latent frame 0 stands for video frame 0 alone; every later latent frame stands for `vae_scale` video
frames. Frame 0 feeds its whole `audio_window` window to `proj1`; each later group of `vae_scale`
frames contributes the first frame's window up to the centre, the centre slot of the middle frames and
the last frame's window from the centre on (`audio_window + vae_scale - 1` slots) to `proj1_vf`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import DiTConfig


def group_audio_windows(
    audio: torch.Tensor, audio_window: int, vae_scale: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split windows (N, F_pix, W, blocks, C) into frame 0 (N, 1, W, blocks, C) and per-latent-frame
    groups (N, (F_pix-1)/vae_scale, W + vae_scale - 1, blocks, C)."""
    n, f_pix, w = audio.shape[:3]
    if w != audio_window:
        raise ValueError(f"audio window {w} != config audio_window {audio_window}")
    if (f_pix - 1) % vae_scale:
        raise ValueError(f"audio has {f_pix} frames; need 1 + {vae_scale} * k (one per video frame)")
    mid = audio_window // 2
    first = audio[:, :1]  # (N, 1, W, blocks, C)
    later = audio[:, 1:].unflatten(1, (-1, vae_scale))  # (N, n_t, vae_scale, W, blocks, C)
    head = later[:, :, 0, : mid + 1]  # (N, n_t, mid+1, blocks, C)
    middle = later[:, :, 1:-1, mid]  # (N, n_t, vae_scale-2, blocks, C)
    tail = later[:, :, -1, mid:]  # (N, n_t, W-mid, blocks, C)
    return first, torch.cat([head, middle, tail], dim=2)


class AudioProjModel(nn.Module):
    """Two first-layer projections (frame 0 / later frames), two shared layers, LayerNorm on the tokens."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        per_slot = config.audio_blocks * config.audio_channels
        inter = config.intermediate_dim
        self.audio_window = config.audio_window
        self.vae_scale = config.vae_scale
        self.context_tokens = config.context_tokens
        self.output_dim = config.output_dim
        self.proj1 = nn.Linear(config.audio_window * per_slot, inter)
        self.proj1_vf = nn.Linear(config.audio_window_vf * per_slot, inter)
        self.proj2 = nn.Linear(inter, inter)
        self.proj3 = nn.Linear(inter, config.context_tokens * config.output_dim)
        # nn.LayerNorm default eps (1e-5), evaluated in float32 as the official autocast region does.
        self.norm = nn.LayerNorm(config.output_dim) if config.norm_output_audio else nn.Identity()

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """audio (N, F_pix, W, blocks, C) -> tokens (N, 1 + (F_pix-1)/vae_scale, context_tokens, output_dim)."""
        dtype = self.proj1.weight.dtype
        first, later = group_audio_windows(audio.to(dtype), self.audio_window, self.vae_scale)
        h_first = torch.relu(self.proj1(first.flatten(2)))  # (N, 1, inter)
        h_later = torch.relu(self.proj1_vf(later.flatten(2)))  # (N, n_t, inter)
        h = torch.relu(self.proj2(torch.cat([h_first, h_later], dim=1)))  # (N, F_lat, inter)
        tokens = self.proj3(h).unflatten(-1, (self.context_tokens, self.output_dim))  # (N, F_lat, T, C)
        if isinstance(self.norm, nn.LayerNorm):
            tokens = F.layer_norm(
                tokens.float(),
                self.norm.normalized_shape,
                self.norm.weight.float(),
                self.norm.bias.float(),
                self.norm.eps,
            ).to(dtype)
        return tokens
