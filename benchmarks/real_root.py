"""A REAL-SIZE random weights root in the official layout, written to local disk for GPU smoke runs.

`write_real_root(root)` writes every file `model.weights.loading.load_models` reads, at the real Wan2.1-I2V-14B /
InfiniteTalk sizes with random values (no weights are downloaded), so the product's own loader, fp8
conversion, LoRA merge, compile, offload decision and VAE run exactly as for a user:
  * DiT 14B (40 blocks, dim 5120) as 7 safetensors shards + index + `InfiniteTalk/single/infinitetalk.safetensors`
    (the audio layers), in bf16 (the official shards are fp32: the loader casts to the run dtype either
    way; bf16 halves the bytes so the root fits the device's 64 GiB disk next to umT5);
  * umT5-XXL encoder (24 x 4096, vocab 256384) as `models_t5_umt5-xxl-enc-bf16.pth`, bf16;
  * CLIP ViT-H/14 vision tower (32 x 1280, fp16) with a small text tower (the loader ignores it);
  * Wan VAE (dim 96, z 16, fp32), chinese-wav2vec2-base sized folder (12 x 768; fp16 safetensors);
  * a small stand-in umT5 tokenizer (the real one is not downloaded: token counts differ);
  * optionally a rank-64 step-distill LoRA in the lightx2v format (`lora_down`/`lora_up`/`alpha` under
    `diffusion_model.`) for the fast preset: random, so the merge runs but distils nothing.
Large tensors are drawn on `device` (a GPU when there is one) and written shard by shard, so the host
never holds more than one shard. `tiny=True` writes the project's tiny root instead (model/weights/tiny.py),
plus a tiny LoRA of the same format: a CPU smoke test of the scripts that use this. Not a model:
random weights produce noise, never a dub. Holds no timing or benchmark logic.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

log = logging.getLogger("real_root")

DIT_SHARDS = 7  # as the official Wan2.1-I2V-14B-480P folder
LORA_NAME = "lightx2v_I2V_14B_480p_cfg_step_distill_rank64_bf16.safetensors"
_LORA_TARGETS = (
    *("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o"),
    *("cross_attn.q", "cross_attn.k", "cross_attn.v", "cross_attn.o", "cross_attn.k_img", "cross_attn.v_img"),
    *("ffn.0", "ffn.2"),
)


def _random(name: str, shape: tuple[int, ...], gen: torch.Generator, device: str, dtype: torch.dtype):
    """Fan-in scaled N(0, 1/fan_in) weights, unit norm gains, small biases (finite activations at 14B)."""
    if name.endswith("bias"):
        return torch.randn(shape, generator=gen, device=device).mul_(0.02).to(dtype)
    if len(shape) == 1:
        return torch.ones(shape, device=device, dtype=dtype)
    fan_in = shape[-1] if name.endswith("modulation") else math.prod(shape[1:])
    return torch.randn(shape, generator=gen, device=device).mul_(fan_in**-0.5).to(dtype)


def write_dit(root: Path, device: str, seed: int = 0) -> int:
    """The 14B DiT as `DIT_SHARDS` bf16 shards + index + the InfiniteTalk audio file; returns bytes written."""
    from model.config import DIT_PRESETS
    from model.network.dit import InfiniteTalkDiT
    from model.weights.layout import DIT_STEM, WeightsLayout
    from model.weights.tiny import dit_config_json, is_audio_key

    layout = WeightsLayout()
    wan = root / layout.wan_dir
    wan.mkdir(parents=True, exist_ok=True)
    config = DIT_PRESETS["infinitetalk-14b"]
    (wan / "config.json").write_text(json.dumps(dit_config_json(config), indent=2) + "\n")
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    gen = torch.Generator(device=device).manual_seed(seed)
    wan_items = sorted((n, s) for n, s in params if not is_audio_key(n))
    audio_items = sorted((n, s) for n, s in params if is_audio_key(n))
    weight_map: dict[str, str] = {}
    written = 0
    groups = _split(wan_items, DIT_SHARDS)
    for i, group in enumerate(groups):
        name = f"{DIT_STEM}-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        state = {n: _random(n, s, gen, device, torch.bfloat16).cpu() for n, s in group}
        save_file(state, str(wan / name), metadata={"format": "pt"})
        written += sum(t.numel() * t.element_size() for t in state.values())
        weight_map.update(dict.fromkeys(state, name))
        log.info("DiT shard %d/%d written (%.1f GB)", i + 1, len(groups), written / 1e9)
    index = {"metadata": {"total_size": written}, "weight_map": dict(sorted(weight_map.items()))}
    (wan / f"{DIT_STEM}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    audio = {n: _random(n, s, gen, device, torch.bfloat16).cpu() for n, s in audio_items}
    (root / layout.infinitetalk).parent.mkdir(parents=True, exist_ok=True)
    save_file(audio, str(root / layout.infinitetalk), metadata={"format": "pt"})
    return written + sum(t.numel() * t.element_size() for t in audio.values())


def _split(items: list[tuple[str, tuple[int, ...]]], n: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """`items` in order, cut into at most `n` groups of about equal element counts."""
    total = sum(math.prod(s) for _, s in items)
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    done = 0
    for name, shape in items:
        if groups[-1] and done >= total * len(groups) / n and len(groups) < n:
            groups.append([])
        groups[-1].append((name, shape))
        done += math.prod(shape)
    return groups


def write_t5(path: Path, device: str, seed: int = 2) -> int:
    """The umT5-XXL encoder with the official key names (bf16), saved like the official .pth."""
    from model.network.t5 import T5_CONFIGS

    c = T5_CONFIGS["umt5-xxl"]
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embedding.weight", (c.vocab_size, c.dim))]
    for i in range(c.num_layers):
        b = f"blocks.{i}."
        shapes += [(b + "norm1.weight", (c.dim,)), (b + "norm2.weight", (c.dim,))]
        shapes += [(b + f"attn.{p}.weight", (c.dim_attn, c.dim)) for p in "qkv"]
        shapes += [(b + "attn.o.weight", (c.dim, c.dim_attn))]
        shapes += [(b + "ffn.gate.0.weight", (c.dim_ffn, c.dim)), (b + "ffn.fc1.weight", (c.dim_ffn, c.dim))]
        shapes += [(b + "ffn.fc2.weight", (c.dim, c.dim_ffn))]
        shapes += [(b + "pos_embedding.embedding.weight", (c.num_buckets, c.num_heads))]
    shapes.append(("norm.weight", (c.dim,)))
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {n: _random(n, s, gen, device, torch.bfloat16).cpu() for n, s in shapes}
    state["token_embedding.weight"].mul_(c.dim**0.5)  # embeddings ~N(0, 1), as T5's are
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return sum(t.numel() * t.element_size() for t in state.values())


def write_lora(
    path: Path, device: str, *, rank: int = 64, layers: int = 40, dim: int = 5120, seed: int = 5
) -> Path:
    """A random lightx2v-format LoRA over every block linear (bf16 factors, alpha = rank, small updates)."""
    from model.config import DIT_PRESETS
    from model.network.dit import InfiniteTalkDiT

    config = DIT_PRESETS["infinitetalk-14b"] if dim == 5120 else DIT_PRESETS["tiny"]
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    gen = torch.Generator(device=device).manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for i in range(config.num_layers):
        for target in _LORA_TARGETS:
            key = f"blocks.{i}.{target}.weight"
            if key not in shapes:
                continue
            out_f, in_f = shapes[key]
            p = f"diffusion_model.blocks.{i}.{target}"
            state[p + ".lora_down.weight"] = _random("w", (rank, in_f), gen, device, torch.bfloat16).cpu()
            up = torch.randn((out_f, rank), generator=gen, device=device).mul_(1e-3 / rank**0.5)
            state[p + ".lora_up.weight"] = up.to(torch.bfloat16).cpu()
            state[p + ".alpha"] = torch.tensor(float(rank), dtype=torch.bfloat16)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def write_real_root(
    root: Path | str, *, device: str | None = None, lora: bool = True, tiny: bool = False
) -> dict:
    """Write the whole root (see the module doc); returns {"root", "lora", "bytes", "write_s"}."""
    from model.weights.layout import WeightsLayout
    from model.weights.tiny import (
        write_tiny_clip,
        write_tiny_root,
        write_tiny_tokenizer,
        write_tiny_vae,
        write_tiny_wav2vec,
    )

    t0 = time.perf_counter()
    root = Path(root)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    lora_path = root / LORA_NAME
    if tiny:
        write_tiny_root(root)
        if lora:
            from model.config import DIT_PRESETS

            c = DIT_PRESETS["tiny"]
            write_lora(lora_path, "cpu", rank=4, layers=c.num_layers, dim=c.dim)
        return {"root": str(root), "lora": str(lora_path) if lora else None, "bytes": None, "write_s": 0.0}
    layout = WeightsLayout()
    wan = root / layout.wan_dir
    nbytes = write_dit(root, device)
    nbytes += write_t5(wan / layout.t5, device)
    log.info("umT5 written (%.1f GB so far)", nbytes / 1e9)
    write_tiny_tokenizer(wan / layout.tokenizer)
    write_tiny_clip(wan / layout.clip, 3, dim=1280, layers=32, mlp_dim=5120)
    write_tiny_vae(wan / layout.vae, 1, dim=96, z_dim=16)
    write_tiny_wav2vec(root / layout.wav2vec_dir, 4)
    if lora:
        write_lora(lora_path, device)
    return {
        "root": str(root),
        "lora": str(lora_path) if lora else None,
        "bytes": nbytes,
        "write_s": round(time.perf_counter() - t0, 1),
    }


def write_gguf_root(
    root: Path | str, base: Path | str, tag: str, *, seed: int = 0, tiny: bool = False
) -> dict:
    """A random GGUF root for `infinitetalk.quant: gguf-<tag>` next to a written `base` root: the DiT as
    the GGUF pair of `model.weights.layout.WeightsLayout` (random valid blocks of `tag`'s type, written tensor
    by tensor, `model.weights.gguf_write.write_gguf_stream`; floats fan-in scaled as `_random`), everything else
    (config.json, VAE, umT5, tokenizer, CLIP, wav2vec2) symlinked from `base`. `tiny`: the tiny DiT
    (`base` must be a tiny root). Returns {"root", "bytes", "write_s"}."""
    import numpy as np

    from model.config import DIT_PRESETS
    from model.network.dit import InfiniteTalkDiT
    from model.weights.gguf import BLOCKS
    from model.weights.gguf_write import TYPES, random_quantized, write_gguf_stream
    from model.weights.layout import WeightsLayout
    from model.weights.tiny import is_audio_key

    t0 = time.perf_counter()
    root, base = Path(root), Path(base)
    layout = WeightsLayout()
    quant = f"gguf-{tag}"
    qtype = TYPES[tag[:4] if tag.startswith(("Q4_K", "Q5_K")) else tag]
    (root / layout.wan_dir).mkdir(parents=True, exist_ok=True)
    for item in (base / layout.wan_dir).iterdir():  # every non-DiT file of the base root
        if (
            not item.name.startswith("diffusion_pytorch_model")
            and not (root / layout.wan_dir / item.name).exists()
        ):
            (root / layout.wan_dir / item.name).symlink_to(item.resolve())
    if not (root / layout.wav2vec_dir).exists():
        (root / layout.wav2vec_dir).symlink_to((base / layout.wav2vec_dir).resolve())
    config = DIT_PRESETS["tiny" if tiny else "infinitetalk-14b"]
    with torch.device("meta"):
        params = [(n, tuple(p.shape)) for n, p in InfiniteTalkDiT(config).named_parameters()]
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)

    def make(name: str, shape: tuple[int, ...], kind: int) -> np.ndarray:
        fan_in = shape[-1] if name.endswith("modulation") else math.prod(shape[1:])
        if kind in BLOCKS:  # a Linear weight: random valid blocks of std 1/sqrt(fan_in)
            return random_quantized(shape, kind, fan_in**-0.5, rng)
        return _random(name, shape, gen, "cpu", torch.float32).numpy()

    wan_items = sorted((n, s) for n, s in params if not is_audio_key(n))
    audio_items = sorted((n, s) for n, s in params if is_audio_key(n))
    nbytes = write_gguf_stream(root / layout.gguf_dit_file(quant), wan_items, make, qtype)
    log.info("GGUF DiT %s written (%.1f GB)", tag, nbytes / 1e9)
    nbytes += write_gguf_stream(root / layout.dit_file(quant), audio_items, make, qtype)
    return {"root": str(root), "bytes": nbytes, "write_s": round(time.perf_counter() - t0, 1)}
