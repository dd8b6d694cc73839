"""CLIP ViT-H/14 image features for the DiT: transformers `CLIPVisionModel` from the official Wan file.

The official `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth` holds the whole XLM-RoBERTa
CLIP; InfiniteTalk uses only `visual.*`, and only up to the penultimate transformer block (no post
norm, no head). So the model is built with L-1 layers and its last hidden state is the feature
(257 tokens x 1280 for the real model). Preprocessing is the official one in plain torch.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import CLIPVisionConfig, CLIPVisionModel

from model.checkpoint import CheckpointError, read_torch_state, strict_assign

log = logging.getLogger(__name__)

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ClipVisionConfig:
    """Vision tower of the official XLM-RoBERTa CLIP (`layers` counts all blocks in the file)."""

    dim: int = 1280
    layers: int = 32
    heads: int = 16
    mlp_dim: int = 5120
    patch_size: int = 14
    image_size: int = 224
    eps: float = 1e-5


CLIP_CONFIGS: dict[str, ClipVisionConfig] = {
    "vit-h-14": ClipVisionConfig(),
    "tiny": ClipVisionConfig(dim=64, layers=4, heads=4, mlp_dim=256),  # the parity golden's model
    # what a tiny weights root uses: the DiT hard-codes 1280-wide CLIP tokens, so only depth/MLP shrink
    "tiny-1280": ClipVisionConfig(dim=1280, layers=2, heads=16, mlp_dim=64),
}


def hf_config(cfg: ClipVisionConfig) -> CLIPVisionConfig:
    """HF config of the truncated tower: every block but the last (what InfiniteTalk reads)."""
    return CLIPVisionConfig(
        hidden_size=cfg.dim,
        intermediate_size=cfg.mlp_dim,
        num_hidden_layers=cfg.layers - 1,
        num_attention_heads=cfg.heads,
        patch_size=cfg.patch_size,
        image_size=cfg.image_size,
        hidden_act="gelu",  # exact erf GELU; the HF default quick_gelu is wrong here
        layer_norm_eps=cfg.eps,
    )


def clip_config_from_state(state: dict[str, torch.Tensor], heads: int | None = None) -> ClipVisionConfig:
    """Sizes from the official tensors. The head count is not stored: pass it, or it is taken from
    the preset of that width."""
    dim = state["visual.pre_norm.weight"].shape[0]
    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("visual.transformer."))
    patch = state["visual.patch_embedding.weight"].shape[-1]
    tokens = state["visual.pos_embedding"].shape[1]
    mlp = state["visual.transformer.0.mlp.0.weight"].shape[0]
    heads = heads or next((c.heads for c in CLIP_CONFIGS.values() if c.dim == dim), None)
    if heads is None:
        raise ValueError(f"no CLIP preset with width {dim}, so the head count is unknown")
    grid = round((tokens - 1) ** 0.5)
    return ClipVisionConfig(
        dim=dim, layers=layers, heads=heads, mlp_dim=mlp, patch_size=patch, image_size=grid * patch
    )


_BLOCK_MAP = {
    "norm1": "layer_norm1",
    "attn.proj": "self_attn.out_proj",
    "norm2": "layer_norm2",
    "mlp.0": "mlp.fc1",
    "mlp.2": "mlp.fc2",
}


def convert_state(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Official `visual.*` -> `CLIPVisionModel` names for blocks 0..layers-2.

    The fused qkv is split in q, k, v order; the last block, the projection head, the text tower
    and `log_scale` are dropped. Unknown `visual.*` keys raise KeyError.
    """
    out: dict[str, torch.Tensor] = {}
    unknown = []
    last = layers - 1
    for key, v in state.items():
        if not key.startswith("visual."):
            continue  # textual.*, log_scale: not used by InfiniteTalk
        name = key[len("visual.") :]
        if name == "cls_embedding":
            out["embeddings.class_embedding"] = v.reshape(-1)
        elif name == "pos_embedding":
            out["embeddings.position_embedding.weight"] = v.reshape(v.shape[-2], v.shape[-1])
        elif name == "patch_embedding.weight":
            out["embeddings.patch_embedding.weight"] = v
        elif name.startswith("pre_norm."):
            out["pre_layrnorm." + name.split(".")[1]] = v
        elif name.startswith("post_norm."):
            out["post_layernorm." + name.split(".")[1]] = v  # loaded for a strict check, never applied
        elif name == "head":
            continue
        elif m := re.fullmatch(r"transformer\.(\d+)\.(.+)\.(weight|bias)", name):
            i, part, kind = int(m[1]), m[2], m[3]
            if i == last:
                continue
            prefix = f"encoder.layers.{i}."
            if part == "attn.to_qkv":
                for proj, chunk in zip(("q", "k", "v"), v.chunk(3, dim=0), strict=True):
                    out[f"{prefix}self_attn.{proj}_proj.{kind}"] = chunk
            elif part in _BLOCK_MAP:
                out[f"{prefix}{_BLOCK_MAP[part]}.{kind}"] = v
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f"unexpected CLIP keys: {', '.join(sorted(unknown)[:8])}")
    return out


_REVERSE_BLOCK_MAP = {v: k for k, v in _BLOCK_MAP.items()}
_FLAT_NAMES = {
    "embeddings.class_embedding": "visual.cls_embedding",
    "embeddings.position_embedding.weight": "visual.pos_embedding",
    "embeddings.patch_embedding.weight": "visual.patch_embedding.weight",
}


def official_name(key: str) -> str:
    """`CLIPVisionModel` key -> the official file's key (for error messages)."""
    key = key.removeprefix("vision_model.")
    if key in _FLAT_NAMES:
        return _FLAT_NAMES[key]
    if m := re.fullmatch(r"(pre_layrnorm|post_layernorm)\.(weight|bias)", key):
        return f"visual.{'pre_norm' if m[1] == 'pre_layrnorm' else 'post_norm'}.{m[2]}"
    if m := re.fullmatch(r"encoder\.layers\.(\d+)\.self_attn\.[qkv]_proj\.(weight|bias)", key):
        return f"visual.transformer.{m[1]}.attn.to_qkv.{m[2]}"
    if (m := re.fullmatch(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)", key)) and m[
        2
    ] in _REVERSE_BLOCK_MAP:
        return f"visual.transformer.{m[1]}.{_REVERSE_BLOCK_MAP[m[2]]}.{m[3]}"
    return key


class ClipImageEncoder:
    """Images/videos in [-1, 1] -> penultimate-block CLIP tokens (frames, 257, dim)."""

    def __init__(self, model: CLIPVisionModel):
        self.model = model.eval().requires_grad_(False)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.image_size = model.config.image_size

    def preprocess(self, video: torch.Tensor) -> torch.Tensor:
        """(B, 3, T, H, W) in [-1, 1] -> (B*T, 3, S, S) normalised, as the official wrapper (float32)."""
        if video.ndim != 5 or video.shape[1] != 3:
            raise ValueError(f"CLIP input must be (B, 3, T, H, W), got {tuple(video.shape)}")
        b, c, t, h, w = video.shape
        frames = video.float().transpose(1, 2).reshape(b * t, c, h, w)  # (B*T, 3, H, W)
        size = (self.image_size, self.image_size)
        x = F.interpolate(frames, size=size, mode="bicubic", align_corners=False)
        x = x * 0.5 + 0.5
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """(B, 3, T, H, W) in [-1, 1] -> (B*T, 257, dim) in the model dtype."""
        x = self.preprocess(video.to(self.device))
        return self.model(pixel_values=x.to(self.dtype)).last_hidden_state  # (B*T, 257, D)


def build_clip(cfg: ClipVisionConfig, device: torch.device | str = "cpu") -> CLIPVisionModel:
    """Construct under `torch.device('meta')` for loading; the position-id buffer is made on `device`."""
    model = CLIPVisionModel(hf_config(cfg))
    emb = getattr(model, "vision_model", model).embeddings  # transformers 4.x nests the tower
    n = emb.position_embedding.num_embeddings
    emb.register_buffer("position_ids", torch.arange(n, device=device).expand((1, -1)), persistent=False)
    return model


def load_clip(
    pth: Path | str,
    *,
    dtype: torch.dtype = torch.float16,
    device: torch.device | str = "cpu",
    config: ClipVisionConfig | None = None,
) -> ClipImageEncoder:
    """Load the vision tower of the official CLIP file strictly (text tower ignored)."""
    pth = Path(pth)
    official = read_torch_state(pth)
    try:
        cfg = config or clip_config_from_state(official)
        state = convert_state(official, cfg.layers)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{pth}: not an open-clip XLM-RoBERTa ViT checkpoint ({e})") from e
    with torch.device("meta"):
        model = build_clip(cfg, device=device)
    if next(iter(model.state_dict())).startswith("vision_model."):  # transformers 4.x names
        state = {f"vision_model.{k}": v for k, v in state.items()}
    strict_assign(model, state, source=pth, dtype=dtype, device=device)
    log.info(
        "loaded CLIP vision tower %s (%d of %d blocks, %s, %s)",
        pth,
        cfg.layers - 1,
        cfg.layers,
        dtype,
        device,
    )
    return ClipImageEncoder(model)
