"""The backend's options and what follows from them before any model runs: the `infinitetalk` section
with `backend.options` applied and cross-checked, the region config, the run device, the offload
decision, the `model.loading.LoadSpec`, and the VAE tiling option with the VAE wrapper that applies it.

Pure decisions over the config (and, for `offload: auto` / `vae_tiling: auto`, the device's memory);
nothing here loads weights, reads media or keeps state between calls.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks.config import InfiniteTalkConfig, PipelineConfig
from tasks.errors import ConfigError
from tasks.infinitetalk.timeline import WAV2VEC_RATE
from tasks.infinitetalk.tiny import tiny_hw
from tasks.region import RegionConfig

if TYPE_CHECKING:
    import torch

    from model.loading import LoadSpec
    from model.offload import OffloadDecision
    from model.tiling import TileSpec


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
    data["infinitetalk"] = {**data["infinitetalk"], **dict(overrides or {})}
    opts = PipelineConfig.from_dict(data, source="backend.options").infinitetalk
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
    return opts


def region_config(cfg: PipelineConfig) -> RegionConfig:
    """`tasks.region.RegionConfig` from the pipeline config (the bucket table follows frames.bucket)."""
    r = cfg.region
    return RegionConfig(
        mode=r.mode,
        size=f"infinitetalk-{cfg.frames.bucket}",
        motion=r.motion,
        feather_px=r.feather_px,
        expand_w=r.expand_w,
        expand_h=r.expand_h,
    )


def resolve_device(name: str) -> str:
    """The run device of `infinitetalk.device` (auto: CUDA when there is one; a CUDA name needs CUDA)."""
    import torch  # noqa: PLC0415

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("infinitetalk.device", f"{name}: no CUDA device is available")
    return name


def offload_decision(
    opts: InfiniteTalkConfig, device: str, *, frame_num: int = 81, limit_bytes: int | None = None
) -> OffloadDecision:
    """`infinitetalk.offload` for a run on `device`. auto: offload when the device's usable memory
    (`limit_bytes`; default: asked from CUDA) is below what a resident run of the mode needs at its
    largest bucket and `frame_num`-frame chunks with its compile / fp8 / batched-guidance settings
    (`model.offload.resident_need`); never on a CPU."""
    import torch  # noqa: PLC0415

    from model.config import DIT_PRESETS  # noqa: PLC0415
    from model.offload import (  # noqa: PLC0415
        OTHER_MODELS_BYTES,
        T5_BYTES,
        decide_offload,
        device_memory_limit,
        dit_weight_bytes,
        resident_need,
        working_bytes_per_token,
    )
    from tasks.frames import BUCKET_TABLES  # noqa: PLC0415

    device_type = torch.device(device).type
    if opts.offload != "auto" or device_type != "cuda":
        return decide_offload(opts.offload, device_type=device_type, limit_bytes=None, need_bytes=0)
    tiny = opts.mode == "tiny"
    table = BUCKET_TABLES["480" if tiny else opts.mode.removeprefix("infinitetalk-")]
    h, w = max(table.values(), key=lambda hw: hw[0] * hw[1])
    h, w = tiny_hw((h, w)) if tiny else (h, w)
    tokens = (1 + (frame_num - 1) // 4) * (h // 16) * (w // 16)  # latent frames x 2x2 patches of h/8 x w/8
    fp8 = opts.fp8_compute and not tiny
    dtype = torch.float32 if tiny else getattr(torch, opts.dtype)
    config = DIT_PRESETS["tiny" if tiny else "infinitetalk-14b"]
    dit = dit_weight_bytes(config, dtype, fp8_blocks=fp8, quantized=opts.quant != "none")
    other = 0 if tiny else OTHER_MODELS_BYTES + (0 if opts.t5_cpu else T5_BYTES)
    compiled = opts.compile is not False  # auto compiles on CUDA
    per_token = working_bytes_per_token(fp8_blocks=fp8, compiled=compiled, batched=opts.batch_branches)
    need = resident_need(dit, tokens, per_token=per_token, other_bytes=other)
    limit = device_memory_limit(device) if limit_bytes is None else limit_bytes
    return decide_offload("auto", device_type=device_type, limit_bytes=limit, need_bytes=need)


def load_spec(opts: InfiniteTalkConfig, device: str, *, frame_num: int = 81) -> LoadSpec:
    """The `model.loading.LoadSpec` of the options (tiny mode and CPU runs: float32), with the offload
    decision of `offload_decision` (its reason rides along and is logged by the loader)."""
    import torch  # noqa: PLC0415

    from model.loading import LoadSpec  # noqa: PLC0415

    layout = "infinitetalk-480" if opts.mode == "tiny" else opts.mode
    loras = tuple((str(lora["path"]), float(lora.get("scale", 1.0))) for lora in opts.loras)
    off = offload_decision(opts, device, frame_num=frame_num)
    if opts.mode == "tiny" or device == "cpu":
        f32 = torch.float32
        return LoadSpec(
            mode=layout, device=device, dtype=f32, vae_dtype=f32, t5_dtype=f32, clip_dtype=f32,
            audio_dtype=f32, t5_cpu=True, quant=opts.quant, loras=loras, offload=off.offload,
            offload_reason=off.reason,
        )  # fmt: skip
    dtype = getattr(torch, opts.dtype)
    compile_dit = device.startswith("cuda") if opts.compile is None else opts.compile
    return LoadSpec(
        mode=layout, device=device, dtype=dtype, t5_cpu=opts.t5_cpu, quant=opts.quant, loras=loras,
        fp8_compute=opts.fp8_compute, fp8_attention=opts.fp8_attention, compile=compile_dit,
        offload=off.offload, offload_reason=off.reason,
    )  # fmt: skip


@dataclass(frozen=True)
class VaeTiling:
    """When the VAE works on overlapping spatial tiles (`infinitetalk.vae_tiling`, `vae_tile_px`)."""

    mode: str | bool = "auto"  # auto | True | False
    tile_px: int = 256

    def spec_for(
        self, height: int, width: int, *, device_type: str, free_bytes: int | None, dtype: torch.dtype
    ) -> TileSpec | None:
        """Tiling of one (height x width)-pixel encode/decode; None = untiled. auto: tiles only on CUDA
        when `free_bytes` is short of an untiled pass (`model.offload.vae_tiling_for`)."""
        from model.offload import vae_tiling_for  # noqa: PLC0415
        from model.tiling import TileSpec  # noqa: PLC0415

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

    def _spec(self, op: str, height: int, width: int) -> TileSpec | None:
        device = self.vae.device
        free = None
        if self.tiling.mode == "auto" and device.type == "cuda":
            from model.offload import free_device_memory  # noqa: PLC0415

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

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        h, w = (8 * n for n in latent.shape[-2:])  # (B, 16, L, h, w) -> pixels
        return self.vae.decode(latent, tiling=self._spec("decode", h, w))
