"""The backend's options and what follows from them before any model runs: the `infinitetalk` section
with `backend.options` applied and cross-checked, the region config, the run device, the offload
decision, the `model.weights.loading.LoadSpec`, and the VAE tiling option with the VAE wrapper that applies it.

Pure decisions over the config (and, for `offload: auto` / `vae_tiling: auto`, the device's memory);
nothing here loads weights, reads media or keeps state between calls.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.config import DIT_PRESETS
from model.network.cudnn_attention import fp8_supported
from model.network.sparse_attention import SparseSettings
from model.network.tiling import TileSpec
from model.network.vae_net import ZeroTailMemo
from model.runtime.offload import (
    OTHER_MODELS_BYTES,
    T5_BYTES,
    MemoryNeed,
    decide_offload,
    device_memory_limit,
    dit_weight_split,
    free_device_memory,
    memo_bytes,
    vae_tiling_for,
    working_bytes_per_token,
)
from model.weights.layout import gguf_bytes_per_weight, is_gguf
from model.weights.loading import LoadSpec
from tasks.config.pipeline import PipelineConfig
from tasks.config.schema import build_section
from tasks.errors import ConfigError
from tasks.infinitetalk.settings import PRESETS, SECTION, InfiniteTalkConfig, PresetsConfig
from tasks.infinitetalk.timeline import WAV2VEC_RATE
from tasks.infinitetalk.tiny import tiny_hw
from tasks.picture.geometry import BUCKET_TABLES

if TYPE_CHECKING:
    import torch

    from model.runtime.offload import MemoryNeed, OffloadDecision


def resolve_options(
    cfg: PipelineConfig, overrides: Mapping[str, Any] | None = None, *, need_weights: bool = True
) -> InfiniteTalkConfig:
    """The `infinitetalk` section with `backend.options` applied, type-checked and cross-checked.

    `need_weights=False` (estimates) accepts a real mode without a weights root.
    """
    known = [f.name for f in dataclasses.fields(InfiniteTalkConfig)]
    unknown = sorted(set(overrides or {}) - set(known))
    if unknown:
        raise ConfigError(
            "backend.options", f"unknown infinitetalk option {unknown[0]} (known: {', '.join(known)})"
        )
    data = cfg.to_dict()
    presets = build_section(PresetsConfig, data[PRESETS], "backend.options", f"{PRESETS}.")
    section = with_preset({**data[SECTION], **dict(overrides or {})}, vars(presets))
    opts = build_section(InfiniteTalkConfig, section, "backend.options", f"{SECTION}.")
    if opts.gpus_per_shot < 1:  # (a loaded config is checked already: tasks.infinitetalk.settings)
        raise ConfigError(
            "backend.options", f"infinitetalk.gpus_per_shot: must be >= 1, got {opts.gpus_per_shot}"
        )
    for i, lora in enumerate(opts.loras):
        if not isinstance(lora.get("path"), str) or not isinstance(lora.get("scale", 1.0), int | float):
            raise ConfigError(
                "infinitetalk.loras", f"entry {i} must be {{path: FILE, scale: NUMBER}}, got {lora}"
            )
    if opts.loras and opts.quant != "none":
        raise ConfigError("infinitetalk.loras", "LoRAs cannot be merged into a quantized DiT (quant: none)")
    if opts.mode != "tiny":
        if opts.weights is None and need_weights:
            raise ConfigError(
                "infinitetalk.weights",
                f"mode {opts.mode} needs a weights root (dubflow weights download), or use mode tiny",
            )
        table = opts.mode.removeprefix("infinitetalk-")
        if cfg.frames.bucket != table:
            raise ConfigError(
                "frames.bucket",
                f"mode {opts.mode} generates on the {table} buckets: set frames.bucket={table}",
            )
    if cfg.audio.sample_rate != WAV2VEC_RATE:
        raise ConfigError("audio.sample_rate", f"InfiniteTalk's wav2vec2 needs {WAV2VEC_RATE} Hz audio")
    if opts.gpus_per_shot > 1 and opts.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(
            "infinitetalk.device",
            f"{opts.device}: with gpus_per_shot > 1 rank r uses visible GPU r; pick them with "
            "CUDA_VISIBLE_DEVICES and set device auto or cuda",
        )
    if not 0.0 < opts.denoise_strength <= 1.0:
        raise ConfigError("infinitetalk.denoise_strength", f"must be in (0, 1], got {opts.denoise_strength}")
    if opts.vae_tile_px < 32 or opts.vae_tile_px % 32:
        raise ConfigError(
            "infinitetalk.vae_tile_px", f"must be a positive multiple of 32, got {opts.vae_tile_px}"
        )
    if opts.sparse_window is not None and opts.sparse_window < 0:
        raise ConfigError(
            "infinitetalk.sparse_window", f"must be null or >= 0 latent frames, got {opts.sparse_window}"
        )
    if opts.sparse_group < 1 or opts.sparse_dense_steps < 0:
        raise ConfigError(
            "infinitetalk.sparse_group", f"sparse_group >= 1 and sparse_dense_steps >= 0, got "
            f"{opts.sparse_group} and {opts.sparse_dense_steps}",
        )  # fmt: skip
    subset = opts.step_subset
    if subset is not None and (not subset or list(subset) != sorted(set(subset)) or subset[0] < 0):
        raise ConfigError(
            "infinitetalk.step_subset", f"must be increasing step indices from 0, got {list(subset)}"
        )
    if opts.preset == "fast" and need_weights:
        opts = with_distill_lora(opts)
    return opts


PRESET_KEYS = (
    "steps",
    "shift",
    "text_guide_scale",
    "audio_guide_scale",
    "fp8_compute",
    "fp8_attention",
    "vae_dtype",
)


def with_preset(section: dict[str, Any], presets: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The `infinitetalk` mapping with every preset key left null filled from `presets[preset]`."""
    name = section.get("preset")
    if name not in presets:
        raise ConfigError("infinitetalk.preset", f"{name!r} is not one of {', '.join(presets)}")
    table = presets[name]
    keys = sorted(set(table) ^ set(PRESET_KEYS))
    if keys:
        raise ConfigError(f"presets.{name}", f"must set exactly {', '.join(PRESET_KEYS)} (not {keys[0]})")
    return {**section, **{k: table[k] for k in PRESET_KEYS if section.get(k) is None}}


DISTILL_NAMES = ("lightx2v", "fusionx", "distill")  # lightx2v / FusionX step-distill LoRA file names


def distill_loras(root: Path) -> list[Path]:
    """Step-distill LoRA files a weights root holds (top level or `loras/`), by their published names."""
    found = [*root.glob("*.safetensors"), *root.glob("loras/*.safetensors")]
    return sorted(p for p in found if any(n in p.name.lower() for n in DISTILL_NAMES))


def with_distill_lora(opts: InfiniteTalkConfig) -> InfiniteTalkConfig:
    """The fast preset's requirement: a step-distill LoRA in `loras`, else the weights root's (added at
    scale 1.0), unless `distilled: true` declares the root's DiT step-distilled already (then none is
    added). 4 undistilled steps give noise, not a dub: without either this is a ConfigError."""
    if opts.distilled:
        if opts.weights is None:
            raise ConfigError("infinitetalk.distilled", "true needs a weights root (tiny mode has none)")
        return opts
    if any(any(n in Path(lora["path"]).name.lower() for n in DISTILL_NAMES) for lora in opts.loras):
        return opts
    root = Path(opts.weights) if opts.weights is not None else None
    found = distill_loras(root) if root is not None and root.is_dir() else []
    if not found:
        where = f"in {root} or its loras/" if root is not None else "(tiny mode has no weights root)"
        raise ConfigError(
            "infinitetalk.preset",
            f"fast needs a step-distilled LoRA (lightx2v / FusionX) in infinitetalk.loras or {where}, "
            "or a step-distilled DiT declared with infinitetalk.distilled: true; 4 undistilled steps are noise",
        )
    if opts.quant != "none":
        raise ConfigError("infinitetalk.preset", "fast merges a step-distill LoRA: it needs quant: none")
    return dataclasses.replace(opts, loras=(*opts.loras, {"path": str(found[0]), "scale": 1.0}))


def fp8_flags(opts: InfiniteTalkConfig, device: str) -> tuple[bool, bool]:
    """(fp8 GEMMs, fp8 attention) on `device`: `auto` is on where supported (CUDA sm90+; fp8 attention
    also needs the cuDNN frontend), off elsewhere; never in tiny mode or on a CPU. A GGUF DiT keeps its
    block formats (fp8 GEMMs would re-expand a Q4_K weight to a byte): no fp8 GEMMs."""
    import torch

    from model.weights.layout import is_gguf

    if opts.mode == "tiny" or not device.startswith("cuda"):
        return False, False
    gemm = bool(opts.fp8_compute) and not is_gguf(opts.quant)
    if opts.fp8_compute == "auto" and not is_gguf(opts.quant):  # only `auto` asks the device
        gemm = torch.cuda.get_device_capability(device) >= (9, 0)
    if opts.fp8_attention == "auto":
        return gemm, fp8_supported(torch.device(device))
    return gemm, bool(opts.fp8_attention)


def resolve_device(name: str) -> str:
    """The run device of `infinitetalk.device`, always indexed on CUDA (`device_for`): the visible CUDA
    devices are counted without creating a CUDA context, the local rank comes from `LOCAL_RANK`."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return device_for(name, cuda_count=count, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def device_for(name: str, *, cuda_count: int, local_rank: int = 0) -> str:
    """`auto` -> `cuda:<local rank>` when CUDA devices are visible, else `cpu`; `cuda` -> `cuda:<local rank>`;
    `cuda:N` as given. CUDA APIs that take a device (memory fraction, properties) need the index, and a
    process serves one device, so the name is indexed once here. Errors name the key and the problem."""
    if name == "cpu":
        return name
    if name not in ("auto", "cuda") and not name.startswith("cuda:"):
        raise ConfigError("infinitetalk.device", f"{name}: expected auto, cpu, cuda or cuda:N")
    if cuda_count == 0:
        if name == "auto":
            return "cpu"
        raise ConfigError("infinitetalk.device", f"{name}: no CUDA device is available")
    index = local_rank if name in ("auto", "cuda") else name.removeprefix("cuda:")
    if not str(index).isdigit() or int(index) >= cuda_count:
        why = f"local rank {local_rank}" if name in ("auto", "cuda") else f"index {index}"
        raise ConfigError("infinitetalk.device", f"{name}: {why} but {cuda_count} CUDA device(s) visible")
    return f"cuda:{int(index)}"


def memory_need(
    opts: InfiniteTalkConfig, device: str, *, frame_num: int = 81, fp8: bool | None = None
) -> MemoryNeed:
    """What a run of the options needs on `device`, piece by piece (`model.runtime.offload.MemoryNeed`): at the
    mode's largest bucket and `frame_num`-frame chunks, with its compile / fp8 / batched-guidance settings,
    umT5 unless `t5_cpu`, and the conditioning-encode memo at the VAE dtype. `fp8`: the fp8-GEMM flag
    (default: `fp8_flags` on `device`)."""
    import torch

    tiny = opts.mode == "tiny"
    table = BUCKET_TABLES["480" if tiny else opts.mode.removeprefix("infinitetalk-")]
    h, w = max(table.values(), key=lambda hw: hw[0] * hw[1])
    h, w = tiny_hw((h, w)) if tiny else (h, w)
    tokens = (1 + (frame_num - 1) // 4) * (h // 16) * (w // 16)  # latent frames x 2x2 patches of h/8 x w/8
    fp8 = fp8_flags(opts, device)[0] if fp8 is None else fp8
    dtype = torch.float32 if tiny else getattr(torch, opts.dtype)
    config = DIT_PRESETS["tiny" if tiny else "infinitetalk-14b"]
    gguf = gguf_bytes_per_weight(opts.quant) if is_gguf(opts.quant) else None
    quantized = opts.quant != "none" and opts.quant not in ("gguf-F16", "gguf-BF16")
    rest, block = dit_weight_split(config, dtype, fp8_blocks=fp8, quantized=quantized, gguf_bytes=gguf)
    vae_dtype = getattr(torch, opts.vae_dtype or "float32")
    other = 0 if tiny else OTHER_MODELS_BYTES + (0 if opts.t5_cpu else T5_BYTES)
    other += memo_bytes(h, w, frame_num, vae_dtype)
    compiled = opts.compile is not False  # auto compiles on CUDA
    per_token = working_bytes_per_token(fp8_blocks=fp8, compiled=compiled, batched=opts.batch_branches)
    return MemoryNeed(
        dit_resident=rest + config.num_layers * block,
        dit_offloaded=rest + 2 * block,  # BlockOffload's two device slots
        working=tokens * per_token,
        other=other,
    )


def offload_decision(
    opts: InfiniteTalkConfig, device: str, *, frame_num: int = 81, limit_bytes: int | None = None
) -> OffloadDecision:
    """`infinitetalk.offload` for a run on `device`. auto: offload when the device's usable memory
    (`limit_bytes`; default: asked from CUDA) is below what a resident run needs (`memory_need`); never
    on a CPU. auto and true raise `model.runtime.offload.DeviceMemoryError` (one line naming the pieces) when
    even an offloaded run does not fit, before anything is loaded."""
    import torch

    device_type = torch.device(device).type
    if opts.offload is False or device_type != "cuda":
        return decide_offload(opts.offload, device_type=device_type, limit_bytes=None, need_bytes=0)
    if opts.offload is True and limit_bytes is None and not torch.cuda.is_available():
        return decide_offload(True, device_type=device_type, limit_bytes=None, need_bytes=0)  # planning host
    need = memory_need(opts, device, frame_num=frame_num)
    limit = device_memory_limit(device) if limit_bytes is None else limit_bytes
    return decide_offload(
        opts.offload, device_type=device_type, limit_bytes=limit, need_bytes=need.resident,
        offload_bytes=need.offloaded, device=device, detail=need.describe(offloaded=True),
    )  # fmt: skip


def load_spec(opts: InfiniteTalkConfig, device: str, *, frame_num: int = 81) -> LoadSpec:
    """The `model.weights.loading.LoadSpec` of the options (tiny mode and CPU runs: float32), with the offload
    decision of `offload_decision` (its reason rides along and is logged by the loader)."""
    import torch

    layout = "infinitetalk-480" if opts.mode == "tiny" else opts.mode
    loras = tuple((str(lora["path"]), float(lora.get("scale", 1.0))) for lora in opts.loras)
    off = offload_decision(opts, device, frame_num=frame_num)
    if opts.mode == "tiny" or device == "cpu":
        f32 = torch.float32
        return LoadSpec(
            mode=layout, device=device, dtype=f32, vae_dtype=f32, t5_dtype=f32, clip_dtype=f32,
            audio_dtype=f32, t5_cpu=True, quant=opts.quant, loras=loras, offload=off.offload,
            offload_reason=off.reason, sparse=sparse_settings(opts),
        )  # fmt: skip
    dtype = getattr(torch, opts.dtype)
    fp8_compute, fp8_attention = fp8_flags(opts, device)
    compile_dit = device.startswith("cuda") if opts.compile is None else opts.compile
    return LoadSpec(
        mode=layout, device=device, dtype=dtype, t5_cpu=opts.t5_cpu, quant=opts.quant, loras=loras,
        fp8_compute=fp8_compute, fp8_attention=fp8_attention, compile=compile_dit,
        attention_kernel=attention_kernel(opts, device), sparse=sparse_settings(opts),
        vae_dtype=getattr(torch, opts.vae_dtype),
        offload=off.offload, offload_reason=off.reason,
    )  # fmt: skip


def attention_kernel(opts: InfiniteTalkConfig, device: str) -> str:
    """The fp8 attention kernel (`infinitetalk.attention_kernel`): auto = fa3 where FlashAttention-3 runs
    (`fa3-fwd` installed, sm90), else cudnn."""
    import torch

    if opts.attention_kernel != "auto":
        return opts.attention_kernel
    from model.network.fa3_attention import available

    return "fa3" if device.startswith("cuda") and available(torch.device(device)) else "cudnn"


def sparse_settings(opts: InfiniteTalkConfig) -> SparseSettings | None:
    """The frame-window self-attention of the options (`sparse_window`; None = dense, the default)."""
    if opts.sparse_window is None:
        return None
    return SparseSettings(
        window=opts.sparse_window, group=opts.sparse_group, dense_steps=opts.sparse_dense_steps
    )


@dataclass(frozen=True)
class VaeTiling:
    """When the VAE works on overlapping spatial tiles (`infinitetalk.vae_tiling`, `vae_tile_px`)."""

    mode: str | bool = "auto"  # auto | True | False
    tile_px: int = 256

    def spec_for(
        self, height: int, width: int, *, device_type: str, free_bytes: int | None, dtype: torch.dtype
    ) -> TileSpec | None:
        """Tiling of one (height x width)-pixel encode/decode; None = untiled. auto: tiles only on CUDA
        when `free_bytes` is short of an untiled pass (`model.runtime.offload.vae_tiling_for`)."""

        if self.mode is True:
            return TileSpec(tile=self.tile_px, stride=self.tile_px - self.tile_px // 4)
        if self.mode is False or device_type != "cuda" or free_bytes is None:
            return None
        return vae_tiling_for(height, width, free_bytes, dtype=dtype)


class TiledVAE:
    """The VAE as the sampler calls it (encode / decode), with the tiling of `VaeTiling` chosen per call
    from the free device memory at that moment; logs whenever the choice changes."""

    def __init__(self, vae: Any, tiling: VaeTiling, logger: logging.Logger | logging.LoggerAdapter):

        self.vae, self.tiling, self.log = vae, tiling, logger
        self.last: TileSpec | None = None
        self.memo = ZeroTailMemo()  # the reference-free part of the conditioning encode, for this shot

    def _spec(self, op: str, height: int, width: int) -> TileSpec | None:
        device = self.vae.device
        free = None
        if self.tiling.mode == "auto" and device.type == "cuda":
            free = free_device_memory(device)
        spec = self.tiling.spec_for(
            height, width, device_type=device.type, free_bytes=free, dtype=self.vae.dtype
        )
        if spec != self.last:
            if spec is None:
                self.log.info("VAE %s at %dx%d: untiled again", op, width, height)
            else:
                why = "vae_tiling: true" if free is None else f"{free / 2**30:.1f} GiB free on {device}"
                self.log.info(
                    "VAE %s at %dx%d in %d px tiles every %d px (%s)", op, width, height, spec.tile,
                    spec.stride, why,
                )  # fmt: skip
            self.last = spec
        return spec

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(video, tiling=self._spec("encode", *video.shape[-2:]))  # (B, 3, T, H, W)

    def encode_reference(self, reference: torch.Tensor, length: int) -> torch.Tensor:
        """`model.network.vae.WanVAE.encode_reference` (B, 3, 1, H, W) -> the latent of [reference, zeros...]."""
        tiling = self._spec("encode", *reference.shape[-2:])
        if not hasattr(self.vae, "encode_reference"):  # another codec (a test's): the plain encode
            import torch

            b, c, _, h, w = reference.shape
            pixels = torch.cat([reference, reference.new_zeros(b, c, length - 1, h, w)], dim=2)
            return self.vae.encode(pixels, tiling=tiling)
        return self.vae.encode_reference(reference, length, self.memo, tiling=tiling)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        h, w = (8 * n for n in latent.shape[-2:])  # (B, 16, L, h, w) -> pixels
        return self.vae.decode(latent, tiling=self._spec("decode", h, w))
