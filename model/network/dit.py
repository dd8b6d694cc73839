"""The InfiniteTalk DiT: Wan2.1 image-to-video transformer plus per-block audio cross-attention.

Parameter names equal the official checkpoint keys (`diffusion_pytorch_model-*.safetensors` +
`infinitetalk.safetensors`), so the official files load with `load_state_dict(strict=True)`.

Forward contract (batched tensors; B = samples, e.g. the guidance branches of one step):
    x      (B, 16, F, h, w)      noisy latent
    t      (B,) or (1,)          timesteps in [0, num_train_timesteps]
    context (B, Lt, text_dim)    umT5 features, Lt <= text_len, zero-padded to text_len inside
                                 (the official model attends to the padded zeros too)
    clip_fea (B or 1, 257, 1280) CLIP ViT-H penultimate features
    y      (B or 1, 20, F, h, w) 4-channel frame mask + 16-channel reference latent
    audio  (S, F_pix, 5, 12, 768)     the official per-sample layout (S speakers), shared by all B, or
           (B, S, F_pix, 5, 12, 768)  per sample; F_pix = 1 + vae_scale * (F - 1) video frames
    ref_target_masks (M, h, w) or (B, M, h, w) speaker masks at latent resolution ([person1,
           person2, background] for two speakers); only read for samples with 2 speakers
    audio_speakers  per-sample count of real speakers (default S for all). A sample with fewer uses
           audio slots [:n] only; e.g. the official null-audio branch is one speaker of zeros.
    -> (B, 16, F, h, w) float32

One speaker: each latent frame's tokens attend to that frame's `context_tokens` audio tokens. Two
speakers: tokens of the first latent frame define per-speaker regions through the self-attention map
to the mask regions (computed only then), every token gets a 1D RoPE position inside its speaker's
range and the audio tokens of speaker 1/2 sit at the range centres.

The parts (norms, attention layers, the speaker routing, the block, the head) are `model.network.dit_blocks`;
this file stacks them into the top model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from model.config import DiTConfig
from model.network.attention import attention_context
from model.network.audio_proj import AudioProjModel
from model.network.cudnn_attention import CudnnAttention
from model.network.dit_blocks import (
    AudioGroup,
    DiTBlock,
    Float32Sequential,
    Head,
    MLPProj,
    sinusoidal_embedding,
    token_masks,
)
from model.network.parallel import LOCAL_SHARD, SequenceParallel, TokenShard
from model.network.rope import Rope3D, rope_1d_tables
from model.network.sparse_attention import SparseSettings, WindowPlan, window_plan, window_scope
from model.network.teacache import TeaCache
from model.sampling.step import current_step


class InfiniteTalkDiT(nn.Module):
    """Wan2.1-I2V DiT with InfiniteTalk audio conditioning (see the module docstring for the contract)."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        dim = config.dim
        self.attn_backend = "auto"
        # frame-window self-attention after the first steps (lossy opt-in; `model.network.sparse_attention`)
        self.sparse: SparseSettings | None = None
        self._window_plans: dict[tuple, WindowPlan] = {}  # made once per (grid, batch, device)
        self.attn_graphs = CudnnAttention()  # built cuDNN attention graphs (backends cudnn / cudnn_fp8)
        self.patch_embedding = nn.Conv3d(
            config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = Float32Sequential(
            nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim)
        )
        self.time_projection = Float32Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList([DiTBlock(config) for _ in range(config.num_layers)])
        self.head = Head(config)
        self.img_emb = MLPProj(config.clip_dim, dim)
        self.audio_proj = AudioProjModel(config)
        self.rope = Rope3D(config)
        # sequence-parallel hook (None = one process); set with `SequenceParallel.attach`
        self.sp: SequenceParallel | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    # --- conditioning helpers ---

    def _speaker_key_rope(
        self, speakers: int, n_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (speakers*T, Dh/2): audio tokens of speaker s sit at the centre of its RoPE range."""
        c = self.config
        centres = [c.speaker_class_interval / 2, c.speaker_class_range - c.speaker_class_interval / 2]
        positions = torch.cat([torch.full((n_tokens,), p, device=device) for p in centres[:speakers]])
        return rope_1d_tables(positions, c.head_dim, c.rope_theta)

    def _audio_groups(
        self,
        audio: torch.Tensor,
        batch: int,
        frames: int,
        grid_hw: tuple[int, int],
        ref_target_masks: torch.Tensor | None,
        audio_speakers: Sequence[int] | None,
        shard: TokenShard = LOCAL_SHARD,
    ) -> list[AudioGroup]:
        """Project the audio windows and group the samples by speaker count (this rank's frames)."""
        c = self.config
        dtype = self.dtype
        if audio.dim() == 5:  # (S, F_pix, W, blocks, C) shared by the batch: project once
            tokens = self.audio_proj(audio)[None].expand(batch, -1, -1, -1, -1)  # (B, S, F_lat, T, C)
        elif audio.dim() == 6:
            if audio.shape[0] != batch:
                raise ValueError(f"audio batch {audio.shape[0]} != latent batch {batch}")
            tokens = self.audio_proj(audio.flatten(0, 1)).unflatten(0, audio.shape[:2])  # (B, S, F_lat, T, C)
        else:
            raise ValueError(f"audio must be (S, F_pix, W, 12, 768) or (B, S, ...), got {tuple(audio.shape)}")
        slots = tokens.shape[1]
        if tokens.shape[2] != frames:
            raise ValueError(f"audio covers {tokens.shape[2]} latent frames, latent has {frames}")
        tokens = shard.frames(tokens, dim=2)  # (B, S, F_r, T, C): the frames this rank owns
        counts = [slots] * batch if audio_speakers is None else [int(n) for n in audio_speakers]
        if len(counts) != batch or any(not 1 <= n <= slots for n in counts):
            raise ValueError(f"audio_speakers {counts} must give 1..{slots} for each of {batch} samples")
        if max(counts) > 2:
            raise ValueError(f"at most 2 speakers are supported (InfiniteTalk routing), got {max(counts)}")

        masks_all = None
        if max(counts) >= 2:
            if ref_target_masks is None:
                raise ValueError("two speakers need ref_target_masks (M, h, w)")
            masks = ref_target_masks if ref_target_masks.dim() == 4 else ref_target_masks[None]
            if masks.shape[1] != 3:
                raise ValueError(
                    f"two speakers need 3 masks (person1, person2, background), got {masks.shape[1]}"
                )
            masks_all = token_masks(masks.to(tokens.device), grid_hw).expand(batch, -1, -1)  # (B, M, T0)

        groups = []
        for n in sorted(set(counts)):
            members = [i for i, m in enumerate(counts) if m == n]
            index = (
                None if len(members) == batch else torch.tensor(members).to(tokens.device, non_blocking=True)
            )
            sel = tokens if index is None else tokens.index_select(0, index)
            # speakers side by side along the token axis, speaker order kept: (b, F_lat, n*T, C)
            group_tokens = sel[:, :n].permute(0, 2, 1, 3, 4).flatten(2, 3).to(dtype)
            if n == 1:
                groups.append(AudioGroup(index, n, group_tokens))
            else:
                masks = masks_all if index is None else masks_all.index_select(0, index)
                key_rope = self._speaker_key_rope(n, c.context_tokens, tokens.device)
                groups.append(AudioGroup(index, n, group_tokens, masks, key_rope))
        return groups

    # --- forward ---

    def _window_plan(self, grid: tuple[int, int, int], batch: int, device: torch.device) -> WindowPlan | None:
        """The self-attention window of this call: None (dense) unless sparse attention is set and the
        sampler's step (`model.sampling.step.sampling_step`) is past the dense first steps."""
        step = current_step()
        if self.sparse is None or step is None or step < self.sparse.dense_steps:
            return None
        key = (grid, batch, device, self.sparse)
        if key not in self._window_plans:
            self._window_plans[key] = window_plan(
                grid[0], grid[1] * grid[2], self.sparse, batch=batch, device=device
            )
        return self._window_plans[key]

    def timestep_modulation(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """t (B,) -> time embedding e (B, dim) and block modulation e0 (B, 6, dim), float32.

        The forward's own path (TeaCache prepares a schedule with it, bit-identical per call shape).
        """
        e = self.time_embedding(sinusoidal_embedding(t, self.config.freq_dim))  # (B, dim)
        return e, self.time_projection(e).unflatten(1, (6, self.config.dim))  # (B, 6, dim)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        context: torch.Tensor,
        clip_fea: torch.Tensor,
        y: torch.Tensor,
        audio: torch.Tensor,
        ref_target_masks: torch.Tensor | None = None,
        *,
        audio_speakers: Sequence[int] | None = None,
        teacache: TeaCache | None = None,
        branch: str = "cond",
    ) -> torch.Tensor:
        """Predict the flow-matching velocity (B, 16, F, h, w) float32. See the module docstring."""
        c = self.config
        dtype = self.dtype
        batch, _, frames, height, width = x.shape
        pt, ph, pw = c.patch_size
        grid = (frames // pt, height // ph, width // pw)  # (Nt, Nh, Nw)
        if context.shape[1] > c.text_len:
            raise ValueError(f"context has {context.shape[1]} tokens > text_len {c.text_len}")

        # 1. patch embedding of cat(noisy latent, condition): (B, 36, F, h, w) -> (B, L, dim)
        y = y.expand(batch, -1, -1, -1, -1)
        tokens = self.patch_embedding(torch.cat([x, y], dim=1).to(dtype))  # (B, dim, Nt, Nh, Nw)
        # contiguous: every block then sees the same (non-view) input layout, so one compiled graph serves all
        tokens = tokens.flatten(2).transpose(1, 2).contiguous()  # (B, L, dim)
        shard = LOCAL_SHARD if self.sp is None else self.sp.shard(grid)
        tokens = shard.tokens(tokens, dim=1)  # (B, L_r, dim): this rank's latent frames (all if one process)

        # 2. timestep embedding and the 6-way modulation (float32)
        e, e0 = self.timestep_modulation(t.reshape(-1).expand(batch))  # (B, dim), (B, 6, dim)

        # 3. text (zero-padded to text_len) and CLIP-image context
        context = F.pad(context, (0, 0, 0, c.text_len - context.shape[1]))  # (B, text_len, text_dim)
        context_text = self.text_embedding(context.to(dtype))  # (B, text_len, dim)
        context_img = self.img_emb(clip_fea.to(dtype)).expand(batch, -1, -1)  # (B, 257, dim)

        # 4. audio tokens per latent frame, grouped by speaker count
        groups = self._audio_groups(audio, batch, grid[0], grid[1:], ref_target_masks, audio_speakers, shard)

        # 5. transformer blocks (or TeaCache reuse of this branch's residual)
        rope_cos, rope_sin = (
            shard.tokens(r, dim=0) for r in self.rope.tables(grid, tokens.device)
        )  # (L_r, 1, Dh/2)
        compute = True if teacache is None else shard.agree(teacache.should_compute(branch, e, e0))
        if compute:
            start = tokens
            plan = self._window_plan(grid, batch, tokens.device)
            with attention_context(self.attn_backend, self.attn_graphs), window_scope(plan):  # also compiling
                for block in self.blocks:
                    tokens = block(
                        tokens,
                        e0,
                        rope_cos,
                        rope_sin,
                        context_img,
                        context_text,
                        groups,
                        self.attn_backend,
                        shard,
                    )
            if teacache is not None:
                teacache.store_residual(branch, tokens - start)
        else:
            tokens = tokens + teacache.residual(branch)

        # 6. head (float32) and unpatchify: (B, L, pt*ph*pw*16) -> (B, 16, F, h, w)
        out = shard.gather_tokens(self.head(tokens, e))  # (B, L, pt*ph*pw*16), the same on every rank
        out = out.view(batch, *grid, pt, ph, pw, c.out_dim)  # (B, Nt, Nh, Nw, pt, ph, pw, C)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, C, Nt, pt, Nh, ph, Nw, pw)
        return out.reshape(batch, c.out_dim, grid[0] * pt, grid[1] * ph, grid[2] * pw)
