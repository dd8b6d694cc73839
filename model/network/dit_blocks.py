"""The InfiniteTalk DiT's parts: float32 norms, the timestep embedding, self-attention with 3D RoPE, the
image/text and audio cross-attentions, the two-speaker routing (which tokens belong to which speaker) and
the transformer block with its head and CLIP projection. `model.network.dit.InfiniteTalkDiT` stacks them.

Parameter names equal the official checkpoint keys (see `model.network.dit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.config import DiTConfig
from model.network.attention import attention
from model.network.parallel import LOCAL_SHARD, TokenShard
from model.network.rope import apply_rope, rope_1d_tables

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
