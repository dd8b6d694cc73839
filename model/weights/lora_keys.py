"""Key names of LoRA files: which prefixes a file may use and how diffusers' Wan names map onto the official DiT.

Holds `split_key` (a file key -> prefix, module path, suffix), `file_naming` (whether a file speaks the
official Wan names, as lightx2v / FusionX files do, or the diffusers `WanTransformer3DModel` names that
SimpleTuner and diffusers' `save_lora_weights` write) and `official_path` (a diffusers module path -> the
official one). The table follows `WanTransformer3DModel`'s module tree: `attnN.to_q/to_k/to_v/to_out.0`,
`attn2.add_k_proj/add_v_proj/norm_added_k` (the image keys), `ffn.net.0.proj/net.2`, the swapped `norm2` /
`norm3` (diffusers' `norm2` is the affine cross-attention norm, the official `norm3`), `condition_embedder.*`
and `proj_out`. InfiniteTalk's own modules (`audio_cross_attn`, `norm_x`, `audio_proj`) have no diffusers
names and keep theirs. Names only: no tensors, no merging (that is `model.weights.lora`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Prefixes a LoRA file puts before the DiT module path (PEFT's `base_model.model.` may wrap either of the others).
PREFIXES = ("base_model.model.transformer.", "base_model.model.diffusion_model.", "base_model.model.",
            "diffusion_model.", "transformer.")  # fmt: skip
# Suffixes after the module path, and what each holds.
SUFFIXES: Mapping[str, str] = {
    ".lora_down.weight": "down",
    ".lora_A.weight": "down",
    ".lora_up.weight": "up",
    ".lora_B.weight": "up",
    ".alpha": "alpha",
    ".diff": "diff",  # a full difference of the module's weight
    ".diff_b": "diff_b",  # ... and of its bias
    ".lora_B.bias": "diff_b",  # diffusers' spelling of `diff_b` (its PEFT `lora_bias`)
    ".lora_up.bias": "diff_b",
}

# diffusers module path -> official module path, outside the blocks ...
_TOP: Mapping[str, str] = {
    "condition_embedder.time_embedder.linear_1": "time_embedding.0",
    "condition_embedder.time_embedder.linear_2": "time_embedding.2",
    "condition_embedder.text_embedder.linear_1": "text_embedding.0",
    "condition_embedder.text_embedder.linear_2": "text_embedding.2",
    "condition_embedder.time_proj": "time_projection.1",
    "condition_embedder.image_embedder.norm1": "img_emb.proj.0",
    "condition_embedder.image_embedder.ff.net.0.proj": "img_emb.proj.1",
    "condition_embedder.image_embedder.ff.net.2": "img_emb.proj.3",
    "condition_embedder.image_embedder.norm2": "img_emb.proj.4",
    "proj_out": "head.head",
}
# ... and inside `blocks.N.`
_BLOCK: Mapping[str, str] = {
    **{f"attn1.{d}": f"self_attn.{o}" for d, o in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "o"))},
    **{f"attn2.{d}": f"cross_attn.{o}" for d, o in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "o"))},
    "attn1.norm_q": "self_attn.norm_q",
    "attn1.norm_k": "self_attn.norm_k",
    "attn2.norm_q": "cross_attn.norm_q",
    "attn2.norm_k": "cross_attn.norm_k",
    "attn2.add_k_proj": "cross_attn.k_img",
    "attn2.add_v_proj": "cross_attn.v_img",
    "attn2.norm_added_k": "cross_attn.norm_k_img",
    "ffn.net.0.proj": "ffn.0",
    "ffn.net.2": "ffn.2",
    "norm2": "norm3",  # the cross-attention norm (affine)
    "norm3": "norm2",  # the FFN's modulated norm (no parameters: a LoRA on it has no target)
}  # fmt: skip
_BLOCK_PATH = re.compile(r"(blocks\.\d+\.)(.+)")
# Module paths only the official naming has, outside and inside the blocks (a diffusers-named file using one
# mixes the two namings).
_OFFICIAL_TOP = frozenset(_TOP.values())
_OFFICIAL_BLOCK = frozenset(v for k, v in _BLOCK.items() if not k.startswith("norm"))


def split_key(key: str) -> tuple[str, str, str] | None:
    """(prefix, module path, suffix kind) of a LoRA file key, or None when the key is not understood."""
    prefix = next((p for p in PREFIXES if key.startswith(p)), None)
    if prefix is None:
        return None
    rest = key[len(prefix) :]
    suffix = next((s for s in SUFFIXES if rest.endswith(s)), None)
    if suffix is None or len(rest) == len(suffix):
        return None
    return prefix, rest[: -len(suffix)], SUFFIXES[suffix]


def _block_parts(path: str) -> tuple[str, str]:
    m = _BLOCK_PATH.fullmatch(path)
    return (m.group(1), m.group(2)) if m else ("", path)


def is_diffusers_path(path: str) -> bool:
    """Whether a module path is one only the diffusers naming uses (`norm2`/`norm3` exist in both)."""
    block, rest = _block_parts(path)
    return rest in _TOP if not block else rest in _BLOCK and not rest.startswith("norm")


def file_naming(keys: Iterable[tuple[str, str, str]]) -> str:
    """The naming of a file's (prefix, path, kind) keys: "diffusers" when any key speaks it (its prefix
    `transformer.`, or a module path only diffusers has), else "official"."""
    for prefix, path, _ in keys:
        if prefix.startswith(("transformer.", "base_model.model.transformer.")) or is_diffusers_path(path):
            return "diffusers"
    return "official"


def official_path(path: str) -> str | None:
    """The official module path of a diffusers module path (InfiniteTalk's own modules unchanged); None for
    an official-only path, which a diffusers-named file must not use."""
    block, rest = _block_parts(path)
    table = _BLOCK if block else _TOP
    if rest in table:
        return block + table[rest]
    return None if rest in (_OFFICIAL_BLOCK if block else _OFFICIAL_TOP) else path
