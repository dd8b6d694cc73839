"""Build every InfiniteTalk component from a weights root in the official layout.

`load_models(root, spec)` is the one entry point. Models are constructed on the meta device and
their weights assigned from memory-mapped files with strict key and shape checks, so a wrong or
damaged file fails before any compute with an error naming the file (and key). The components are
cross-checked against the DiT's config (text width, CLIP width, audio layers x width, latent channels).
This file only composes the component loaders (`model.weights.dit_loader`, `model.network.vae`, `model.network.t5`,
`model.network.clip`, `model.network.wav2vec`, `model.weights.quant`, `model.weights.lora`) and places the DiT (fp8, offload,
attention backend, compile); reading and strictly assigning checkpoints is `model.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from model.checkpoint import CheckpointError
from model.network.cudnn_attention import fp8_supported
from model.network.sparse_attention import SparseSettings
from model.runtime.offload import BlockOffload
from model.weights.fp8 import convert_to_fp8, fp8_options
from model.weights.layout import QUANTS, WeightsLayout, is_gguf, layout_for
from model.weights.lora import merge_lora

log = logging.getLogger(__name__)

COMPONENTS = ("dit", "vae", "t5", "clip", "audio")

__all__ = ["COMPONENTS", "LoadSpec", "Models", "load_models"]


# ---------------------------------------------------------------------------------------------
# load_models


@dataclass(frozen=True)
class LoadSpec:
    """What to load, where, and in which precision. Defaults are the official ones for a GPU run."""

    mode: str = "infinitetalk-480"
    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16  # DiT
    vae_dtype: torch.dtype = torch.float32
    t5_dtype: torch.dtype = torch.bfloat16
    clip_dtype: torch.dtype = torch.float16
    audio_dtype: torch.dtype = torch.float32
    t5_cpu: bool = False  # keep umT5 (~11 GB in bf16) on the CPU
    quant: str = (
        "none"  # none | fp8 | int8 (official quanto files) | gguf-<tag> (`model.weights.gguf`); DiT only
    )
    loras: tuple[tuple[str, float], ...] = ()  # (safetensors path, scale), merged in order
    components: tuple[str, ...] = COMPONENTS
    fp8_compute: bool = False  # DiT block linears as fp8 GEMMs (`model.weights.fp8`; Hopper `_scaled_mm`)
    compile: bool = False  # torch.compile each DiT block once (`model.runtime.compile`; regional compilation)
    fp8_attention: bool = False  # DiT self-attention as an fp8 kernel (Hopper): `attention_kernel`'s
    attention_kernel: str = (
        "cudnn"  # cudnn (`model.network.cudnn_attention`) | fa3 (`model.network.fa3_attention`, fa3-fwd)
    )
    # frame-window self-attention after the first steps (lossy opt-in, `model.network.sparse_attention`); on a GPU
    # it needs fp8_attention with attention_kernel fa3, on a CPU it runs SDPA per query group
    sparse: SparseSettings | None = None
    # DiT blocks streamed from pinned host memory (`model.runtime.offload.BlockOffload`): the DiT is built and
    # LoRA-merged on the host, fp8-converted block by block on the device as the blocks are pinned, so
    # its full weights never sit on the device at once
    offload: bool = False
    # the DiT from the multi (two-person) checkpoint (`WeightsLayout.multi`, same keys as single)
    multi: bool = False
    # why offload is on or off (logged by load_models; not compared, so not part of a cache key)
    offload_reason: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.quant not in QUANTS:
            raise ValueError(f"quant {self.quant!r} not in {QUANTS}")
        unknown = set(self.components) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"unknown components {sorted(unknown)}; known: {list(COMPONENTS)}")
        if self.loras and self.quant != "none":
            raise ValueError("LoRAs cannot be merged into a quantized DiT (as in the official pipeline)")
        if self.attention_kernel not in ("cudnn", "fa3"):
            raise ValueError(f"attention_kernel {self.attention_kernel!r} not in ('cudnn', 'fa3')")

    @classmethod
    def cpu_float32(cls, **changes) -> LoadSpec:
        """Everything float32 on the CPU (tests, tiny weights)."""
        f32 = torch.float32
        base = {
            "device": "cpu",
            "dtype": f32,
            "vae_dtype": f32,
            "t5_dtype": f32,
            "clip_dtype": f32,
            "t5_cpu": True,
        }
        return cls(**{**base, **changes})


@dataclass
class Models:
    """The loaded components (None where not requested)."""

    spec: LoadSpec
    dit: nn.Module | None = None
    vae: object | None = None  # model.network.vae.WanVAE
    t5: object | None = None  # model.network.t5.T5TextEncoder
    clip: object | None = None  # model.network.clip.ClipImageEncoder
    audio: object | None = None  # model.network.wav2vec.AudioEncoder


def _load_dit(root: Path, layout: WeightsLayout, spec: LoadSpec) -> nn.Module:
    from model.weights.dit_loader import load_dit  # the DiT network: imported when a DiT is loaded

    wan = root / layout.wan_dir
    # host first when offloaded or converted to fp8 (then placed by `_place_dit`), so the
    # float DiT never sits on the device whole
    device = "cpu" if spec.offload or spec.fp8_compute else spec.device
    if is_gguf(spec.quant):
        from model.weights.gguf import load_gguf_dit  # imports the gguf reader

        files = [root / layout.gguf_dit_file(spec.quant), root / layout.dit_file(spec.quant, spec.multi)]
        return load_gguf_dit(wan, files, dtype=spec.dtype, device=device)
    if spec.quant != "none":
        from model.weights.quant import load_quant_dit  # imports optimum-quanto

        qfile = root / layout.quant_file(spec.quant, spec.multi)
        return load_quant_dit(wan, qfile, dtype=spec.dtype, device=device)
    dit = load_dit(wan, root / layout.dit_file("none", spec.multi), dtype=spec.dtype, device=device)
    for path, scale in spec.loras:
        merge_lora(dit, Path(path), scale, device=spec.device)  # computed where it will run
    return dit


def _place_dit(dit: nn.Module, spec: LoadSpec) -> None:
    """Host-built DiT -> the run device: fp8 block Linears quantized on the device one layer at a time;
    with offload, block by block as each block goes to pinned host memory (`BlockOffload`'s `prepare`),
    everything but the blocks on the device. Peak device memory: the converted weights (resident) or
    one block's float weights + the slots (offload), never the whole float DiT."""

    device = spec.device
    options = fp8_options(device) if spec.fp8_compute else None
    if not spec.offload:
        if options is not None:
            n = convert_to_fp8(dit, device=device, place=device, options=options)
            log.info("DiT: %d block linears run as fp8 GEMMs", n)
        dit.to(device)
        return
    blocks = dit.blocks
    dit.blocks = nn.ModuleList()  # move the rest (embeddings, head, audio projection) without them
    try:
        dit.to(device)
    finally:
        dit.blocks = blocks
    counts: list[int] = []

    def prepare(block: nn.Module) -> None:
        counts.append(convert_to_fp8(block, include="", device=device, place="cpu", options=options))

    BlockOffload(dit, device, prepare=prepare if options is not None else None)
    if options is not None:
        log.info("DiT: %d block linears run as fp8 GEMMs (quantized block by block)", sum(counts))


def _cross_check(models: Models, root: Path, layout: WeightsLayout) -> None:
    """Every encoder must produce what the DiT's config expects."""
    if models.dit is None:
        return
    c = models.dit.config
    src = root / layout.wan_dir / "config.json"
    checks = []
    if models.t5 is not None:
        checks.append((layout.t5, "umT5 width", models.t5.model.config.d_model, "text_dim", c.text_dim))
    if models.clip is not None:
        checks.append(
            (layout.clip, "CLIP width", models.clip.model.config.hidden_size, "clip_dim", c.clip_dim)
        )
    if models.audio is not None:
        a = models.audio
        checks.append((layout.wav2vec_dir, "wav2vec2 layers", a.num_layers, "audio_blocks", c.audio_blocks))
        checks.append((layout.wav2vec_dir, "wav2vec2 width", a.hidden, "audio_channels", c.audio_channels))
    if models.vae is not None:
        checks.append((layout.vae, "VAE latent channels", models.vae.z_dim, "out_dim", c.out_dim))
    for rel, what, got, field, want in checks:
        if got != want:
            path = root / layout.wav2vec_dir if rel == layout.wav2vec_dir else root / layout.wan_dir / rel
            raise CheckpointError(f"{path}: {what} {got} does not match the DiT's {field} {want} ({src})")


def _set_attention(dit: nn.Module, spec: LoadSpec) -> None:
    """The DiT's attention backend and sparse settings from the spec; what cannot run fails here, at load."""
    device = torch.device(spec.device)
    if spec.fp8_attention and spec.attention_kernel == "fa3":
        from model.network import fa3_attention

        if not fa3_attention.available(device):
            raise ValueError(
                f"fp8_attention with attention_kernel fa3 needs a Hopper (sm90) CUDA device and the fa3-fwd "
                f"package (pip install 'dubflow[fa3]'); device is {spec.device!r}"
            )
        dit.attn_backend = "fa3_fp8"
        log.info("DiT: self-attention runs as FlashAttention-3 fp8 attention")
    elif spec.fp8_attention:
        if not fp8_supported(device):
            raise ValueError(
                f"fp8_attention needs a Hopper (sm90+) CUDA device and the nvidia-cudnn-frontend "
                f"package (pip install 'dubflow[cuda]'); device is {spec.device!r}"
            )
        dit.attn_backend = "cudnn_fp8"
        log.info("DiT: self-attention runs as cuDNN fp8 attention")
    if spec.sparse is None:
        return
    if device.type == "cpu" and not spec.fp8_attention:
        dit.attn_backend = "window_sdpa"
    elif dit.attn_backend != "fa3_fp8":
        raise ValueError(
            "sparse_window on a GPU needs fp8_attention with attention_kernel fa3 (FlashAttention-3's varlen "
            f"kernel); attention backend is {dit.attn_backend!r}"
        )
    dit.sparse = spec.sparse
    log.info(
        "DiT: LOSSY frame-window self-attention (window %d, group %d) after %d dense step(s)",
        spec.sparse.window, spec.sparse.group, spec.sparse.dense_steps,
    )  # fmt: skip


def load_models(root: Path | str, spec: LoadSpec | None = None) -> Models:
    """Load the requested components from a weights root in the official layout (see `model.weights.layout`)."""
    from model.network.clip import load_clip  # keep `import model.weights.loading` light
    from model.network.t5 import load_t5
    from model.network.vae import load_vae
    from model.network.wav2vec import load_wav2vec

    spec = spec or LoadSpec()
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: weights root not found")
    layout = layout_for(spec.mode, spec.quant)
    wan = root / layout.wan_dir
    models = Models(spec=spec)
    want = set(spec.components)
    if "dit" in want:
        if spec.offload or spec.offload_reason:
            log.info(
                "DiT block offload %s (%s)", "on" if spec.offload else "off", spec.offload_reason or "set"
            )
        models.dit = _load_dit(root, layout, spec)
        if spec.offload or spec.fp8_compute:
            _place_dit(models.dit, spec)
        _set_attention(models.dit, spec)
        if spec.compile:
            from model.runtime.compile import compile_blocks  # imports the DiT blocks

            compile_blocks(models.dit)
    if "vae" in want:
        models.vae = load_vae(wan / layout.vae, dtype=spec.vae_dtype, device=spec.device)
    if "t5" in want:
        t5_device = "cpu" if spec.t5_cpu else spec.device
        models.t5 = load_t5(wan / layout.t5, wan / layout.tokenizer, dtype=spec.t5_dtype, device=t5_device)
    if "clip" in want:
        models.clip = load_clip(wan / layout.clip, dtype=spec.clip_dtype, device=spec.device)
    if "audio" in want:
        models.audio = load_wav2vec(root / layout.wav2vec_dir, dtype=spec.audio_dtype, device=spec.device)
    _cross_check(models, root, layout)
    log.info(
        "loaded %s from %s (%s, quant %s%s)", ", ".join(spec.components), root, spec.device, spec.quant,
        ", multi-person DiT" if spec.multi and models.dit is not None else "",
    )  # fmt: skip
    return models
