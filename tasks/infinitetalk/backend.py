"""The InfiniteTalk backend class: `InfiniteTalkBackend` behind the `GatingBackend` protocol, bound to a
shot's config; it gates shots (`prepare_shot`), hands out the resident models and the shot worker, keeps
the per-film prompt embedding and audio features (what they are keyed by and how they are computed), and
opens a shot's session (`open_shot`).

The top of the package: it composes the other files and holds no chunk loop, no geometry and no option
rules of its own (those are `session`, `region_map` and `options`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from model.weights.layout import has_multi, layout_for
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.decision.record import ShotDecision
from tasks.decision.shot_decision import decide_shot, faces_path
from tasks.errors import ConfigError, MediaError
from tasks.infinitetalk import cost, identity, resident, warmup
from tasks.infinitetalk.cache import audio_digest, cached_tensors, ensure_tiny_root, path_stamp
from tasks.infinitetalk.multi import resolve_two_speakers
from tasks.infinitetalk.options import VaeTiling, load_spec, resolve_device, resolve_options
from tasks.infinitetalk.session import InfiniteTalkSession, sampler_settings
from tasks.infinitetalk.timeline import MODEL_FPS, WAV2VEC_RATE, FeatureTimeline, check_plan_agreement
from tasks.infinitetalk.timing import Stopwatch
from tasks.infinitetalk.tiny import TINY_BANNER, TinyLog
from tasks.picture.geometry import ModelGeometry
from tasks.render.backend import FilmInputs, PlannedShot, ShotContext
from tasks.timeline.plan import ShotPlan

if TYPE_CHECKING:
    import torch

    from model.weights.loading import LoadSpec

log = logging.getLogger(__package__)  # the package's one logger, "tasks.infinitetalk"


class InfiniteTalkBackend:
    """InfiniteTalk behind the `GatingBackend` protocol (see the package docstring)."""

    name = "infinitetalk"
    applies_color = True  # colour is matched per chunk in model space, against the chunk's reference
    dubs = True

    def __init__(self, options: dict[str, Any], config: PipelineConfig | None = None):
        self.options = dict(options)
        self.config: PipelineConfig | None = None
        self._bind(config if config is not None else load_config())

    @staticmethod
    def check_options(config: PipelineConfig) -> None:
        """The options check of a shot plan's effective config (no weights needed, nothing loaded)."""
        resolve_options(config, config.backend.options, need_weights=False)

    # hooks generic code asks through the registry (`tasks.render.backend`): nothing loaded for them
    weights_identity = staticmethod(identity.weights_identity)  # what a shot key records of the weights
    price = staticmethod(cost.chunk_price)  # one full chunk's GPU seconds
    shot_price = staticmethod(cost.shot_price)  # a dubbed shot's, two speakers included
    model_size = staticmethod(warmup.decision_model_hw)  # the size a planned decision generates at

    def _bind(self, config: PipelineConfig) -> None:
        """Use `config` (a shot's own config, from its ShotContext, wins over the constructor's)."""
        if config == self.config:
            return
        self.opts = resolve_options(config, self.options)
        self.config = config
        self.tiny = self.opts.mode == "tiny"
        self.log: logging.Logger | logging.LoggerAdapter = TinyLog(log, {}) if self.tiny else log
        self.vae_tiling = VaeTiling(self.opts.vae_tiling, self.opts.vae_tile_px)
        self._specs: dict[str, LoadSpec] = {}  # per device: the offload decision is made once per config

    def load_spec(self, device: str, multi: bool = False) -> LoadSpec:
        """`load_spec` of the bound options for `device` (kept: `offload: auto` asks CUDA and sizes the DiT);
        `multi`: the same with the multi-person DiT (`tasks.infinitetalk.multi`)."""
        if device not in self._specs:
            self._specs[device] = load_spec(self.opts, device, frame_num=self.config.plan.frame_num)
        return dataclasses.replace(self._specs[device], multi=True) if multi else self._specs[device]

    # --- weights and models

    def weights_root(self) -> Path:
        if self.opts.weights is not None:
            root = Path(self.opts.weights)
            if not root.is_dir():
                raise ConfigError("infinitetalk.weights", f"{root}: weights root not found")
            return root
        return ensure_tiny_root(Path(self.config.workspace.root) / ".cache")

    def models(self, *components: str, multi: bool = False) -> dict[str, Any]:
        """Components from the process's resident set (loaded on first use; `multi`: with the multi DiT)."""
        device = resolve_device(self.opts.device)  # RESIDENT is looked up per call: tests swap the holder
        return resident.RESIDENT.get(self.weights_root(), self.load_spec(device, multi), components)

    def multi_available(self) -> bool:
        """Whether the weights root holds the multi checkpoint (of the configured quantization)."""

        return has_multi(self.weights_root(), self.opts.quant)

    def shot_worker_config(self, multi: bool = False) -> Any:
        """Start the process's ShotWorker (`gpus_per_shot` ranks) unless it runs; its DiT config."""
        import torch

        n, device = self.opts.gpus_per_shot, resolve_device(self.opts.device)
        if device != "cpu" and torch.cuda.device_count() < n:
            raise ConfigError(
                "infinitetalk.gpus_per_shot",
                f"{n} GPUs per shot but {torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES)",
            )
        return resident.RESIDENT.shot_worker_config(
            self.weights_root(), self.load_spec(device, multi), n, self.vae_tiling
        )

    def warm_up_planned(self, shots: Sequence[PlannedShot], film: FilmInputs | None = None) -> dict[str, Any]:
        """A group's model load before its first shot: the generation models, then the compile warm-up at
        every size its `shots` were planned at (`warmup.planned_warm_ups`; shots of another backend add
        nothing) that the resident set is not warm for yet. With `film` (and `pipeline.film_prep: lead_in`) the film's
        prompt embedding and audio features are made here too, on a thread beside the warm-up, so the
        first dubbed shot finds them cached. {} when nothing is done (nothing is loaded then: the first shot
        loads as before); else the seconds of each part, sizes as "WxH"."""
        mine = [s for s in shots if s.config.backend.name == self.name]
        todo = []
        for hw, shot in warmup.planned_warm_ups(mine):
            self._bind(shot.config)
            settings = sampler_settings(self.opts, self.config, shot.plan, tiny=self.tiny)
            key = warmup.warm_key(self, hw, settings)
            if key is not None and not resident.RESIDENT.is_warm(key):
                todo.append((hw, shot.config, settings))
        prep_config = self._film_prep_config(mine, film, todo)
        if not todo and prep_config is None:
            return {}
        t0 = time.perf_counter()
        models_s = 0.0
        if todo:  # the models of the first size's shot (one resident set: its root and spec)
            self._bind(todo[0][1])
            self.models("dit", "vae", "clip")
            models_s = time.perf_counter() - t0
        prep: Future[float] | None = None
        pool = ThreadPoolExecutor(1, thread_name_prefix="film-prep") if prep_config is not None else None
        try:
            if pool is not None and film is not None:
                prep = pool.submit(self._film_prep, prep_config, film)
            sizes: dict[str, float] = {}
            for (h, w), config, settings in todo:
                self._bind(config)
                seconds = warmup.warm_up(self, (h, w), settings)
                if seconds is not None:
                    sizes[f"{w}x{h}"] = round(seconds, 3)
            prep_s = prep.result() if prep is not None else None  # its error is the lead-in's error
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        total = time.perf_counter() - t0
        self.log.info(
            "model load before the group's first shot: %.1f s (models %.1f s; compile warm-up %s; film prep %s)",
            total, models_s, ", ".join(f"{k} {v:.1f} s" for k, v in sizes.items()) or "none",
            "none" if prep_s is None else f"{prep_s:.1f} s beside it",
        )  # fmt: skip
        out = {"models_s": round(models_s, 3), "warm_up_s": sizes, "total_s": round(total, 3)}
        return out if prep_s is None else {**out, "film_prep_s": round(prep_s, 3)}

    def _film_prep_config(
        self, shots: Sequence[PlannedShot], film: FilmInputs | None, todo: list[Any]
    ) -> PipelineConfig | None:
        """The config the film's prep runs under in the lead-in (the first warmed size's shot's, else the
        first dubbed shot's), or None: no `film`, no dubbed shot, `pipeline.film_prep: shot`, or both files made."""
        if film is None:
            return None
        dubbed = [s.config for s in shots if s.model_hw is not None]
        config = todo[0][1] if todo else (dubbed[0] if dubbed else None)
        if config is None:
            return None
        self._bind(config)
        if self.config.pipeline.film_prep != "lead_in":
            return None
        film_dir = Path(film.work_dir) / "film"
        made = (
            self.prompt_cache_path(film_dir).is_file()
            and self.audio_features_path(film_dir, Path(film.dialogue)).is_file()
        )  # a film already prepared (another group of it in this workspace): nothing to do
        return None if made else config

    def _film_prep(self, config: PipelineConfig, film: FilmInputs) -> float:
        """The film's prompt embedding and audio features into their cache files (what a shot's session
        reads), by a backend of its own bound to `config` (the caller's thread rebinds this one); seconds."""
        t0 = time.perf_counter()
        other = InfiniteTalkBackend(self.options, config=config)
        watch = Stopwatch(resolve_device(other.opts.device), False)
        film_dir = Path(film.work_dir) / "film"
        other.prompt_embeddings(film_dir, watch)
        other.audio_features_file(film_dir, Path(film.dialogue), watch)
        return time.perf_counter() - t0

    # --- per-film caches

    def _model_tag(self, component: str) -> str:

        layout = layout_for("infinitetalk-480" if self.tiny else self.opts.mode, self.opts.quant)
        root = self.weights_root()
        path = root / layout.wav2vec_dir if component == "audio" else root / layout.wan_dir / layout.t5
        return path_stamp(path)

    def prompt_cache_path(self, film_dir: Path) -> Path:
        """Where the film's prompt embedding lives (keyed by both prompts and the umT5 weights)."""
        key = hashlib.sha256(
            "\0".join([self.opts.prompt, self.opts.negative_prompt, self._model_tag("t5")]).encode()
        ).hexdigest()[:16]
        return film_dir / f"prompt-{key}.safetensors"

    def prompt_embeddings(self, film_dir: Path, watch: Stopwatch) -> dict[str, torch.Tensor]:
        """umT5 context / negative context of the configured prompts, cached per film."""
        from safetensors.torch import load_file

        path = self.prompt_cache_path(film_dir)

        def compute() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            self.log.info("encoding the prompt with umT5 (once per film) -> %s", path)
            with watch("encoders"):
                t5 = self.models("t5")["t5"]
                context, context_null = t5.encode([self.opts.prompt, self.opts.negative_prompt])
            return {"context": context, "context_null": context_null}, {"prompt": self.opts.prompt}

        return load_file(str(cached_tensors(path, compute)))

    def audio_features_path(self, film_dir: Path, dialogue_path: Path) -> Path:
        """Where the dub track's features live (keyed by the track, the wav2vec2 weights and the dtype)."""
        spec = self.load_spec(resolve_device(self.opts.device))
        dtype = str(spec.dtype).removeprefix("torch.")
        key = hashlib.sha256(
            "\0".join([audio_digest(dialogue_path), self._model_tag("audio"), dtype]).encode()
        ).hexdigest()[:16]
        return film_dir / f"audio_features-{key}.safetensors"

    def audio_features_file(self, film_dir: Path, dialogue_path: Path, watch: Stopwatch) -> Path:
        """The dub track's wav2vec2 features at 25 fps for the whole film (cached per film)."""

        spec = self.load_spec(resolve_device(self.opts.device))
        path = self.audio_features_path(film_dir, dialogue_path)

        def compute() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            import soundfile as sf

            from model.network.wav2vec import (  # imports transformers: only when features are computed
                frame_count,
                loudness_normalize,
            )

            self.log.info("wav2vec2 features of %s (once per film) -> %s", dialogue_path, path)
            wave, sr = sf.read(str(dialogue_path), dtype="float32", always_2d=True)
            if sr != WAV2VEC_RATE:
                raise MediaError(
                    dialogue_path, f"dialogue track is {sr} Hz, wav2vec2 needs {WAV2VEC_RATE} Hz"
                )
            mono = np.ascontiguousarray(wave.mean(axis=1))
            with watch("encoders"):
                encoder = self.models("audio")["audio"]
                n = frame_count(mono.shape[0], MODEL_FPS, sr)
                feats = encoder.embed(
                    loudness_normalize(mono, sr), fps=MODEL_FPS, n_frames=n, out_dtype=spec.dtype
                )
            timeline = FeatureTimeline(n, mono.shape[0], sr, encoder.stride, encoder.receptive_field)
            return {"features": feats}, timeline.to_metadata()

        return cached_tensors(path, compute)

    # --- GatingBackend

    def prepare_shot(
        self,
        plan: ShotPlan,
        geometry: ModelGeometry,
        shot_audio: np.ndarray,
        sample_rate: int,
        context: ShotContext,
    ) -> ShotDecision:
        """Gate the shot: speech in its dub slice, who on screen speaks (the planning's cached face analysis;
        analysed here only when that file is missing), the policy."""
        self._bind(context.config)
        cache = faces_path(
            context.work_dir, plan.shot_index, plan.start_frame, plan.end_frame, context.config
        )
        d = decide_shot(
            plan.shot_index, plan.start_frame, plan.end_frame, context.video, shot_audio, sample_rate,
            context.config, cache, planned=True,
        )  # fmt: skip
        d = resolve_two_speakers(d, self.multi_available, context.config)  # multi missing: the louder
        if d.dub and self.tiny:
            d = dataclasses.replace(d, reason=f"{TINY_BANNER}; {d.reason}")
        self.log.info("shot %04d: %s (%s)", plan.shot_index, "dub" if d.dub else "pass through", d.reason)
        return d

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
    ) -> InfiniteTalkSession:
        if context is None:
            raise ValueError(
                "InfiniteTalkBackend.open_shot needs the ShotContext (tasks.render.shot passes it)"
            )
        self._bind(context.config)
        check_plan_agreement(plan)
        if decision is None:
            decision = self.prepare_shot(plan, geometry, shot_audio, sample_rate, context)
        decision = resolve_two_speakers(decision, self.multi_available, context.config)  # a kept decision
        return InfiniteTalkSession(self, plan, geometry, decision, context, resume_state)
