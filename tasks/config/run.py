"""How a run goes: the backend's name and options, the workspace, early checks and timeouts, shot-group
sizing and the estimate's figures, the per-shot chunk loop, QC and fault injection (`configs/default.yaml`
holds their values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class BackendConfig:
    name: str
    options: dict[str, Any]


@dataclass(frozen=True)
class WorkspaceConfig:
    root: str
    keep: bool
    audio_context_s: float | None  # dub audio around a shot that is part of its result key (None: all)
    preview: bool  # a preview pass (`--preview`): its own workspace, labelled in the output and QC


@dataclass(frozen=True)
class ChecksConfig:
    """Early checks, locks and timeouts (`tasks.render.preflight`, `tasks.run.run_lock`); never part of the workspace key."""

    ffv1_ratio: float  # FFV1 intermediate size / raw RGB size, for the free-disk estimate
    lock_wait_s: float  # a second run of the same workspace waits this long for the first one
    unscheduled_timeout_s: float  # a child group run no worker starts within this fails the film
    api_outage_s: float  # the Prefect API may be unreachable this long before waiting on a group fails
    interrupt_grace_s: float  # after one Ctrl-C / SIGTERM: time the chunk in flight may take to finish


@dataclass(frozen=True)
class CostConfig:
    """Shot-group sizing (`flows.groups.GpuCost`): chunks are priced like `dubflow estimate`
    (`tasks.infinitetalk.cost.chunk_price`); the `fallback_*` stand-ins replace `estimate:` figures that are null."""

    max_load_share: float  # a group's model load is at most this share of its GPU time
    fallback_dit_forward_s: float
    fallback_vae_chunk_s: float
    fallback_load_s: float


@dataclass(frozen=True)
class DebugConfig:
    """Fault injection for tests and demos: shots in `fail_shots` fail half-way (once, or every time)."""

    fail_shots: tuple[int, ...]
    fail_once: bool


@dataclass(frozen=True)
class QcSettings:
    """Per dubbed shot: side-by-side preview + contact sheet in the run workspace."""

    enabled: bool
    height: int
    # the output check (tasks/perception/lip_check.py): the dubbed face's mouth shapes against the dub track's
    # content; a fit below this (or no mouth found) flags the shot for review; 0 = off
    lip_min_fit: float = 0.1


@dataclass(frozen=True)
class ShotPipelineConfig:
    """The per-shot chunk loop (`tasks.render.overlap`): decode ahead / finish behind the model on threads."""

    overlap: bool
    queue: int  # chunks decoded ahead and chunks waiting to be written, each at most
    composite_workers: int  # threads pasting a chunk's frames back (same bytes with any count); 1 = none
    film_prep: Literal["lead_in", "shot"]  # a backend's per-film caches: in a group's lead-in, or in a shot


@dataclass(frozen=True)
class EstimateConfig:
    """Benchmark figures behind `dubflow estimate` (seconds; None = not measured)."""

    reference_gpu: str  # the GPU the figures were measured on (what `dubflow estimate`'s times mean)
    dit_forward_s: dict[str, Any]  # {mode: {precision: s per DiT forward of a full chunk}}
    vae_chunk_s: dict[str, Any]  # {mode: s of VAE work per full chunk}
    load_s: dict[str, Any]  # {mode: s to load the models}
