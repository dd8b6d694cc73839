"""One shot being dubbed (`InfiniteTalkSession`, the `tasks.render.backend.ShotSession` of this backend): its
per-film inputs and models, the region mapping at the model's size, the sampler settings and chunk job,
then chunk by chunk the crop, the generation (here or on the shot worker), the conform and paste back,
and the sampler state for the renderer's per-chunk checkpoint.

State of one shot only: the models and caches it uses belong to the backend (`SessionBackend` below says
what the session needs of it), the pixel geometry to `region_map`, the generation to `chunk`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from model.sampling.conditioning import speaker_masks
from model.sampling.sampler import sampler_preset
from model.sampling.stream import StreamState
from tasks.config.pipeline import PipelineConfig
from tasks.decision.record import ShotDecision
from tasks.errors import MediaError
from tasks.infinitetalk import resident
from tasks.infinitetalk.chunk import ChunkJob, ChunkModels, generate_chunk
from tasks.infinitetalk.multi import stem_feature_files, two_speakers
from tasks.infinitetalk.options import TiledVAE, VaeTiling, resolve_device
from tasks.infinitetalk.region_map import ShotRegion, paste_frames, to_tensor, to_uint8
from tasks.infinitetalk.settings import InfiniteTalkConfig
from tasks.infinitetalk.timeline import FeatureTimeline, shot_feature_range
from tasks.infinitetalk.timing import Stopwatch, TimedDiT, TimedVAE
from tasks.infinitetalk.tiny import label_tiny, tiny_hw
from tasks.infinitetalk.warmup import warm_up
from tasks.media.frames import read_frames
from tasks.picture.color import match_and_blend
from tasks.picture.geometry import ModelGeometry
from tasks.picture.region import combine_regions
from tasks.render.backend import ChunkInput, ShotContext
from tasks.timeline.plan import ShotPlan, source_frame_at

if TYPE_CHECKING:
    import torch

STATE_FORMAT = 1


class SessionBackend(Protocol):
    """What a session needs of its backend (`backend.InfiniteTalkBackend`, bound to the shot's config)."""

    opts: InfiniteTalkConfig
    config: PipelineConfig
    tiny: bool
    log: logging.Logger | logging.LoggerAdapter
    vae_tiling: VaeTiling

    def prompt_embeddings(self, film_dir: Path, watch: Stopwatch) -> dict[str, torch.Tensor]: ...

    def audio_features_file(self, film_dir: Path, dialogue_path: Path, watch: Stopwatch) -> Path: ...

    def models(self, *components: str, multi: bool = False) -> dict[str, Any]: ...

    def load_spec(self, device: str, multi: bool = False) -> Any: ...

    def weights_root(self) -> Path: ...

    def shot_worker_config(self, multi: bool = False) -> Any: ...


def sampler_settings(opts: InfiniteTalkConfig, cfg: PipelineConfig, plan: ShotPlan, *, tiny: bool) -> Any:
    """The shot's `model.sampling.sampler.SamplerSettings`: the mode's preset (or tiny's) with the options, the
    colour config and the shot plan's chunking applied."""

    preset = "tiny" if tiny else opts.mode
    changes: dict[str, Any] = {
        "frame_num": plan.frame_num,
        "motion_frames": plan.motion_frames,
        "text_guide_scale": opts.text_guide_scale,
        "audio_guide_scale": opts.audio_guide_scale,
        "use_apg": opts.use_apg,
        "apg_momentum": opts.apg_momentum,
        "apg_norm_threshold": opts.apg_norm_threshold,
        "color_correction_strength": cfg.color.strength,
        "color_reference": "first" if cfg.color.reference == "shot_first" else "chunk",
        "denoise_strength": opts.denoise_strength,
        "seed": opts.seed + plan.shot_index,
        "batch_branches": opts.batch_branches,
    }
    if opts.steps is not None:
        changes["sampling_steps"] = opts.steps
    if opts.shift is not None:
        changes["shift"] = opts.shift
    if opts.step_subset is not None:
        changes["step_subset"] = tuple(opts.step_subset)
    return sampler_preset(preset, **changes)


class InfiniteTalkSession:
    """One shot being dubbed: the sampler state between chunks and the region mapping."""

    def __init__(
        self,
        backend: SessionBackend,
        plan: ShotPlan,
        geometry: ModelGeometry,
        decision: ShotDecision,
        context: ShotContext,
        resume_state: Any | None,
    ):
        self.backend, self.plan, self.context = backend, plan, context
        self.log = backend.log
        self.device = resolve_device(backend.opts.device)
        self.watch = Stopwatch(self.device, backend.opts.profile)
        film_dir = context.work_dir / "film"
        self.two = two_speakers(decision)  # two speakers at once (tasks.infinitetalk.multi), or None

        # 1. per-film inputs (cached files), then the generation models and the shot's audio features
        prompt = backend.prompt_embeddings(film_dir, self.watch)
        features_path = backend.audio_features_file(film_dir, Path(context.dialogue.path), self.watch)
        stem_paths = (
            [] if self.two is None else stem_feature_files(backend, film_dir, context, self.two, self.watch)
        )
        dcfg, host = self._load_models()
        if prompt["context"].shape[-1] != dcfg.text_dim:
            raise MediaError(
                film_dir,
                f"prompt embedding width {prompt['context'].shape[-1]} != DiT text_dim {dcfg.text_dim}",
            )
        feats = self._shot_features(features_path, dcfg)  # (L, 12, 768)

        # 2. where the model looks: the region plan's box (or the full frame) at the model's size
        model_hw = self._map_region(geometry, decision)

        # 3. sampler settings (chunking = the shot plan's) and conditioning, then where to resume
        self.settings = sampler_settings(backend.opts, backend.config, plan, tiny=backend.tiny)
        if self.chunk_models is not None:  # a size the group's load did not warm: here, apart from the shot
            seconds = warm_up(backend, model_hw, self.settings, multi=self.two is not None)
            if seconds is not None:
                self.watch.totals["warm_up"] += seconds
        self.job = self._chunk_job(prompt, feats, dcfg, model_hw, host)
        if self.two is not None:  # multi: both stems' features and the person masks in the model crop
            masks = self.two.masks(self.region.plan, geometry.display_hw, model_hw)
            stems = [self._shot_features(p, dcfg) for p in stem_paths]  # [(L, 12, 768)] x 2
            self.job = dataclasses.replace(self.job, audio=stems, masks=masks)
        self._part = -1  # the part of a split plan that `job` / `stream_state` run (see _enter_part)
        self._source_cache: dict[int, np.ndarray] = {}
        workers = backend.config.pipeline.composite_workers
        self._paste_pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="paste") if workers > 1 else None
        )  # the chunks' paste back (`region_map.paste_frames`); closed with the session
        self.stream_state = self._resume(resume_state)
        mh, mw = model_hw
        self.log.info(
            "shot %04d: %d chunk(s) at %dx%d, %d steps, feature offset %d%s%s",
            plan.shot_index, len(plan.chunks), mw, mh, self.settings.sampling_steps, self.feature_offset,
            "" if self.two is None else ", two speakers (multi checkpoint)",
            "" if self.stream_state is None else f", resuming at chunk {self.stream_state.next_chunk + 1}",
        )  # fmt: skip

    # --- the steps of __init__

    def _load_models(self) -> tuple[Any, str]:
        """The generation models, in this process or (gpus_per_shot > 1) on the shot worker's ranks:
        returns the DiT config and the device the conditioning tensors are kept on."""
        backend = self.backend
        self.sp_size = backend.opts.gpus_per_shot
        with self.watch("load"):
            if self.sp_size > 1:  # the ranks hold the generation models; this process keeps none
                dcfg = backend.shot_worker_config(multi=self.two is not None)
                self.chunk_models = None
                return dcfg, "cpu"
            m = backend.models("dit", "vae", "clip", multi=self.two is not None)
            self.dit, self.vae, self.clip = m["dit"], m["vae"], m["clip"]
            dcfg = self.dit.config
            self.chunk_models = ChunkModels(
                TimedDiT(self.dit, self.watch),
                TimedVAE(TiledVAE(self.vae, backend.vae_tiling, self.log), self.watch),
                self._clip,
                self._color,
                self.device,
            )
            return dcfg, self.device

    def _shot_features(self, features_path: Path, dcfg: Any) -> torch.Tensor:
        """The shot's slice (L, 12, 768) of the film's audio features; sets `feature_offset`."""
        from safetensors import safe_open

        with safe_open(str(features_path), framework="pt") as f:
            timeline = FeatureTimeline.from_metadata(f.metadata())
            offset, stop = shot_feature_range(self.plan, timeline)
            feats = f.get_slice("features")[offset:stop]  # (L, 12, 768)
        if tuple(feats.shape[1:]) != (dcfg.audio_blocks, dcfg.audio_channels):
            raise MediaError(
                features_path, f"features {tuple(feats.shape)} do not fit the DiT's audio adapter"
            )
        self.feature_offset = offset
        return feats

    def _map_region(self, geometry: ModelGeometry, decision: ShotDecision) -> tuple[int, int]:
        """Sets the shot's `ShotRegion` (the gate's speaker regions, or the full frame); returns the model size."""
        parts = [(r.start_frame, r.end_frame, r.plan) for r in decision.regions]
        blend = self.backend.config.region.switch_blend_frames
        rplan, weights = combine_regions(parts, self.plan.num_frames, blend) if parts else (None, None)
        if rplan is not None and rplan.mode == "full":
            bucket = geometry.model_hw
        else:
            bucket = rplan.bucket if rplan is not None else geometry.model_hw
        model_hw = tiny_hw(bucket) if self.backend.tiny else bucket
        self.region = ShotRegion(geometry, rplan, model_hw, self.backend.config.region.feather_px, weights)
        self.coded_hw = geometry.coded_hw
        return model_hw

    def _chunk_job(
        self,
        prompt: dict[str, torch.Tensor],
        feats: torch.Tensor,
        dcfg: Any,
        model_hw: tuple[int, int],
        host: str,
    ) -> ChunkJob:
        """The shot's chunk job; its per-chunk fields (reference, source, state) are filled by dub_chunk."""
        import torch

        opts = self.backend.opts
        mh, mw = model_hw
        text_len = dcfg.text_len
        return ChunkJob(
            settings=self.settings,
            context=prompt["context"][:text_len].to(host),
            context_null=prompt["context_null"][:text_len].to(host),
            audio=feats,
            masks=speaker_masks(None, 1, model_hw, model_hw, (mh // 8, mw // 8)),  # one speaker: all ones
            n_frames=self.plan.model_frames,
            reference=torch.empty(0),
            source=None,
            state=None,
            teacache=opts.teacache,
            teacache_preset="infinitetalk-720" if opts.mode == "infinitetalk-720" else "infinitetalk-480",
        )

    def _resume(self, resume_state: Any | None) -> Any | None:
        """The `model.sampling.stream.StreamState` to continue from (a checkpoint of `state()`); None = chunk 0."""

        if resume_state is None:
            return None
        if resume_state.get("format") != STATE_FORMAT:
            raise MediaError(
                self.context.video.path, f"shot {self.plan.shot_index}: unknown checkpoint format"
            )
        return StreamState.from_state_dict(resume_state["stream"])

    # --- sampler callbacks

    def _clip(self, reference: torch.Tensor) -> torch.Tensor:
        with self.watch("clip"):
            return self.clip.encode(reference)  # (1, 257, 1280)

    def _color(self, video: torch.Tensor, reference: torch.Tensor, strength: float) -> torch.Tensor:

        with self.watch("colour"):
            return match_and_blend(video, reference, strength)

    def _crop(self, frame: np.ndarray, j: int) -> np.ndarray:
        with self.watch("crop"):
            return self.region.to_model(frame, j)

    def _source_video(self, start: int, stop: int) -> torch.Tensor:
        """Model frames [start, stop) of the source (video-to-video): (3, T, H, W) in [-1, 1]."""
        n = self.plan.num_frames
        js = [min(n - 1, source_frame_at(k, self.plan.fps, self.plan.model_fps)) for k in range(start, stop)]
        missing = sorted({j for j in js if j not in self._source_cache})
        if missing:  # frames of an earlier chunk (after a resume): decode them again
            s0 = self.plan.start_frame
            got = read_frames(self.context.video, [s0 + j for j in missing])
            for j in missing:
                self._source_cache[j] = self._crop(got[s0 + j], j)
        return to_tensor(np.stack([self._source_cache[j] for j in js]))

    # --- ShotSession

    def dub_chunk(self, inp: ChunkInput) -> np.ndarray:
        return self.dub_chunk_deferred(inp)()

    def dub_chunk_deferred(self, inp: ChunkInput) -> Callable[[], np.ndarray]:
        """Generate the chunk now (the model work, in order); return the function that pastes its frames
        into the source frames (CPU work, reads nothing that later chunks change: `tasks.render.overlap` runs it
        on the writer thread while the next chunk generates)."""

        c = inp.chunk
        self._enter_part(c)
        expected = 0 if self.stream_state is None else self.stream_state.next_chunk
        if c.index_in_part != expected:
            raise RuntimeError(
                f"shot {self.plan.shot_index}: chunk {c.index} given, the sampler is at {expected}"
            )
        self.log.info(
            "shot %04d: generating chunk %d/%d", self.plan.shot_index, c.index + 1, len(self.plan.chunks)
        )
        reference = to_tensor(self._crop(inp.reference, c.ref_frame)[None])  # (3, 1, H, W)
        if self.settings.start_step > 0:
            keep = min(c.ref_frame, c.src_start)
            self._source_cache = {
                j: f for j, f in self._source_cache.items() if j >= keep - self.plan.frame_num
            }
            for t, frame in enumerate(inp.frames):
                self._source_cache[c.src_start + t] = self._crop(frame, c.src_start + t)
            source = self._source_video(c.model_start, c.model_start + c.num_frames)  # (3, T, H, W)
        else:
            source = None
        job = dataclasses.replace(self.job, reference=reference, source=source, state=self.stream_state)
        if self.chunk_models is not None:
            out = generate_chunk(self.chunk_models, job)
            index, state = out.spec.index, out.state
            kept = to_uint8(out.frames)  # (n_kept, H, W, 3): model frames [new_start, new_end)
        else:  # on the ShotWorker's ranks; only rank 0's frames and state come back
            with self.watch("sp_chunk"):
                got = resident.RESIDENT.run_chunk(job)
            index, state, kept = got["index"], StreamState.from_state_dict(got["state"]), got["frames"]
        if index != c.index_in_part:
            raise RuntimeError(f"shot {self.plan.shot_index}: sampler ran chunk {index}, expected {c.index}")
        self.stream_state = state
        first_kept = c.new_start - c.model_start
        region, tiny, pool = self.region, self.backend.tiny, self._paste_pool
        indices = [k - first_kept for k in self.plan.conform_indices(c)]

        def label(frame: np.ndarray, j: int) -> np.ndarray:
            return label_tiny(frame, region.coded_box(j)) if region.dubbed(j) else frame

        def composite() -> np.ndarray:  # (n_out, H, W, 3) uint8: the generated crop pasted into each frame
            if inp.frames.shape[0] == 0:
                return np.zeros((0, *self.coded_hw, 3), np.uint8)
            finish = label if tiny else None
            return paste_frames(region, kept, indices, inp.frames, c.src_start, finish, pool)

        return composite

    def _enter_part(self, c: Any) -> None:
        """A plan split at speaker switches runs one sampler per part: at a part's first chunk the sampler
        starts afresh (no motion frames from the other face's crop) on the part's frames and audio."""
        if not c.part_frames or c.part == self._part:
            return
        if self._part < 0:
            self._features = self.job.audio  # (L, 12, 768) the shot's
        self._part = c.part
        feats = self._features  # (L, 12, 768), or one per stem for two speakers
        audio = [f[c.part_start :] for f in feats] if isinstance(feats, list) else feats[c.part_start :]
        self.job = dataclasses.replace(self.job, audio=audio, n_frames=self.plan.part_frames(c))
        if c.part_chunk == 0:
            self.stream_state = None

    def state(self) -> dict[str, Any] | None:
        if self.stream_state is None:
            return None
        return {"format": STATE_FORMAT, "stream": self.stream_state.state_dict()}

    def timings(self) -> dict[str, float]:
        return dict(self.watch.totals)

    def close(self) -> None:
        self._source_cache.clear()
        if self._paste_pool is not None:
            self._paste_pool.shutdown(wait=True)
