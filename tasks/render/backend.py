"""The interface a dubbing model plugs into, its registry, and the `passthrough` dry-run backend.

A backend is streaming per shot: `open_shot` gets the shot's plan, geometry and audio (and a
state to resume from); the returned session's `dub_chunk` is called once per planned chunk in
order, with the chunk's source frames, its sliding reference frame and its audio window, and
returns the output frames for exactly the chunk's source-frame range (`src_start..src_end`, at
the source rate and coded size: the InfiniteTalk backend generates 25 fps frames in the model
bucket and maps them back with `ShotPlan.conform_indices` and `ModelGeometry.from_model`). After
each chunk `state()` may return something picklable (e.g. motion latents) that the renderer
checkpoints, so a restarted shot resumes at the next chunk.

Backends are looked up by name in the ground registry `tasks.backends.BACKENDS` ("module:attribute"
strings, imported lazily so asking for `passthrough` never imports the model). A factory that takes a
`config` keyword also gets the whole `PipelineConfig`.

Hooks a backend class may carry, asked through the registry so generic code names no backend:
`effective_options(config, for_key=)` (its own sections with `backend.options` applied:
`tasks.backends.effective_options`),
`check_options(config)` (`check_backend_options`), `weights_identity(config, multi=)` (what a shot key
records of its weights, `backend_weights_identity`), `price(config, fallbacks=)` and
`shot_price(price, plan, regions)` (GPU seconds, `backend_price`, `backend_shot_price`),
`model_size(config, decision, geometry, num_frames)` (the size a planned decision generates at, kept in
the planning's record: `backend_model_size`) and, on an instance, `warm_up_planned(shots)` (the group's
model load with its warm-up at its shots' planned sizes before the first shot: `backend_warm_up`; a
hook that takes `film` also gets the film's `FilmInputs`, to make its per-film caches there).

Optional gating (`GatingBackend`): a backend with `prepare_shot` decides per shot, before any chunk,
whether the shot is dubbed at all (`ShotDecision`: speech in the dub slice, a face, policy); the
renderer persists that decision with the chunk checkpoints, copies skipped shots through untouched
and hands the decision and the film-level `ShotContext` (run workspace, dialogue track) to
`open_shot`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tasks.backends import backend_factory
from tasks.config.pipeline import PipelineConfig
from tasks.decision.record import ShotDecision
from tasks.errors import ConfigError
from tasks.media.audio import DialogueTrack
from tasks.media.probe import VideoInfo
from tasks.picture.geometry import ModelGeometry
from tasks.render.cost import ChunkPrice, shot_gpu_s
from tasks.timeline.plan import ChunkPlan, ShotPlan
from tasks.timeline.shot_key import shot_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChunkInput:
    """What a backend gets for one chunk (frames are uint8 RGB in the source's coded size)."""

    chunk: ChunkPlan
    frames: np.ndarray  # (T, H, W, 3) source frames src_start..src_end of the shot (T may be 0)
    reference: np.ndarray  # (H, W, 3) the chunk's reference frame (sliding, or the shot's first frame)
    audio: np.ndarray  # (S, C) float32 dialogue for the chunk's model window, zero-padded past the shot
    sample_rate: int


@runtime_checkable
class ShotSession(Protocol):
    """One shot being dubbed, chunk by chunk."""

    def dub_chunk(self, inp: ChunkInput) -> np.ndarray:
        """Return (T, H, W, 3) uint8 frames for the chunk's source range (same T, H, W as inp.frames)."""
        ...

    def state(self) -> Any | None:
        """State after the last chunk: tensors and JSON values only (tasks.render.checkpoint_state); None: none."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """A dubbing backend."""

    name: str
    applies_color: bool  # True if the backend colour-corrects its own output (the renderer then does not)

    def open_shot(
        self,
        plan: ShotPlan,
        geometry: ModelGeometry,
        shot_audio: np.ndarray,
        sample_rate: int,
        *,
        resume_state: Any | None = None,
    ) -> ShotSession: ...


class _PassthroughSession:
    def __init__(self, geometry: ModelGeometry, via_model: bool):
        self._geometry = geometry
        self._via_model = via_model

    def dub_chunk(self, inp: ChunkInput) -> np.ndarray:
        if not self._via_model:
            return inp.frames
        out = [self._geometry.from_model(self._geometry.to_model(f), f) for f in inp.frames]
        return np.stack(out) if out else inp.frames

    def state(self) -> None:
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ShotContext:
    """Film-level facts for backends that gate shots or keep per-film caches (records and paths only)."""

    work_dir: Path  # the run's work dir: per-film caches under work_dir/film, QC under work_dir/qc
    video: VideoInfo
    dialogue: DialogueTrack
    audio_range: tuple[int, int]  # the shot's samples in the dialogue track
    config: PipelineConfig
    stems: dict[str, Path] = field(
        default_factory=dict
    )  # character name -> checked dub stem (wav) in the workspace


@runtime_checkable
class GatingBackend(Backend, Protocol):
    """A backend that decides per shot whether to dub it (see the module docstring)."""

    def prepare_shot(
        self,
        plan: ShotPlan,
        geometry: ModelGeometry,
        shot_audio: np.ndarray,
        sample_rate: int,
        context: ShotContext,
    ) -> ShotDecision: ...

    def open_shot(
        self,
        plan: ShotPlan,
        geometry: ModelGeometry,
        shot_audio: np.ndarray,
        sample_rate: int,
        *,
        resume_state: Any | None = None,
        decision: ShotDecision | None = None,
        context: ShotContext | None = None,
    ) -> ShotSession: ...


class PassthroughBackend:
    """Dry run: returns the source frames through the same chunk/reference/assemble path.

    Nothing is dubbed. Options:
    * `color` (default false): also run the renderer's colour correction on the copied frames.
      Colour matching exists to pull *generated* frames back to the reference; applied to
      untouched source frames it only shifts them (a zoom changes a frame's Lab statistics), so
      the default dry run is an identity up to the final encode.
    * `via_model` (default false): round-trip every frame through the model geometry (rotation,
      square pixels, bucket crop) and back, to exercise that path.
    """

    name = "passthrough"
    dubs = False  # shot results say "not dubbed" (a dry run)

    def __init__(self, options: dict[str, Any]):
        unknown = set(options) - {"via_model", "color"}
        if unknown:
            raise ConfigError("backend.options", f"unknown passthrough option {sorted(unknown)[0]}")
        self.via_model = bool(options.get("via_model", False))
        # "applies_color" True means the renderer leaves colour alone
        self.applies_color = not bool(options.get("color", False))

    def open_shot(
        self,
        plan: ShotPlan,
        geometry: ModelGeometry,
        shot_audio: np.ndarray,
        sample_rate: int,
        *,
        resume_state: Any | None = None,
    ) -> ShotSession:
        log.warning(
            "DRY RUN (passthrough backend): shot %04d is copied from the source, NOT dubbed", plan.shot_index
        )
        return _PassthroughSession(geometry, self.via_model)


def get_backend(
    name: str, options: dict[str, Any] | None = None, *, config: PipelineConfig | None = None
) -> Backend:
    """Instantiate the backend registered under `name` with its options dict (and `config`, if it takes one)."""
    factory = backend_factory(name)
    if config is not None and "config" in inspect.signature(factory).parameters:
        return factory(dict(options or {}), config=config)
    return factory(dict(options or {}))


def backend_weights_identity(config: Mapping[str, Any], *, multi: bool = False) -> str:
    """What a shot key records of the weights `config` (a plain config dict) renders with: the backend's
    `weights_identity` hook (``multi``: the shot can run two speakers), else the backend's name."""
    name = config["backend"]["name"]
    hook = getattr(backend_factory(name), "weights_identity", None)
    return hook(config, multi=multi) if hook is not None else f"backend:{name}"


def backend_price(config: PipelineConfig, *, fallbacks: bool = False) -> ChunkPrice | None:
    """One full chunk's price under `config` (the backend's `price` hook; `fallbacks`: null figures
    replaced by their `cost.fallback_*` stand-ins); None for a backend that prices no GPU work."""
    hook = getattr(backend_factory(config.backend.name), "price", None)
    return hook(config, fallbacks=fallbacks) if hook is not None else None


def backend_shot_price(
    name: str, price: ChunkPrice, plan: ShotPlan, regions: Sequence[Mapping[str, Any]] = ()
) -> float:
    """GPU seconds of a dubbed shot (its dubbed `regions` as in the shot table): the backend's
    `shot_price` hook, else its chunks at `price`."""
    hook = getattr(backend_factory(name), "shot_price", None)
    return hook(price, plan, regions) if hook is not None else shot_gpu_s(plan, price.chunk_s)


def check_backend_options(config: PipelineConfig) -> None:
    """Check `config`'s backend options without loading a model: the backend's `check_options`, if it
    has one (ConfigError naming the key)."""
    check = getattr(backend_factory(config.backend.name), "check_options", None)
    if check is not None:
        check(config)


@dataclass(frozen=True)
class PlannedShot:
    """A shot a group will render, as the planning left it: its effective config, its plan and the model
    size (H, W) its dub decision generates at (None: not dubbed, or a size no warm-up covers)."""

    config: PipelineConfig
    plan: ShotPlan
    model_hw: tuple[int, int] | None


@dataclass(frozen=True)
class FilmInputs:
    """What a group's lead-in may prepare for the whole film (the backend's per-film caches)."""

    work_dir: Path  # the run's work dir (per-film caches under work_dir/film, as `ShotContext.work_dir`)
    dialogue: Path  # the dub track (`DialogueTrack.path`)


def planned_shot(config: Mapping[str, Any], record: Mapping[str, Any]) -> PlannedShot:
    """The `PlannedShot` of a film record (`flows.prepare.FilmPlan.records`; the global config dict `config`
    with the shot's overrides applied); a record without a planning decision has no model size."""
    decision = record.get("decision") or {}
    hw = decision.get("model_hw") if decision.get("dub") else None
    return PlannedShot(
        PipelineConfig.from_dict(shot_config(dict(config), record.get("overrides"))),
        ShotPlan.from_dict(record["plan"]),
        (int(hw[0]), int(hw[1])) if hw else None,
    )


def backend_model_size(
    config: PipelineConfig, decision: ShotDecision, video: VideoInfo, num_frames: int
) -> list[int] | None:
    """The model size [H, W] a shot of `video` with the planning's `decision` generates at under its
    `config`: the backend's `model_size` hook (None without one, or for a shot it does not generate)."""
    hook = getattr(backend_factory(config.backend.name), "model_size", None)
    if hook is None:
        return None
    hw = hook(config, decision, ModelGeometry.for_video(video, config.frames.bucket), num_frames)
    return None if hw is None else [int(hw[0]), int(hw[1])]


def backend_warm_up(
    backend: Backend, shots: Sequence[PlannedShot], film: FilmInputs | None = None
) -> dict[str, Any]:
    """The group's model load at its `shots`' planned sizes before the first shot (the backend's
    `warm_up_planned`; `film`: the film's inputs, for a hook that prepares per-film caches beside it): what
    it did and its seconds, {} when nothing was loaded or warmed."""
    hook = getattr(backend, "warm_up_planned", None)
    if hook is None:
        return {}
    return hook(shots, film=film) if "film" in inspect.signature(hook).parameters else hook(shots)
