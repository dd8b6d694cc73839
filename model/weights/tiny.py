"""Writers of tiny random model files in the official on-disk layouts (for tests and the dry-run demo).

Each writer is deterministic from its seed and produces files the matching loader in `model/` reads
exactly like the real ones. Add one `write_tiny_<component>` function per component.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from model.config import DIT_PRESETS, DiTConfig
from model.network.dit import InfiniteTalkDiT
from model.network.dit_blocks import LayerNorm32, RMSNorm
from model.network.vae_net import CausalVAE, VAEConfig
from model.weights.dit_loader import load_dit
from model.weights.layout import DIT_STEM, WeightsLayout

# The real Wan2.1-I2V-14B config.json has `_class_name`, `_diffusers_version` and these keys; other WanModel kwargs are written only when
# they differ from the WanModel defaults (as the tiny parity config does).
_WAN_CONFIG_KEYS = (
    "dim",
    "eps",
    "ffn_dim",
    "freq_dim",
    "in_dim",
    "model_type",
    "num_heads",
    "num_layers",
    "out_dim",
    "text_len",
)


def is_audio_key(key: str) -> bool:
    """Keys that live in `infinitetalk.safetensors` rather than the Wan2.1 shards."""
    return key.startswith("audio_proj.") or ".audio_cross_attn." in key or ".norm_x." in key


def dit_config_json(config: DiTConfig) -> dict:
    """config.json content: the official key set plus every kwarg that differs from WanModel defaults."""
    official = config.to_official()
    defaults = DiTConfig().to_official()
    out: dict = {"_class_name": "WanModel", "_diffusers_version": "0.30.0"}
    for key in _WAN_CONFIG_KEYS:
        out[key] = official[key]
    for key, value in official.items():
        if key not in out and value != defaults[key]:
            out[key] = value
    return out


def random_dit_state(
    config: DiTConfig, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Random DiT weights: N(0, 0.05^2), norm weights 1 + N(0, 0.05^2), drawn in parameter order.

    The time-embedding columns that see sinusoid frequencies >= 0.003 are scaled by 0.02 so the
    modulation is smooth in t (as the parity goldens do; otherwise TeaCache never reuses).
    """
    with torch.device("meta"):
        model = InfiniteTalkDiT(config)
    norm_weights = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, RMSNorm | LayerNorm32 | nn.LayerNorm)
        and getattr(module, "weight", None) is not None
    }
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, param in model.named_parameters():
        value = torch.randn(param.shape, generator=gen) * 0.05
        if name in norm_weights:
            value = value + 1.0
        state[name] = value
    half = config.freq_dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64) / half)
    fast = torch.cat([freqs, freqs]) >= 0.003  # columns: [cos | sin] of each frequency
    state["time_embedding.0.weight"][:, fast] *= 0.02
    return {k: v.to(dtype).contiguous() for k, v in state.items()}


def write_tiny_dit(
    wan_dir: Path | str,
    infinitetalk_file: Path | str,
    config: DiTConfig,
    seed: int,
    n_shards: int = 3,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Write a random DiT in the official layout; returns the state dict written.

    wan_dir gets config.json, `diffusion_pytorch_model-0000k-of-0000n.safetensors` (non-audio keys)
    and the index json; infinitetalk_file gets the audio keys.
    """
    wan_dir, infinitetalk_file = Path(wan_dir), Path(infinitetalk_file)
    wan_dir.mkdir(parents=True, exist_ok=True)
    infinitetalk_file.parent.mkdir(parents=True, exist_ok=True)
    state = random_dit_state(config, seed, dtype)

    (wan_dir / "config.json").write_text(json.dumps(dit_config_json(config), indent=2) + "\n")

    wan_keys = sorted(k for k in state if not is_audio_key(k))
    per_shard = math.ceil(len(wan_keys) / n_shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(n_shards):
        keys = wan_keys[i * per_shard : (i + 1) * per_shard]
        name = f"{DIT_STEM}-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: state[k] for k in keys}, str(wan_dir / name), metadata={"format": "pt"})
        for k in keys:
            weight_map[k] = name
            total += state[k].numel() * state[k].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (wan_dir / f"{DIT_STEM}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    audio = {k: state[k] for k in sorted(state) if is_audio_key(k)}
    save_file(audio, str(infinitetalk_file), metadata={"format": "pt"})
    return state


# ---------------------------------------------------------------------------------------------
# tiny encoders, VAE and a complete tiny weights root (official layout)


def _normal(gen: torch.Generator, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(shape, generator=gen).mul_(std).add_(mean)


def write_tiny_vae(path: Path | str, seed: int, dim: int = 8, z_dim: int = 16) -> dict[str, torch.Tensor]:
    """Random Wan VAE saved like `Wan2.1_VAE.pth`: conv kernels N(0, 1/fan_in), gains 1 + N(0, 0.05^2)."""

    with torch.device("meta"):
        model = CausalVAE(VAEConfig(dim=dim, z_dim=z_dim))
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, p in model.state_dict().items():
        if name.endswith("gamma"):
            state[name] = _normal(gen, p.shape, 0.05, 1.0)
        elif name.endswith("bias"):
            state[name] = _normal(gen, p.shape, 0.05)
        else:
            fan_in = math.prod(p.shape[1:])
            gain = 0.64 if name.startswith("decoder.head") else 1.0
            state[name] = _normal(gen, p.shape, math.sqrt(gain / fan_in))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


def write_tiny_t5(path: Path | str, seed: int, dim: int = 64, vocab: int = 256, layers: int = 2) -> dict:
    """Random umT5 encoder with the official key names, saved like `models_t5_umt5-xxl-enc-bf16.pth`."""
    heads, ffn, buckets = 4, 2 * dim, 32
    gen = torch.Generator().manual_seed(seed)
    state = {"token_embedding.weight": _normal(gen, (vocab, dim), 1.0)}
    for i in range(layers):
        b = f"blocks.{i}."
        state[b + "norm1.weight"] = _normal(gen, (dim,), 0.05, 1.0)
        for proj in "qkvo":
            state[b + f"attn.{proj}.weight"] = _normal(gen, (dim, dim), 0.05)
        state[b + "norm2.weight"] = _normal(gen, (dim,), 0.05, 1.0)
        state[b + "ffn.gate.0.weight"] = _normal(gen, (ffn, dim), 0.05)
        state[b + "ffn.fc1.weight"] = _normal(gen, (ffn, dim), 0.05)
        state[b + "ffn.fc2.weight"] = _normal(gen, (dim, ffn), 0.05)
        state[b + "pos_embedding.embedding.weight"] = _normal(gen, (buckets, heads), 0.5)
    state["norm.weight"] = _normal(gen, (dim,), 0.05, 1.0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return state


_TINY_WORDS = (
    *("the", "a", "an", "man", "woman", "person", "is", "are", "talking", "speaking", "singing", "to"),
    *("camera", "in", "on", "at", "and", "of", "with", "face", "smiling", "looking", "room", "light"),
)


def write_tiny_tokenizer(directory: Path | str) -> Path:
    """A small SentencePiece-style Unigram tokenizer (<pad>=0, </s>=1, <unk>=2) that `AutoTokenizer`
    loads offline as a T5 tokenizer, standing in for the `google/umt5-xxl` folder."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -6.0) for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [("\u2581" + w, -3.0) for w in _TINY_WORDS]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    special = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    config = {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "model_max_length": 512, **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return directory


def write_tiny_clip(
    path: Path | str, seed: int, dim: int = 1280, layers: int = 2, mlp_dim: int = 64
) -> dict[str, torch.Tensor]:
    """Random XLM-RoBERTa CLIP with the official key names: the vision tower (224 px, patch 14, so
    257 tokens of width `dim`) plus a tiny text tower and `log_scale`, as the official file holds."""
    gen = torch.Generator().manual_seed(seed)
    embed, text_dim, vocab, text_len, ffn = 32, 32, 64, 16, 128
    s: dict[str, torch.Tensor] = {"log_scale": torch.tensor(math.log(1 / 0.07))}
    v = "visual."
    s[v + "cls_embedding"] = _normal(gen, (1, 1, dim), 0.5)
    s[v + "pos_embedding"] = _normal(gen, (1, 257, dim), 0.5)
    s[v + "patch_embedding.weight"] = _normal(gen, (dim, 3, 14, 14), 0.05)
    s[v + "pre_norm.weight"], s[v + "pre_norm.bias"] = (
        _normal(gen, (dim,), 0.05, 1.0),
        _normal(gen, (dim,), 0.05),
    )
    for i in range(layers):
        b = f"{v}transformer.{i}."
        for norm in ("norm1", "norm2"):
            s[b + norm + ".weight"], s[b + norm + ".bias"] = (
                _normal(gen, (dim,), 0.05, 1.0),
                _normal(gen, (dim,), 0.05),
            )
        s[b + "attn.to_qkv.weight"], s[b + "attn.to_qkv.bias"] = (
            _normal(gen, (3 * dim, dim), 0.02),
            _normal(gen, (3 * dim,), 0.02),
        )
        s[b + "attn.proj.weight"], s[b + "attn.proj.bias"] = (
            _normal(gen, (dim, dim), 0.02),
            _normal(gen, (dim,), 0.02),
        )
        s[b + "mlp.0.weight"], s[b + "mlp.0.bias"] = (
            _normal(gen, (mlp_dim, dim), 0.05),
            _normal(gen, (mlp_dim,), 0.05),
        )
        s[b + "mlp.2.weight"], s[b + "mlp.2.bias"] = (
            _normal(gen, (dim, mlp_dim), 0.05),
            _normal(gen, (dim,), 0.05),
        )
    s[v + "post_norm.weight"], s[v + "post_norm.bias"] = (
        _normal(gen, (dim,), 0.05, 1.0),
        _normal(gen, (dim,), 0.05),
    )
    s[v + "head"] = _normal(gen, (dim, embed), 0.05)
    t = "textual."
    s[t + "token_embedding.weight"] = _normal(gen, (vocab, text_dim), 0.05)
    s[t + "type_embedding.weight"] = _normal(gen, (1, text_dim), 0.05)
    s[t + "pos_embedding.weight"] = _normal(gen, (text_len, text_dim), 0.05)
    b = t + "blocks.0."
    for proj in "qkvo":
        s[b + f"attn.{proj}.weight"], s[b + f"attn.{proj}.bias"] = (
            _normal(gen, (text_dim, text_dim), 0.05),
            _normal(gen, (text_dim,), 0.05),
        )
    for norm in ("norm1", "norm2"):
        s[b + norm + ".weight"], s[b + norm + ".bias"] = (
            _normal(gen, (text_dim,), 0.05, 1.0),
            _normal(gen, (text_dim,), 0.05),
        )
    s[b + "ffn.0.weight"], s[b + "ffn.0.bias"] = (
        _normal(gen, (ffn, text_dim), 0.05),
        _normal(gen, (ffn,), 0.05),
    )
    s[b + "ffn.2.weight"], s[b + "ffn.2.bias"] = (
        _normal(gen, (text_dim, ffn), 0.05),
        _normal(gen, (text_dim,), 0.05),
    )
    s[t + "norm.weight"], s[t + "norm.bias"] = (
        _normal(gen, (text_dim,), 0.05, 1.0),
        _normal(gen, (text_dim,), 0.05),
    )
    s[t + "head.0.weight"] = _normal(gen, (text_dim, text_dim), 0.05)
    s[t + "head.2.weight"] = _normal(gen, (embed, text_dim), 0.05)
    s = {k: val.to(torch.float16) for k, val in s.items()}  # the real file is half precision too
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(s, path)
    return s


def write_tiny_wav2vec(directory: Path | str, seed: int, layers: int = 12, hidden: int = 768) -> Path:
    """Random wav2vec2 HF folder (config, preprocessor config, fp16 model.safetensors). Layer count
    and width are what the DiT's audio adapter hard-codes; everything else is shrunk. Linear and conv
    weights N(0, 1/fan_in), norm gains 1 + N(0, 0.05^2), biases N(0, 0.02^2)."""
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=32,
        conv_dim=(16,) * 7,
        conv_kernel=(10, 3, 3, 3, 3, 2, 2),
        conv_stride=(5, 2, 2, 2, 2, 2, 2),
        conv_bias=False,
        feat_extract_norm="group",
        do_stable_layer_norm=False,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=16,
        mask_time_prob=0.0,
        vocab_size=32,
    )
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Wav2Vec2Model(config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        if "layer_norm" in name:  # LayerNorm / GroupNorm affine
            state[name] = _normal(gen, shape, 0.05, 1.0 if name.endswith("weight") else 0.0)
        elif name.endswith("bias") or name.endswith("masked_spec_embed"):
            state[name] = _normal(gen, shape, 0.02)
        elif name.endswith("original0"):  # weight-norm gain of the positional conv
            state[name] = _normal(gen, shape, 0.05, 1.0)
        else:
            state[name] = _normal(gen, shape, math.sqrt(1.0 / math.prod(shape[1:])))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(directory))
    state = {k: v.to(torch.float16).contiguous() for k, v in state.items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    extractor = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True, return_attention_mask=False
    )
    extractor.save_pretrained(str(directory))
    return directory


def write_tiny_quant(
    wan_dir: Path | str, infinitetalk_file: Path | str, out_file: Path | str, quant: str
) -> Path:
    """Quantize a written tiny DiT with optimum-quanto (fp8 | int8) into the official file pair
    (`<out>.safetensors` + `<out>.json` quantization map)."""
    from optimum.quanto import freeze, qfloat8, qint8, quantization_map, quantize

    model = load_dit(wan_dir, infinitetalk_file, dtype=torch.float32)
    quantize(model, weights={"fp8": qfloat8, "int8": qint8}[quant])
    freeze(model)
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_file), metadata={"format": "pt"})
    out_file.with_suffix(".json").write_text(json.dumps(quantization_map(model), indent=2) + "\n")
    return out_file


def write_tiny_multi(infinitetalk_file: Path | str, config: DiTConfig, seed: int) -> dict[str, torch.Tensor]:
    """The multi (two-person) InfiniteTalk file: the single file's keys and shapes, other random values."""
    state = random_dit_state(config, seed)
    audio = {k: state[k] for k in sorted(state) if is_audio_key(k)}
    Path(infinitetalk_file).parent.mkdir(parents=True, exist_ok=True)
    save_file(audio, str(infinitetalk_file), metadata={"format": "pt"})
    return audio


def add_tiny_multi(root: Path | str, seed: int = 0) -> bool:
    """Give a tiny root written before the multi checkpoint joined the layout its multi file (the one
    `write_tiny_root` writes, written to a temporary name and moved into place); False if it had one."""

    target = Path(root) / WeightsLayout().multi
    if target.is_file():
        return False
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    write_tiny_multi(tmp, DIT_PRESETS["tiny"], seed + 5)
    os.replace(tmp, target)
    return True


def write_tiny_root(
    root: Path | str, seed: int = 0, *, quants: tuple[str, ...] = (), multi: bool = True
) -> Path:
    """Write a complete tiny weights root in the official layout (see `model.weights.layout`) that
    `load_models` reads exactly like the real one: tiny DiT (3 shards + index + InfiniteTalk file),
    the multi InfiniteTalk file (unless `multi=False`; seeded apart from single), VAE, umT5 + tokenizer,
    CLIP (vision + text tower), wav2vec2 folder, optional quantized DiTs."""

    root = Path(root)
    layout = WeightsLayout()
    wan = root / layout.wan_dir
    config = DIT_PRESETS["tiny"]
    write_tiny_dit(wan, root / layout.infinitetalk, config, seed)
    if multi:
        write_tiny_multi(root / layout.multi, config, seed + 5)
    write_tiny_vae(wan / layout.vae, seed + 1, z_dim=config.out_dim)
    write_tiny_t5(wan / layout.t5, seed + 2, dim=config.text_dim)
    write_tiny_tokenizer(wan / layout.tokenizer)
    write_tiny_clip(wan / layout.clip, seed + 3, dim=config.clip_dim)
    write_tiny_wav2vec(
        root / layout.wav2vec_dir, seed + 4, layers=config.audio_blocks, hidden=config.audio_channels
    )
    for quant in quants:
        write_tiny_quant(wan, root / layout.infinitetalk, root / layout.quant_file(quant), quant)
    return root


def write_tiny_gguf(
    root: Path | str, tag: str, *, float_type: str = "BF16", multi: bool = False
) -> list[Path]:
    """The written root's DiT (Wan shards + InfiniteTalk file, read back as float32) as the GGUF pair of
    `gguf-<tag>` (`WeightsLayout.gguf_dit_file` + the adapter file; with `multi`, the multi adapter too),
    in the published conversions' layout (`model.weights.gguf_write`). A `_M` / `_S` tag is written with the base
    K-quant type. Returns the files written."""
    from model.checkpoint import read_safetensors, read_safetensors_index
    from model.weights.gguf_write import TYPES, write_gguf
    from model.weights.layout import DIT_STEM, WeightsLayout

    root = Path(root)
    layout = WeightsLayout()
    wan = root / layout.wan_dir
    qtype = TYPES[tag[:4] if tag.startswith(("Q4_K", "Q5_K")) else tag]
    state: dict[str, torch.Tensor] = {}
    for path in sorted(set(read_safetensors_index(wan, DIT_STEM).values())):
        state.update(read_safetensors(path, dtype=torch.float32))
    quant = f"gguf-{tag}"
    written = [
        write_gguf(
            root / layout.gguf_dit_file(quant), {k: v.numpy() for k, v in state.items()}, qtype,
            float_type=TYPES[float_type],
        )
    ]  # fmt: skip
    for person in (False, True) if multi else (False,):
        src = root / (layout.multi if person else layout.infinitetalk)
        adapter = read_safetensors(src, dtype=torch.float32)
        written.append(
            write_gguf(
                root / layout.dit_file(quant, person), {k: v.numpy() for k, v in adapter.items()}, qtype,
                float_type=TYPES[float_type],
            )
        )  # fmt: skip
    return written
