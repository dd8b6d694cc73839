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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import attention, attention_context
from model.audio_proj import AudioProjModel
from model.config import DiTConfig
from model.cudnn_attention import CudnnAttention
from model.parallel import LOCAL_SHARD, SequenceParallel, TokenShard
from model.rope import Rope3D, apply_rope, rope_1d_tables
from model.teacache import TeaCache

# ----------------------------------------------------------------------------------------------
# Small layers (float32 where the official computes in float32)
# ----------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """RMS normalisation in float32, cast back, then scaled (official WanRMSNorm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class LayerNorm32(nn.LayerNorm):
    """LayerNorm evaluated in float32 and cast back to the input dtype (official WanLayerNorm)."""

    def __init__(self, dim: int, eps: float, elementwise_affine: bool = False):
        super().__init__(dim, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


class Float32Sequential(nn.Sequential):
    """nn.Sequential whose Linear layers run in float32 (the official timestep-embedding island)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        for layer in self:
            if isinstance(layer, nn.Linear):
                bias = None if layer.bias is None else layer.bias.float()
                x = F.linear(x, layer.weight.float(), bias)
            else:
                x = layer(x)
        return x


def _modulation_parameter(n: int, dim: int) -> nn.Parameter:
    """(1, n, dim) learned modulation offsets, N(0, 1/dim) like the official init (left empty on meta)."""
    param = nn.Parameter(torch.empty(1, n, dim))
    if not param.is_meta:
        with torch.no_grad():
            param.normal_(std=dim**-0.5)
    return param


def sinusoidal_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[cos(t w_i), sin(t w_i)] with w_i = 10000^(-i/(dim/2)); t (B,) -> (B, dim) float32.

    Angles in float64 (t up to 1000 times w_0 = 1 needs it for 1e-6 accuracy); tiny tensor.
    """
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)  # (half,)
    angles = t.to(torch.float64)[:, None] * freqs  # (B, half)
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


# ----------------------------------------------------------------------------------------------
# Attention modules
# ----------------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """Full self-attention over all video tokens with RMS qk-norm and 3D RoPE."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.dim
        self.num_heads = config.num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()
        self.norm_k = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        backend: str,
        shard: TokenShard = LOCAL_SHARD,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, dim) -> (out (B, L, dim), rotated q and k (B, L, H, Dh) for the speaker map).

        Under sequence parallelism L is this rank's tokens and `shard` attends over all ranks' keys.
        """
        b, n, _ = x.shape
        q = self.norm_q(self.q(x)).unflatten(-1, (self.num_heads, -1))  # (B, L, H, Dh)
        k = self.norm_k(self.k(x)).unflatten(-1, (self.num_heads, -1))
        v = self.v(x).unflatten(-1, (self.num_heads, -1))
        q = apply_rope(q, rope_cos, rope_sin).to(x.dtype)
        k = apply_rope(k, rope_cos, rope_sin).to(x.dtype)
        out = shard.self_attention(q, k, v, backend).reshape(b, n, -1)  # (B, L, dim)
        return self.o(out), q, k


class ImageTextCrossAttention(nn.Module):
    """Cross-attention to the text tokens plus a parallel one to the 257 CLIP tokens, summed."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.dim
        self.num_heads = config.num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.k_img = nn.Linear(dim, dim)
        self.v_img = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()
        self.norm_k = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()
        self.norm_k_img = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()

    def forward(
        self, x: torch.Tensor, context_img: torch.Tensor, context_text: torch.Tensor, backend: str
    ) -> torch.Tensor:
        """x (B, L, dim), context_img (B, 257, dim), context_text (B, text_len, dim) -> (B, L, dim)."""
        b, n, _ = x.shape
        heads = (self.num_heads, -1)
        q = self.norm_q(self.q(x)).unflatten(-1, heads)  # (B, L, H, Dh)
        k = self.norm_k(self.k(context_text)).unflatten(-1, heads)  # (B, Lt, H, Dh)
        v = self.v(context_text).unflatten(-1, heads)
        k_img = self.norm_k_img(self.k_img(context_img)).unflatten(-1, heads)  # (B, 257, H, Dh)
        v_img = self.v_img(context_img).unflatten(-1, heads)
        out = attention(q, k, v, backend=backend) + attention(q, k_img, v_img, backend=backend)
        return self.o(out.reshape(b, n, -1))


class AudioCrossAttention(nn.Module):
    """Each latent frame's tokens attend to that frame's audio tokens (no qk-norm).

    With two speakers, queries and audio keys are rotated by 1D RoPE positions (speaker routing).
    """

    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.dim
        self.num_heads = config.num_heads
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(config.output_dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self,
        x: torch.Tensor,
        audio_tokens: torch.Tensor,
        backend: str,
        query_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x (B, L, dim), audio_tokens (B, F_lat, Na, output_dim) -> (B, L, dim).

        query_rope: cos/sin (B, L, Dh/2); key_rope: cos/sin (Na, Dh/2) (two speakers only).
        """
        b, n, dim = x.shape
        frames, n_audio = audio_tokens.shape[1:3]
        q = self.q_linear(x).unflatten(-1, (self.num_heads, -1))  # (B, L, H, Dh)
        kv = self.kv_linear(audio_tokens).unflatten(-1, (2, self.num_heads, -1))  # (B, F, Na, 2, H, Dh)
        k, v = kv.unbind(3)  # (B, F, Na, H, Dh) each
        if query_rope is not None and key_rope is not None:
            q = apply_rope(q, query_rope[0][:, :, None], query_rope[1][:, :, None]).to(x.dtype)
            k = apply_rope(k, key_rope[0][:, None], key_rope[1][:, None]).to(x.dtype)
        q = q.reshape(b * frames, n // frames, self.num_heads, -1)  # (B*F, S, H, Dh)
        k = k.reshape(b * frames, n_audio, self.num_heads, -1)  # (B*F, Na, H, Dh)
        v = v.reshape(b * frames, n_audio, self.num_heads, -1)
        out = attention(q, k, v, backend=backend).reshape(b, n, dim)  # (B, L, dim)
        return self.proj(out)


# ----------------------------------------------------------------------------------------------
# Two-speaker routing
# ----------------------------------------------------------------------------------------------


def token_masks(ref_target_masks: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Latent-resolution masks (B, M, h, w) -> 0/1 token masks (B, M, Nh*Nw) (nearest resize)."""
    resized = F.interpolate(ref_target_masks.float(), size=grid_hw, mode="nearest")  # (B, M, Nh, Nw)
    return (resized > 0).float().flatten(2)


def reference_attention_map(
    q: torch.Tensor, k: torch.Tensor, masks: torch.Tensor, head_splits: int, backend: str = "sdpa"
) -> torch.Tensor:
    """Mean attention of every token to each mask region of the first latent frame.

    q, k (B, L, H, Dh) rotated self-attention queries/keys; masks (B, M, T0) over the T0 tokens of
    frame 0. map[b, m, i] = mean over heads of sum_j softmax_j(q_i k_j) * masks[b, m, j] / |mask m|,
    computed as attention with the normalised masks as values. The official code averages
    `head_splits` groups of H // head_splits heads (heads beyond are ignored). -> (B, M, L) float32.
    """
    b, _, h, dh = q.shape
    m, frame_tokens = masks.shape[1:]
    used = (h // head_splits) * head_splits
    weights = masks / masks.sum(-1, keepdim=True).clamp_min(1.0)  # (B, M, T0)
    values = weights.transpose(1, 2)[:, :, None, :].expand(b, frame_tokens, used, m)  # (B, T0, H', M)
    values = F.pad(values, (0, max(dh - m, 0))).to(q.dtype)  # (B, T0, H', Dh): all backends take it
    out = attention(q[:, :, :used], k[:, :frame_tokens, :used], values, backend=backend)  # (B, L, H', Dh)
    return out[..., :m].float().mean(2).transpose(1, 2)  # (B, M, L)


def speaker_positions(
    ref_map: torch.Tensor,
    class_range: int,
    class_interval: int,
    bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """1D RoPE position per token from the reference map (B, M, L), M = 2 speakers + background.

    Speaker 1 rows are min-max scaled into [0, interval], speaker 2 into [range - interval, range],
    background is range // 2; each token takes the value of its argmax row. -> (B, L) float32.
    bounds: the rows' (min, max) (B, M, 1) over the whole sequence when ref_map holds only part of it.
    """
    lo, hi = (
        bounds if bounds is not None else (ref_map.amin(-1, keepdim=True), ref_map.amax(-1, keepdim=True))
    )
    unit = (ref_map - lo) / (hi - lo + 1e-8)  # (B, M, L) in [0, 1]
    first = unit[:, 0] * class_interval  # (B, L)
    second = unit[:, 1] * class_interval + (class_range - class_interval)
    background = torch.full_like(first, float(class_range // 2))
    rows = [first, second] + [background] * (ref_map.shape[1] - 2)
    choice = ref_map.argmax(dim=1, keepdim=True)  # (B, 1, L)
    return torch.stack(rows, dim=1).gather(1, choice).squeeze(1)  # (B, L)


@dataclass(frozen=True)
class AudioGroup:
    """Samples of one batch that share a speaker count (audio cross-attention runs per group).

    index None = the whole batch. tokens (b, F_lat, n*T, C); masks (b, M, T0) and key_rope only for
    two speakers.
    """

    index: torch.Tensor | None
    speakers: int
    tokens: torch.Tensor
    masks: torch.Tensor | None = None
    key_rope: tuple[torch.Tensor, torch.Tensor] | None = None


# ----------------------------------------------------------------------------------------------
# Block, head, model
# ----------------------------------------------------------------------------------------------


class DiTBlock(nn.Module):
    """Self-attn -> text/image cross-attn -> audio cross-attn -> FFN, with 6-way timestep modulation."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.dim
        self.head_splits = config.ref_map_head_splits
        self.class_range = config.speaker_class_range
        self.class_interval = config.speaker_class_interval
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.norm1 = LayerNorm32(dim, config.eps)
        self.self_attn = SelfAttention(config)
        self.norm3 = (
            LayerNorm32(dim, config.eps, elementwise_affine=True) if config.cross_attn_norm else nn.Identity()
        )
        self.cross_attn = ImageTextCrossAttention(config)
        self.norm2 = LayerNorm32(dim, config.eps)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = _modulation_parameter(6, dim)
        self.audio_cross_attn = AudioCrossAttention(config)
        self.norm_x = (
            LayerNorm32(dim, config.eps, elementwise_affine=True)
            if config.norm_input_visual
            else nn.Identity()
        )

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
        context_img: torch.Tensor,
        context_text: torch.Tensor,
        audio_groups: Sequence[AudioGroup],
        backend: str = "sdpa",
        shard: TokenShard = LOCAL_SHARD,
    ) -> torch.Tensor:
        """x (B, L, dim) in the run dtype, e0 (B, 6, dim) float32 -> (B, L, dim).

        `shard` is the sequence-parallel hook (L = this rank's tokens); the default is one process.
        """
        dtype = x.dtype
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation.float() + e0).unbind(1)  # (B, dim)

        # 1. self-attention (modulated input and gated residual in float32)
        h = (self.norm1(x).float() * (1 + scale1[:, None]) + shift1[:, None]).to(dtype)
        y, q, k = self.self_attn(h, rope_cos, rope_sin, backend, shard)
        x = (x.float() + y.float() * gate1[:, None]).to(dtype)

        # 2. text + CLIP-image cross-attention
        x = x + self.cross_attn(self.norm3(x), context_img, context_text, backend)

        # 3. audio cross-attention, per speaker-count group
        xa = self.norm_x(x)
        audio_out = None
        for group in audio_groups:
            xg = xa if group.index is None else xa.index_select(0, group.index)
            if group.speakers == 1:
                out = self.audio_cross_attn(xg, group.tokens, backend)
            else:
                qg = q if group.index is None else q.index_select(0, group.index)
                kg = k if group.index is None else k.index_select(0, group.index)
                kg = shard.first_frame(kg, group.masks.shape[-1])  # (b, T0, H, Dh): frame-0 keys
                ref_map = reference_attention_map(qg, kg, group.masks, self.head_splits, backend)  # (b, M, L)
                bounds = shard.extrema(ref_map)  # min/max over the whole sequence
                positions = speaker_positions(
                    ref_map, self.class_range, self.class_interval, bounds
                )  # (b, L)
                query_rope = rope_1d_tables(positions, self.head_dim, self.rope_theta)
                out = self.audio_cross_attn(xg, group.tokens, backend, query_rope, group.key_rope)
            if group.index is None:
                audio_out = out
            else:
                audio_out = torch.zeros_like(x) if audio_out is None else audio_out
                audio_out = audio_out.index_copy(0, group.index, out)
        x = x + audio_out

        # 4. feed-forward (modulated input and gated residual in float32)
        h = (self.norm2(x).float() * (1 + scale2[:, None]) + shift2[:, None]).to(dtype)
        return (x.float() + self.ffn(h).float() * gate2[:, None]).to(dtype)


class Head(nn.Module):
    """Final modulated LayerNorm + linear to patch pixels, in float32."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        dim = config.dim
        self.norm = LayerNorm32(dim, config.eps)
        self.head = nn.Linear(dim, config.patch_volume * config.out_dim)
        self.modulation = _modulation_parameter(2, dim)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """x (B, L, dim), e (B, dim) float32 -> (B, L, patch_volume * out_dim) float32."""
        shift, scale = (self.modulation.float() + e[:, None]).unbind(1)  # (B, dim)
        h = self.norm(x).float() * (1 + scale[:, None]) + shift[:, None]
        return F.linear(h, self.head.weight.float(), self.head.bias.float())


class MLPProj(nn.Module):
    """CLIP features (B, 257, 1280) -> image context tokens (B, 257, dim)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(
            nn.LayerNorm(in_dim),
            nn.Linear(in_dim, in_dim),
            nn.GELU(),
            nn.Linear(in_dim, out_dim),
            nn.LayerNorm(out_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class InfiniteTalkDiT(nn.Module):
    """Wan2.1-I2V DiT with InfiniteTalk audio conditioning (see the module docstring for the contract)."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = config
        dim = config.dim
        self.attn_backend = "auto"
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
            with attention_context(self.attn_backend, self.attn_graphs):  # also while compiling
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


def count_parameters(model: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in model.parameters())
