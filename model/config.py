"""Hyper-parameters of the InfiniteTalk DiT (Wan2.1-I2V-14B + audio cross-attention) and named presets.

`DiTConfig` holds every size the network needs, including the constants the official code hard-codes
(257 CLIP tokens of width 1280, 12 x 768 wav2vec2 features, the two-speaker RoPE layout). The field
defaults are the official `WanModel.__init__` defaults, so `DiTConfig.from_official` reproduces exactly
what `WanModel(**json.load(config.json))` builds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# Keys of the official `WanModel.__init__` that dubflow accepts in a config.json, and how they map
# onto `DiTConfig` fields (same names). `window_size` and `weight_init` are accepted but must keep
# the values dubflow supports (full attention; initialisation is irrelevant when loading weights).
_OFFICIAL_KEYS = (
    "model_type",
    "patch_size",
    "text_len",
    "in_dim",
    "dim",
    "ffn_dim",
    "freq_dim",
    "text_dim",
    "out_dim",
    "num_heads",
    "num_layers",
    "window_size",
    "qk_norm",
    "cross_attn_norm",
    "eps",
    "audio_window",
    "intermediate_dim",
    "output_dim",
    "context_tokens",
    "vae_scale",
    "norm_input_visual",
    "norm_output_audio",
    "weight_init",
)


class ConfigError(ValueError):
    """A DiT configuration that dubflow cannot build (unknown key, unsupported value)."""


@dataclass(frozen=True)
class DiTConfig:
    """Every hyper-parameter of the InfiniteTalk DiT. Defaults = official `WanModel` defaults."""

    # --- Wan2.1 backbone (official config.json keys) ---
    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512  # T5 tokens; shorter contexts are zero-padded to this length
    in_dim: int = 16  # 36 for I2V: 16 noisy latent + 4 frame mask + 16 reference latent
    dim: int = 2048
    ffn_dim: int = 8192
    freq_dim: int = 256  # width of the sinusoidal timestep embedding
    text_dim: int = 4096  # umT5-XXL hidden size
    out_dim: int = 16
    num_heads: int = 16
    num_layers: int = 32
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    # --- InfiniteTalk audio adapter (official config.json keys) ---
    audio_window: int = 5  # wav2vec2 frames around each video frame
    intermediate_dim: int = 512
    output_dim: int = 768  # width of the audio context tokens
    context_tokens: int = 32  # audio tokens per latent frame and speaker
    vae_scale: int = 4  # VAE temporal stride: video frames per latent frame after the first
    norm_input_visual: bool = True
    norm_output_audio: bool = True
    # --- constants hard-coded in the official code (not in config.json) ---
    clip_tokens: int = 257  # CLIP ViT-H/14 tokens incl. class token; the cross-attention splits here
    clip_dim: int = 1280
    audio_blocks: int = 12  # wav2vec2 hidden states stacked per frame
    audio_channels: int = 768
    rope_max_positions: int = 1024  # official RoPE table length per axis
    rope_theta: float = 10000.0
    speaker_class_range: int = 24  # two-speaker 1D RoPE: speaker 1 in [0, 4], speaker 2 in [20, 24]
    speaker_class_interval: int = 4
    ref_map_head_splits: int = 2  # official averages the reference map over 2 head groups
    num_train_timesteps: int = 1000

    def __post_init__(self) -> None:
        if self.model_type != "i2v":
            raise ConfigError(f"model_type {self.model_type!r}: InfiniteTalk needs 'i2v'")
        if len(self.patch_size) != 3:
            raise ConfigError(f"patch_size {self.patch_size!r}: expected 3 integers (t, h, w)")
        if self.dim % self.num_heads:
            raise ConfigError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} must be even for RoPE")
        if self.vae_scale < 2:
            raise ConfigError(f"vae_scale {self.vae_scale} must be >= 2")

    # --- derived sizes ---
    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def rope_axis_pairs(self) -> tuple[int, int, int]:
        """Rotary frequency pairs per axis (time, height, width); they sum to head_dim / 2."""
        c = self.head_dim // 2
        return (c - 2 * (c // 3), c // 3, c // 3)

    @property
    def audio_window_vf(self) -> int:
        """Audio slots per later latent frame: (window//2 + 1) + (vae_scale - 2) + (window - window//2)."""
        return self.audio_window + self.vae_scale - 1

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    def per_token_linear_params(self) -> int:
        """Weights every video token is multiplied with per forward (the analytic-floor P_tok).

        Per block: self-attention q/k/v/o (4 D^2), text/image cross-attention q and o (2 D^2),
        audio cross-attention q and proj (2 D^2), FFN (2 D F); plus the head.
        """
        d, f = self.dim, self.ffn_dim
        per_block = 8 * d * d + 2 * d * f
        head = d * self.patch_volume * self.out_dim
        patch = self.in_dim * self.patch_volume * d
        return self.num_layers * per_block + head + patch

    # --- construction ---
    @classmethod
    def from_official(cls, raw: dict[str, Any], source: str = "config") -> DiTConfig:
        """Build from an official `config.json` dict (keys starting with `_` ignored, unknown keys rejected)."""
        kwargs: dict[str, Any] = {}
        unknown = []
        for key, value in raw.items():
            if key.startswith("_"):
                continue
            if key not in _OFFICIAL_KEYS:
                unknown.append(key)
                continue
            kwargs[key] = value
        if unknown:
            raise ConfigError(
                f"{source}: unknown WanModel config key(s) {sorted(unknown)}; known: {list(_OFFICIAL_KEYS)}"
            )
        window = tuple(kwargs.pop("window_size", (-1, -1)))
        if window != (-1, -1):
            raise ConfigError(f"{source}: window_size {list(window)} not supported (only full attention)")
        kwargs.pop("weight_init", None)
        if "patch_size" in kwargs:
            kwargs["patch_size"] = tuple(int(p) for p in kwargs["patch_size"])
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    def to_official(self) -> dict[str, Any]:
        """The official `WanModel` kwargs of this config (what a config.json may hold)."""
        out: dict[str, Any] = {}
        for key in _OFFICIAL_KEYS:
            if key == "window_size":
                out[key] = [-1, -1]
            elif key == "weight_init":
                continue
            else:
                value = getattr(self, key)
                out[key] = list(value) if isinstance(value, tuple) else value
        return out

    def replace(self, **changes: Any) -> DiTConfig:
        return dataclasses.replace(self, **changes)


# Named presets. "infinitetalk-14b" is Wan2.1-I2V-14B-480P/720P (both resolutions share the DiT);
# "tiny" is the parity-golden model (tests/fixtures/parity/dit/weights/config.json), small enough
# for CPU tests.
DIT_PRESETS: dict[str, DiTConfig] = {
    "infinitetalk-14b": DiTConfig(
        in_dim=36,
        dim=5120,
        ffn_dim=13824,
        freq_dim=256,
        text_dim=4096,
        out_dim=16,
        num_heads=40,
        num_layers=40,
        text_len=512,
        eps=1e-6,
    ),
    "tiny": DiTConfig(
        in_dim=36,
        dim=128,
        ffn_dim=256,
        freq_dim=256,
        text_dim=64,
        out_dim=16,
        num_heads=4,
        num_layers=2,
        text_len=32,
        intermediate_dim=8,
        output_dim=64,
        context_tokens=4,
    ),
}


def dit_preset(name: str) -> DiTConfig:
    """Look up a preset by name with a clear error."""
    try:
        return DIT_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown DiT preset {name!r}; known: {sorted(DIT_PRESETS)}") from None
