"""The InfiniteTalk backend's own settings: the typed `infinitetalk:` and `presets:` sections and how
`backend.options` combine with them.

The YAML sections stay where users write them (`configs/default.yaml` holds every default); the ground
config keeps them as plain mappings (`PipelineConfig.sections`) and this backend types them when it resolves
its options (`tasks.infinitetalk.options.resolve_options`). `effective_options` is the backend's hook in the
registry (`tasks.backends`): the one place that says `backend.options` win over the `infinitetalk` section,
for shot keys, the plan file and the CLI alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tasks.backends import backend_option
from tasks.config.schema import build_section
from tasks.errors import ConfigError

SECTION = "infinitetalk"  # the YAML section of this backend's options
PRESETS = "presets"  # the values `infinitetalk.preset` fills in
# Options that never change a shot's pixels, left out of its key: sequence parallelism and block offload give
# bit-identical outputs, profiling only adds device syncs, the load's warm-up throws its synthetic chunks away.
NON_PIXEL = ("gpus_per_shot", "profile", "offload", "warm_up")
# The shot plan's per-shot fields this backend owns (`tasks.decision.plan_file` asks `tasks.backends.plan_fields`):
# field -> (what it means, written as the plan's legend; the YAML types it takes). `plan_options` maps them.
PLAN_FIELDS: Mapping[str, tuple[str, tuple[type, ...]]] = {
    "prompt": ("text prompt for this shot", (str,)),
    "seed": ("this shot's sampler seed (automatic: the run's seed + shot index)", (int,)),
    "denoise_strength": ("(0, 1]: < 1 starts from the source noised part-way", (int, float)),
    "steps": ("sampling steps", (int,)),
}


@dataclass(frozen=True)
class InfiniteTalkConfig:
    """The InfiniteTalk backend: weights, precision, sampling (`backend.options` may override any key)."""

    weights: str | None  # weights root in the official layout; None = tiny random weights (pipeline check)
    mode: Literal["tiny", "infinitetalk-480", "infinitetalk-720"]
    device: str  # auto | cpu | cuda | cuda:N
    gpus_per_shot: int  # >= 1: N-way sequence parallelism over N resident ranks (GPUs 0..N-1 visible)
    dtype: Literal["bfloat16", "float16", "float32"]
    quant: Literal[
        "none", "fp8", "int8", "gguf-Q8_0", "gguf-Q6_K", "gguf-Q5_K", "gguf-Q5_K_M", "gguf-Q5_K_S",
        "gguf-Q4_K", "gguf-Q4_K_M", "gguf-Q4_K_S", "gguf-F16", "gguf-BF16",
    ]  # fmt: skip  # gguf-<tag>: a GGUF DiT (model.weights.layout.GGUF_QUANTS)
    loras: tuple[dict, ...]  # ({path, scale}, ...) merged in order
    t5_cpu: bool
    prompt: str
    negative_prompt: str
    preset: Literal[
        "quality", "fast"
    ]  # fills the keys below left None (`presets`; tasks.infinitetalk.options)
    steps: int | None  # None: the preset's (quality: the mode's)
    shift: float | None
    text_guide_scale: float | None  # None only before the preset is applied
    audio_guide_scale: float | None
    use_apg: bool
    apg_momentum: float
    apg_norm_threshold: float
    teacache: float | None  # TeaCache threshold; None = off
    denoise_strength: float
    seed: int
    batch_branches: bool
    profile: bool  # synchronise the device around each stage so timings split DiT / VAE / encoders
    compile: bool | None  # torch.compile the DiT blocks; None = auto (on CUDA only)
    warm_up: bool | None  # the load's warm-up at the planned model sizes; None = auto (where compiled)
    fp8_compute: (
        Literal["auto", True, False] | None
    )  # DiT linears as fp8 GEMMs (Hopper); auto = where supported
    fp8_attention: Literal["auto", True, False] | None  # self-attention as fp8 attention (Hopper)
    attention_kernel: Literal["auto", "cudnn", "fa3"]  # the fp8 attention kernel; auto = fa3 where installed
    # lossy opt-ins, off by default (docs/speed.md): frame-window self-attention and a step subset
    sparse_window: int | None  # latent frames each side of a query group (+ frame 0 as a sink); None = dense
    sparse_group: int  # query latent frames per group
    sparse_dense_steps: int  # the first sampling steps of each chunk stay dense
    step_subset: tuple[int, ...] | None  # run only these steps (indices) of the preset's schedule; None = all
    vae_dtype: Literal["float32", "bfloat16"] | None  # VAE precision on a GPU (CPU runs: float32)
    offload: Literal["auto", True, False]  # DiT blocks streamed from host memory; auto = GPU too small
    vae_tiling: Literal["auto", True, False]  # spatial VAE tiles; auto = when free GPU memory is short
    vae_tile_px: int  # tile side with vae_tiling: true (tiles overlap by a quarter)
    distilled: bool  # the root's DiT is already step-distilled (merged): the fast preset needs no LoRA


@dataclass(frozen=True)
class PresetsConfig:
    """The values `infinitetalk.preset` fills in (each a mapping of `infinitetalk` keys)."""

    quality: dict[str, Any]
    fast: dict[str, Any]


def section_config(config: Any) -> InfiniteTalkConfig:
    """The `infinitetalk:` section of a `PipelineConfig` as written (no `backend.options`, no preset
    applied: `tasks.infinitetalk.options.resolve_options` does both)."""
    return InfiniteTalkConfig(**config.sections[SECTION])


def typed_sections(sections: dict[str, Any], where: str) -> dict[str, Any]:
    """This backend's sections of `PipelineConfig.sections` type-checked (ConfigError naming `where` and the
    key: an unknown, missing or ill-typed key) and returned as the typed values' plain mappings (YAML's
    `1` for a float field becomes `1.0`), as every config is built."""
    out = dict(sections)
    for name, cls in ((SECTION, InfiniteTalkConfig), (PRESETS, PresetsConfig)):
        if name in out:
            out[name] = dataclasses.asdict(build_section(cls, out[name], where, f"{name}."))
    if SECTION in out and out[SECTION]["gpus_per_shot"] < 1:
        raise ConfigError(
            where, f"{SECTION}.gpus_per_shot: must be >= 1, got {out[SECTION]['gpus_per_shot']}"
        )
    return out


def effective_options(config: dict[str, Any], *, for_key: bool = False) -> dict[str, Any]:
    """`config` (a plain config dict, changed in place and returned) with `backend.options` applied over the
    `infinitetalk` section and cleared. `for_key`: what a shot key records: the weights path left out
    (`weights_identity` stands for the files), `distilled` only when set (keys from before it stay valid),
    LoRA paths as file identities (name, size, mtime)."""
    backend = config.get("backend", {})
    if SECTION not in config:
        return config
    section = {**config[SECTION], **backend.get("options", {})}
    backend["options"] = {}
    if for_key:
        section.pop("weights", None)
        for key in NON_PIXEL:
            section.pop(key, None)
        if not section.get("distilled"):
            section.pop("distilled", None)
        _drop_speed_defaults(section)
        section["loras"] = [
            [_file_identity(Path(str(lo.get("path")))), lo.get("scale", 1.0)]
            for lo in section.get("loras", ())
        ]
    config[SECTION] = section
    return config


def plan_auto(config: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The plan's automatic values for shot `index` under the plain config dict `config`: its seed (the
    run's seed + the index, as the sampler uses it)."""
    return {"seed": int(backend_option(config, "seed", 0) or 0) + index}


def plan_options(index: int, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The `backend.options` a shot's plan fields set (those of `PLAN_FIELDS` present in `fields`, a checked
    override of shot `index`): its seed less the index (the sampler adds the index), the strength a float."""
    out = {name: fields[name] for name in PLAN_FIELDS if fields.get(name) is not None}
    if "seed" in out:
        out["seed"] = out["seed"] - index
    if "denoise_strength" in out:
        out["denoise_strength"] = float(out["denoise_strength"])
    return out


def run_notes(sections: dict[str, Any]) -> list[str]:
    """What a run's report must say about these settings: a run without weights is the tiny random model."""
    if (sections.get(SECTION) or {}).get("weights") is None:
        from tasks.infinitetalk.tiny import TINY_BANNER, TINY_LABEL  # numpy only: no model code

        return [f"{TINY_LABEL}: {TINY_BANNER}"]
    return []


def _drop_speed_defaults(section: dict[str, Any]) -> None:
    """Leave the speed keys out of a shot key at their defaults (keys made before them stay valid):
    `attention_kernel` auto, and the lossy opt-ins when off (`sparse_window` null drops its group and
    dense-step keys too)."""
    if section.get("attention_kernel") == "auto":
        section.pop("attention_kernel", None)
    if section.get("sparse_window") is None:
        for key in ("sparse_window", "sparse_group", "sparse_dense_steps"):
            section.pop(key, None)
    if section.get("step_subset") is None:
        section.pop("step_subset", None)


def _file_identity(path: Path) -> str:
    if not path.is_file():
        return f"absent:{path.name}"
    st = path.stat()
    return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"
