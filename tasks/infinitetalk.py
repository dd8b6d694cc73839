"""The InfiniteTalk backend: decide which shots to dub, then dub a face crop of each chunk by chunk.

Per shot (`tasks.render.render_shot_result` drives it through the `GatingBackend` protocol):

1. `prepare_shot` — the gate. Speech in the dub track's slice (`tasks.speech.detect_speech`), then a face
   track over sampled frames in display orientation (`tasks.region`), then `tasks.gate.decide_dub` (policy
   `auto|all|none`, per-shot overrides). A shot that is not dubbed is copied through by the renderer; the
   model is never touched for it.
2. `open_shot` — models and per-film inputs. Components come from `RESIDENT` (loaded once per worker
   process, see `ResidentModels`); the prompt embedding (umT5) and the dub track's audio features
   (wav2vec2, windowed, 25 fps) are computed once per *film* and kept as safetensors files in the run's
   work dir (`film/`), written atomically under a file lock, so every shot on every worker reuses them.
3. `dub_chunk` — one `model.sampler.stream_generate` chunk: the chunk's sliding reference frame and the
   shot's frames are cropped to the region plan's box (or the official full-frame resize + centre crop,
   `region.mode: full`), generated at the model's bucket on the 25 fps timeline, colour-matched to the
   chunk's reference, conformed back to the source frames (`ShotPlan.conform_indices`) and blended into
   the source frames with a feathered border (pixels outside the box stay bit-identical). `state()`
   returns the sampler's `StreamState` (motion frames, RNG, colour reference) for the renderer's
   per-chunk checkpoint, so a killed worker resumes at the next chunk with identical results.

Audio alignment: feature frame i of the film sits at time `i * period` (`FeatureTimeline`; the period is
1/25 s up to the official align-corners stretch); a shot starting at source frame s uses the feature
frames from `FeatureTimeline.nearest(s / fps)` on, so model frame k is conditioned on feature frame
`offset + k` (tests/test_lipsync_timeline.py bounds the error by one source frame).

Tiny mode (`infinitetalk.weights: null`): a tiny random weights root is written once under
`<workspace.root>/.cache` and run at 1/16 of the bucket with few steps. Every log line, every shot
reason and every dubbed frame says so: it is a pipeline check, not a dubbing result.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import functools
import gc
import hashlib
import logging
import math
import os
import shutil
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tasks.backend import ChunkInput, ShotContext, ShotDecision
from tasks.config import GateConfig, InfiniteTalkConfig, PipelineConfig, load_config
from tasks.errors import ConfigError, MediaError
from tasks.frames import CropGeometry, ModelGeometry, atomic_temp, iter_frames, read_frames
from tasks.gate import decide_dub
from tasks.plan import ShotPlan, source_frame_at
from tasks.region import Box, RegionConfig, RegionPlan
from tasks.speech import detect_speech

if TYPE_CHECKING:
    import torch

    from model.loading import LoadSpec
    from model.offload import OffloadDecision
    from model.vae import TileSpec

log = logging.getLogger(__name__)

TINY_BANNER = "tiny random weights: pipeline check, not a dubbing result"
TINY_LABEL = "TINY RANDOM WEIGHTS - NOT A DUB"
TINY_SCALE = 16  # tiny mode generates at 1/16 of the bucket (sides rounded to multiples of 16)
TINY_WEIGHTS_SEED = 0
MODEL_FPS = 25
WAV2VEC_RATE = 16000
STATE_FORMAT = 1


# ------------------------------------------------------------------------------------------ options


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


def tiny_hw(bucket: tuple[int, int]) -> tuple[int, int]:
    """Tiny-mode model size for a bucket: 1/TINY_SCALE of each side, a multiple of 16 (>= 16)."""
    return tuple(max(16, 16 * round(side / (16 * TINY_SCALE))) for side in bucket)  # type: ignore[return-value]


def _device(name: str) -> str:
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
        from model.vae import TileSpec  # noqa: PLC0415

        if self.mode is True:
            return TileSpec(tile=self.tile_px, stride=self.tile_px - self.tile_px // 4)
        if self.mode is False or device_type != "cuda" or free_bytes is None:
            return None
        return vae_tiling_for(height, width, free_bytes, dtype=dtype)


class _TiledVAE:
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


class _TinyLog(logging.LoggerAdapter):
    """Prefixes every message with the tiny-weights banner."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{TINY_BANNER}] {msg}", kwargs


# --------------------------------------------------------------------------------- resident models


class ResidentModels:
    """Model components kept loaded for the life of a worker process, keyed by weights root + LoadSpec.

    THE ONE INTENTIONAL PROCESS-LEVEL OBJECT in dubflow (`RESIDENT` below): a worker runs many shots, one
    `render_shot` call each, and reloading ~50 GB of weights per shot would dominate. Components are
    loaded on first use (umT5 and wav2vec2 only when a per-film cache file is missing); asking for
    another root or spec drops the current set first. `loads` counts loads per component (tests).

    With `gpus_per_shot: N > 1` it also holds the process's `model.parallel.ShotWorker`: N rank processes
    started on the first dubbed shot, each with its share of the generation models resident, kept for
    later shots and closed by `close()` (registered with `atexit`). `loads["shot_worker"]` counts starts;
    `worker_stats` is rank 0's last answer: its pid and the jobs it has run since its setup.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[str, Any] | None = None
        self._components: dict[str, Any] = {}
        self.loads: Counter[str] = Counter()
        self._worker: Any | None = None  # model.parallel.ShotWorker
        self._worker_key: tuple[str, Any, int, VaeTiling] | None = None
        self._worker_dit_config: Any | None = None
        self._atexit = False
        self.worker_stats: dict[str, int] = {}

    def get(self, root: Path, spec: LoadSpec, components: tuple[str, ...]) -> dict[str, Any]:
        """The requested components (loading the missing ones in one `load_models` call)."""
        from model.loading import COMPONENTS, load_models  # noqa: PLC0415

        key = (str(Path(root).resolve()), dataclasses.replace(spec, components=COMPONENTS))
        with self._lock:
            if key != self._key:
                self._drop()
                self._key = key
            missing = tuple(c for c in components if c not in self._components)
            if missing:
                models = load_models(root, dataclasses.replace(spec, components=missing))
                for c in missing:
                    self._components[c] = getattr(models, c)
                    self.loads[c] += 1
            return {c: self._components[c] for c in components}

    def install(self, root: Path, spec: LoadSpec, components: Mapping[str, Any]) -> None:
        """Make already-built components resident for (root, spec), e.g. random real-size models in a
        benchmark; later `get` calls for that key return them without loading."""
        from model.loading import COMPONENTS  # noqa: PLC0415

        key = (str(Path(root).resolve()), dataclasses.replace(spec, components=COMPONENTS))
        with self._lock:
            if key != self._key:
                self._drop()
                self._key = key
            self._components.update(components)

    def clear(self) -> None:
        """Unload everything and stop the shot worker (the next shot loads / starts again)."""
        with self._lock:
            self._drop()
            self._key = None
            self._close_worker()

    close = clear

    def shot_worker_config(
        self, root: Path, spec: LoadSpec, world_size: int, tiling: VaeTiling | None = None
    ) -> Any:
        """Start the ShotWorker for (root, spec, N, VAE tiling) unless it runs already; returns its DiT config."""
        from model.loading import COMPONENTS  # noqa: PLC0415
        from model.parallel import ShotWorker  # noqa: PLC0415

        tiling = tiling or VaeTiling()
        key = (
            str(Path(root).resolve()),
            dataclasses.replace(spec, components=COMPONENTS),
            world_size,
            tiling,
        )
        with self._lock:
            if self._worker is not None and self._worker_key != key:
                self._close_worker()
            if self._worker is None:
                worker = ShotWorker(
                    world_size,
                    functools.partial(_rank_setup, key[0], key[1], tiling),
                    _rank_handle,
                    backend="gloo" if spec.device == "cpu" else "nccl",
                )
                worker.start()
                self._worker, self._worker_key = worker, key
                self.loads["shot_worker"] += 1
                if not self._atexit:
                    atexit.register(self.close)
                    self._atexit = True
                self._worker_dit_config = self._run_locked({"describe": True})
            return self._worker_dit_config

    def run_chunk(self, job: ChunkJob) -> dict[str, Any]:
        """One chunk on the running ShotWorker: {"index", "frames" uint8 (n, H, W, 3), "state" dict}."""
        with self._lock:
            if self._worker is None:
                raise RuntimeError("ResidentModels.run_chunk: no shot worker (shot_worker_config first)")
            return self._run_locked({"chunk": job})

    def _run_locked(self, job: dict[str, Any]) -> Any:
        from model.parallel import ShotWorkerError  # noqa: PLC0415

        try:
            out = self._worker.run(job)
        except ShotWorkerError:
            self._worker = self._worker_key = None  # it closed itself: the next shot starts a new one
            raise
        self.worker_stats = {"pid": out["pid"], "jobs": out["jobs"]}
        return out["result"]

    def _close_worker(self) -> None:
        worker, self._worker, self._worker_key = self._worker, None, None
        if worker is not None:
            worker.close()

    def _drop(self) -> None:
        if not self._components:
            return
        self._components.clear()
        gc.collect()
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


RESIDENT = ResidentModels()


# ------------------------------------------------------------------------------ files, locks, caches


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (`flock`) on `path`: one process computes a cache, the others wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_tiny_root(cache_dir: Path, seed: int = TINY_WEIGHTS_SEED) -> Path:
    """A tiny random weights root (official layout), written once under `cache_dir` and reused."""
    root = cache_dir / f"tiny-weights-seed{seed}"
    if (root / ".complete").exists():
        return root
    with file_lock(cache_dir / f"tiny-weights-seed{seed}.lock"):
        if (root / ".complete").exists():
            return root
        from model.tiny import write_tiny_root  # noqa: PLC0415

        tmp = cache_dir / f".tiny-weights-seed{seed}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        log.warning("[%s] writing tiny random weights to %s", TINY_BANNER, root)
        write_tiny_root(tmp, seed)
        (tmp / ".complete").touch()
        shutil.rmtree(root, ignore_errors=True)  # an interrupted earlier attempt
        os.replace(tmp, root)
    return root


def audio_digest(path: Path, block: int = 1 << 20) -> str:
    """sha256 of an audio file's samples and rate (not its bytes: WAV headers carry timestamps)."""
    import soundfile as sf  # noqa: PLC0415

    h = hashlib.sha256()
    with sf.SoundFile(str(path)) as f:
        h.update(f"{f.samplerate}:{f.channels}:".encode())
        while (chunk := f.read(block, dtype="float32")).size:
            h.update(chunk.tobytes())
    return h.hexdigest()


def _weights_identity(path: Path) -> str:
    """Resolved path, size and mtime of a weights file or folder (its files)."""
    if not path.exists():
        return f"{path.resolve()}:absent"
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    parts = [str(path.resolve())]
    for p in files:
        st = p.stat()
        parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def cached_tensors(path: Path, compute: Callable[[], tuple[dict[str, torch.Tensor], dict[str, str]]]) -> Path:
    """`path` (safetensors), computed by `compute() -> (tensors, metadata)` under a lock if absent."""
    from safetensors.torch import save_file  # noqa: PLC0415

    if path.exists():
        return path
    with file_lock(path.with_name(path.name + ".lock")):
        if path.exists():  # another process wrote it while this one waited
            return path
        tensors, metadata = compute()
        tmp = atomic_temp(path)
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------------- audio timeline


@dataclass(frozen=True)
class FeatureTimeline:
    """Where the film's audio feature frames sit in time.

    wav2vec2 conv frames (every `stride` samples) are linearly interpolated (align_corners) to the
    `n_frames` video frames at 25 fps the audio covers, so feature i is read at conv position
    `i * (n_conv - 1) / (n_frames - 1)`, i.e. at time `i * period_s` (period 1/25 s up to that stretch).
    """

    n_frames: int
    n_samples: int
    sample_rate: int = WAV2VEC_RATE
    stride: int = 320
    receptive_field: int = 400

    @property
    def period_s(self) -> float:
        n_conv = (self.n_samples - self.receptive_field) // self.stride + 1
        if self.n_frames < 2:
            return 1.0 / MODEL_FPS
        return (n_conv - 1) / (self.n_frames - 1) * self.stride / self.sample_rate

    def time_s(self, i: int) -> float:
        """Audio time of feature frame i."""
        return i * self.period_s

    def nearest(self, t: float) -> int:
        """Feature frame closest to time t (clamped to the film)."""
        return min(max(round(t / self.period_s), 0), max(self.n_frames - 1, 0))

    def to_metadata(self) -> dict[str, str]:
        return {k: str(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> FeatureTimeline:
        return cls(**{f.name: int(meta[f.name]) for f in dataclasses.fields(cls)})


def shot_feature_offset(start_frame: int, fps: Fraction, timeline: FeatureTimeline) -> int:
    """First feature frame of a shot starting at film frame `start_frame`: the one nearest its start time."""
    return timeline.nearest(float(start_frame / fps))


def shot_feature_range(plan: ShotPlan, timeline: FeatureTimeline) -> tuple[int, int]:
    """Film feature frames [offset, stop) a shot is conditioned on: model frame k uses `offset + k`
    (the sampler clamps windows past `stop`, the film's end)."""
    offset = shot_feature_offset(plan.start_frame, plan.fps, timeline)
    return offset, min(timeline.n_frames, offset + plan.chunks[-1].model_end)


def check_plan_agreement(plan: ShotPlan) -> None:
    """The renderer's chunk plan (`tasks.plan`) must be the sampler's (`model.sampler.plan_chunks`)."""
    from model.sampler import plan_chunks  # noqa: PLC0415

    ours = [(c.model_start, c.num_frames, c.new_start, c.new_end) for c in plan.chunks]
    theirs = [
        (s.start, s.length, s.start + s.keep_start, s.start + s.keep_end)
        for s in plan_chunks(plan.model_frames, plan.frame_num, plan.motion_frames)
    ]
    if ours != theirs:
        raise RuntimeError(
            f"chunk plans disagree for shot {plan.shot_index} ({plan.model_frames} model frames): "
            f"tasks.plan {ours} vs model.sampler {theirs}"
        )


# ------------------------------------------------------------------------------------ gating


def sample_indices(n_frames: int, cfg: RegionConfig) -> list[int]:
    """Shot-relative frames the face detector looks at (the stride rule of `tasks.region.detect_samples`)."""
    if n_frames <= 0:
        return []
    stride = max(cfg.sample_every, math.ceil(n_frames / cfg.max_samples))
    return list(range(0, n_frames, stride))


def plan_region_sampled(
    frames: Mapping[int, np.ndarray], n_frames: int, cfg: RegionConfig, detector: Any | None = None
) -> RegionPlan:
    """`tasks.region.plan_region` from the sampled frames only ({shot frame: display-oriented frame})."""
    from tasks.region import LbpFaceDetector, detect_samples, link_tracks, main_track, plan_from_track  # noqa: PLC0415

    order = sorted(frames)
    every = dataclasses.replace(cfg, sample_every=1, max_samples=max(1, len(order)))
    samples, hw, _ = detect_samples(
        [frames[t] for t in order], detector or LbpFaceDetector(), every, len(order)
    )
    samples = [(order[i], boxes) for i, boxes in samples]  # back to shot frame numbers
    return plan_from_track(main_track(link_tracks(samples)), hw, n_frames, len(samples), cfg)


def decide_shot(
    shot_index: int,
    audio: np.ndarray,
    sample_rate: int,
    n_frames: int,
    frames_fn: Callable[[list[int]], Mapping[int, np.ndarray]],
    gate: GateConfig,
    region_cfg: RegionConfig,
) -> ShotDecision:
    """Speech, then (only when the outcome can depend on it) a face track, then the policy.

    `audio` (S, C) or (S,) float32; `frames_fn(indices)` returns display-oriented frames of the shot.
    """
    mono = audio.mean(axis=1) if audio.ndim == 2 else audio
    speech = detect_speech(np.ascontiguousarray(mono, dtype=np.float32), sample_rate)
    overrides = {str(k): v for k, v in gate.overrides.items()}
    action = str(overrides.get(str(shot_index), "")).strip().lower()
    needs_frames = action == "dub" or (
        action != "skip" and (gate.policy == "all" or (gate.policy == "auto" and speech.has_speech))
    )
    if needs_frames:
        region = plan_region_sampled(frames_fn(sample_indices(n_frames, region_cfg)), n_frames, region_cfg)
    else:  # the decision cannot depend on the picture: no decoding
        region = RegionPlan(region_cfg.mode, (0, 0, 1, 1), (16, 16), False, 0, "not planned")
    try:
        d = decide_dub(shot_index, speech, region, gate.policy, overrides, gate.require_face)
    except ValueError as ex:
        raise ConfigError("gate", str(ex)) from ex
    details = {"speech": speech.to_dict(), "region": region.to_dict() if needs_frames else None}
    return ShotDecision(d.dub, d.reason, details)


# ------------------------------------------------------------------------------------ geometry


def display_box_to_coded(box: Box, geometry: ModelGeometry) -> Box:
    """A box in display pixels (rotated, square pixels) -> the same region in coded source pixels."""
    x0, y0, x1, y1 = box
    k = (geometry.rotation // 90) % 4
    hd, wd = geometry.display_hw
    # undo np.rot90(pre, k): rows/cols of the display box in the un-rotated (square-pixel) frame
    if k == 0:
        r0, r1, c0, c1 = y0, y1, x0, x1
        hp, wp = hd, wd
    elif k == 1:  # display[i, j] = pre[j, W - 1 - i]
        hp, wp = wd, hd
        r0, r1, c0, c1 = x0, x1, wp - y1, wp - y0
    elif k == 2:
        hp, wp = hd, wd
        r0, r1, c0, c1 = hp - y1, hp - y0, wp - x1, wp - x0
    else:  # display[i, j] = pre[H - 1 - j, i]
        hp, wp = wd, hd
        r0, r1, c0, c1 = hp - x1, hp - x0, y0, y1
    sy, sx = geometry.coded_hw[0] / hp, geometry.coded_hw[1] / wp
    return (round(c0 * sx), round(r0 * sy), round(c1 * sx), round(r1 * sy))


class ShotRegion:
    """Coded source frames <-> model frames for one shot: a region crop, or the official full frame."""

    def __init__(
        self, geometry: ModelGeometry, plan: RegionPlan | None, model_hw: tuple[int, int], feather_px: int
    ):
        self.geometry = geometry
        self.model_hw = model_hw
        self.feather_px = feather_px
        self.full = plan is None or plan.mode == "full"
        self.plan = plan
        if self.full:  # the official resize-to-cover + centre crop, at model_hw
            self.full_geometry = dataclasses.replace(
                geometry, crop=CropGeometry.cover(geometry.display_hw, model_hw)
            )
            self._full_box = self._window_box(self.full_geometry.coded_window())
        else:
            assert plan is not None
            self._boxes: dict[Box, Box] = {}

    @staticmethod
    def _window_box(window: tuple[int, int, int, int]) -> Box:
        y0, y1, x0, x1 = window
        return (x0, y0, x1, y1)

    def coded_box(self, j: int) -> Box:
        """The box of shot frame j in coded pixels (what changes in that frame)."""
        if self.full:
            return self._full_box
        box = self.plan.box_at(j)
        if box not in self._boxes:
            self._boxes[box] = display_box_to_coded(box, self.geometry)
        return self._boxes[box]

    def to_model(self, frame: np.ndarray, j: int) -> np.ndarray:
        """uint8 coded (H, W, 3) frame j -> uint8 model input (mh, mw, 3)."""
        if self.full:
            return self.full_geometry.to_model(frame)
        from tasks.region import crop_to_bucket  # noqa: PLC0415

        x0, y0, x1, y1 = self.coded_box(j)
        crop = np.ascontiguousarray(np.rot90(frame[y0:y1, x0:x1], self.geometry.rotation // 90))
        return crop_to_bucket(crop, (0, 0, crop.shape[1], crop.shape[0]), self.model_hw)

    def paste(self, generated: np.ndarray, source: np.ndarray, j: int) -> np.ndarray:
        """Blend a generated model frame into coded source frame j (only its box changes)."""
        if self.full:
            return self.full_geometry.from_model(generated, source)
        from tasks.region import composite  # noqa: PLC0415

        patch = np.ascontiguousarray(np.rot90(generated, -(self.geometry.rotation // 90)))
        return composite(source, patch, self.coded_box(j), self.feather_px)


def label_tiny(frame: np.ndarray, box: Box) -> np.ndarray:
    """Write TINY_LABEL inside `box` of a copy of `frame` (nothing outside the box changes)."""
    import cv2  # noqa: PLC0415

    x0, y0, x1, y1 = box
    out = frame.copy()
    patch = np.ascontiguousarray(out[y0:y1, x0:x1])
    font = cv2.FONT_HERSHEY_SIMPLEX
    (tw, th), _ = cv2.getTextSize(TINY_LABEL, font, 1.0, 1)
    scale = max(0.15, min(1.0, (x1 - x0 - 4) / tw))  # fit the box width
    org = (2, 2 + max(1, round(th * scale)))
    cv2.putText(patch, TINY_LABEL, org, font, scale, (0, 0, 0), 2, cv2.LINE_AA)
    cv2.putText(patch, TINY_LABEL, org, font, scale, (255, 255, 0), 1, cv2.LINE_AA)
    out[y0:y1, x0:x1] = patch
    return out


def _to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 (T, H, W, 3) -> float32 (3, T, H, W) in [-1, 1]."""
    import torch  # noqa: PLC0415

    return torch.from_numpy(np.array(frames)).permute(3, 0, 1, 2).float() / 127.5 - 1.0  # a writable copy


def _to_uint8(video: torch.Tensor) -> np.ndarray:
    """float (3, T, H, W) in [-1, 1] -> uint8 (T, H, W, 3) on the host."""
    return ((video.float() + 1.0) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 3, 0).cpu().numpy()


# ------------------------------------------------------------------------------------ timing


class _Stopwatch:
    """Seconds and calls per stage; with `sync` the device is synchronised around each stage."""

    def __init__(self, device: str, sync: bool):
        self.device = device
        self.sync = sync and device.startswith("cuda")
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.sync:
            import torch  # noqa: PLC0415

            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                import torch  # noqa: PLC0415

                torch.cuda.synchronize(self.device)
            self.totals[name] += time.perf_counter() - t0
            self.calls[name] += 1


class _TimedDiT:
    """The DiT as the sampler calls it, timed."""

    def __init__(self, dit: Any, watch: _Stopwatch):
        self.dit, self.watch = dit, watch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.watch("dit"):
            return self.dit(*args, **kwargs)

    def timestep_modulation(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The DiT's own (e, e0) of t: lets the sampler prepare TeaCache decisions without host syncs."""
        with self.watch("dit"):
            return self.dit.timestep_modulation(t)


class _TimedVAE:
    """The VAE as the sampler uses it, timed."""

    def __init__(self, vae: Any, watch: _Stopwatch):
        self.vae, self.watch = vae, watch

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        with self.watch("vae"):
            return self.vae.encode(video)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        with self.watch("vae"):
            return self.vae.decode(latent)


# ------------------------------------------------------------------------------------ one chunk


@dataclass
class ChunkJob:
    """Everything one chunk's generation needs besides the models. Picklable: with `gpus_per_shot > 1`
    it is the job record a `ShotWorker` broadcasts to its ranks (tensors on the host)."""

    settings: Any  # model.sampler.SamplerSettings
    context: torch.Tensor  # (Lt, Dt) umT5 prompt embedding
    context_null: torch.Tensor  # (Lt, Dt)
    audio: torch.Tensor  # (L, 12, 768) the shot's wav2vec2 features
    masks: torch.Tensor  # (3, h, w) speaker masks
    n_frames: int  # model frames of the shot
    reference: torch.Tensor  # (3, 1, H, W) in [-1, 1]: the chunk's reference frame
    source: torch.Tensor | None  # (3, T, H, W) the chunk's source model frames (video-to-video only)
    state: Any | None  # model.sampler.StreamState after the previous chunk; None = chunk 0
    teacache: float | None  # TeaCache threshold
    teacache_preset: str


@dataclass
class ChunkModels:
    """The generation models as `generate_chunk` calls them (timed in-process; SP-wrapped in a rank)."""

    dit: Callable[..., Any]
    vae: Any  # encode / decode
    clip_fn: Callable[[torch.Tensor], torch.Tensor]
    color_fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None
    device: str


def generate_chunk(models: ChunkModels, job: ChunkJob) -> Any:
    """One `stream_generate(max_chunks=1)` call -> its `model.sampler.ChunkOutput` (kept frames, state).

    The one code path of the generation: the calling process runs it with `gpus_per_shot: 1`, every rank
    of the ShotWorker with more. Noise comes from a CPU generator seeded for chunk 0 and restored from the
    state afterwards, so the result does not depend on where or in which process a chunk runs.
    """
    import torch  # noqa: PLC0415

    from model.sampler import Conditioning, stream_generate  # noqa: PLC0415

    source = job.source
    cond = Conditioning(
        context=job.context.to(models.device),
        context_null=job.context_null.to(models.device),
        audio=[job.audio],
        ref_target_masks=job.masks,
        clip_fn=models.clip_fn,
        n_frames=job.n_frames,
        source_video_fn=None if source is None else (lambda start, stop: source[:, : stop - start]),
    )
    generator = torch.Generator("cpu")
    if job.state is None:
        generator.manual_seed(job.settings.seed)
    teacache = None
    if job.teacache is not None:
        from model.teacache import TeaCache, TeaCacheConfig  # noqa: PLC0415

        steps = job.settings.sampling_steps - job.settings.start_step
        teacache = TeaCache(TeaCacheConfig(threshold=job.teacache, preset=job.teacache_preset), steps)
    outputs: list[Any] = []
    stream_generate(
        models.dit,
        models.vae,
        cond=cond,
        settings=job.settings,
        reference_frame_fn=lambda index, start: job.reference,
        color_fn=models.color_fn,
        state=job.state,
        on_chunk=outputs.append,
        generator=generator,
        teacache=teacache,
        collect=False,
        max_chunks=1,
    )
    (out,) = outputs
    return out


def _rank_setup(root: str, spec: LoadSpec, tiling: VaeTiling, sp: Any) -> dict[str, Any]:
    """ShotWorker setup of one rank: the DiT (sequence-parallel) everywhere, VAE (tiled per `tiling`) and
    CLIP on rank 0 only."""
    from model.loading import load_models  # noqa: PLC0415
    from model.parallel import RankZeroCodec  # noqa: PLC0415
    from tasks.color import match_and_blend  # noqa: PLC0415

    components = ("dit", "vae", "clip") if sp.is_writer() else ("dit",)
    models = load_models(root, dataclasses.replace(spec, device=str(sp.device), components=components))
    sp.attach(models.dit)
    tiled = None if models.vae is None else _TiledVAE(models.vae, tiling, log)
    vae = RankZeroCodec(sp, tiled)  # decoded video / latents broadcast: identical on every rank
    clip = RankZeroCodec(sp, models.clip)  # CLIP features likewise
    chunk_models = ChunkModels(models.dit, vae, clip.encode, match_and_blend, str(sp.device))
    return {"models": chunk_models, "jobs": 0}


def _rank_handle(sp: Any, rank: dict[str, Any], job: dict[str, Any]) -> dict[str, Any] | None:
    """ShotWorker job of one rank: {"describe": True} -> the DiT config; {"chunk": ChunkJob} -> rank 0's
    kept frames (uint8 (n, H, W, 3)) and the state after the chunk (host tensors)."""
    rank["jobs"] += 1
    if job.get("describe"):
        result: Any = rank["models"].dit.config
    else:
        out = generate_chunk(rank["models"], job["chunk"])
        result = {"index": out.spec.index, "frames": _to_uint8(out.frames), "state": out.state.state_dict()}
    if not sp.is_writer():
        return None
    return {"result": result, "pid": os.getpid(), "jobs": rank["jobs"]}


# ------------------------------------------------------------------------------------ backend


class InfiniteTalkBackend:
    """InfiniteTalk behind the `GatingBackend` protocol (see the module docstring)."""

    name = "infinitetalk"
    applies_color = True  # colour is matched per chunk in model space, against the chunk's reference
    dubs = True

    def __init__(self, options: dict[str, Any], config: PipelineConfig | None = None):
        self.options = dict(options)
        self.config: PipelineConfig | None = None
        self._bind(config if config is not None else load_config())

    def _bind(self, config: PipelineConfig) -> None:
        """Use `config` (a shot's own config, from its ShotContext, wins over the constructor's)."""
        if config == self.config:
            return
        self.opts = resolve_options(config, self.options)
        self.config = config
        self.tiny = self.opts.mode == "tiny"
        self.log: logging.Logger | logging.LoggerAdapter = _TinyLog(log, {}) if self.tiny else log
        self.region_cfg = region_config(config)
        self.vae_tiling = VaeTiling(self.opts.vae_tiling, self.opts.vae_tile_px)
        self._specs: dict[str, LoadSpec] = {}  # per device: the offload decision is made once per config

    def load_spec(self, device: str) -> LoadSpec:
        """`load_spec` of the bound options for `device` (kept: `offload: auto` asks CUDA and sizes the DiT)."""
        if device not in self._specs:
            self._specs[device] = load_spec(self.opts, device, frame_num=self.config.plan.frame_num)
        return self._specs[device]

    # --- weights and models

    def weights_root(self) -> Path:
        if self.opts.weights is not None:
            root = Path(self.opts.weights)
            if not root.is_dir():
                raise ConfigError("infinitetalk.weights", f"{root}: weights root not found")
            return root
        return ensure_tiny_root(Path(self.config.workspace.root) / ".cache")

    def models(self, *components: str) -> dict[str, Any]:
        """Components from the process's resident set (loaded on first use)."""
        device = _device(self.opts.device)
        return RESIDENT.get(self.weights_root(), self.load_spec(device), components)

    def shot_worker_config(self) -> Any:
        """Start the process's ShotWorker (`gpus_per_shot` ranks) unless it runs; its DiT config."""
        import torch  # noqa: PLC0415

        n, device = self.opts.gpus_per_shot, _device(self.opts.device)
        if device != "cpu" and torch.cuda.device_count() < n:
            raise ConfigError(
                "infinitetalk.gpus_per_shot",
                f"{n} GPUs per shot but {torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES)",
            )
        return RESIDENT.shot_worker_config(self.weights_root(), self.load_spec(device), n, self.vae_tiling)

    # --- per-film caches

    def _model_tag(self, component: str) -> str:
        from model.weights import layout_for  # noqa: PLC0415

        layout = layout_for("infinitetalk-480" if self.tiny else self.opts.mode, self.opts.quant)
        root = self.weights_root()
        path = root / layout.wav2vec_dir if component == "audio" else root / layout.wan_dir / layout.t5
        return _weights_identity(path)

    def prompt_cache_path(self, film_dir: Path) -> Path:
        """Where the film's prompt embedding lives (keyed by both prompts and the umT5 weights)."""
        key = hashlib.sha256(
            "\0".join([self.opts.prompt, self.opts.negative_prompt, self._model_tag("t5")]).encode()
        ).hexdigest()[:16]
        return film_dir / f"prompt-{key}.safetensors"

    def prompt_embeddings(self, film_dir: Path, watch: _Stopwatch) -> dict[str, torch.Tensor]:
        """umT5 context / negative context of the configured prompts, cached per film."""
        from safetensors.torch import load_file  # noqa: PLC0415

        path = self.prompt_cache_path(film_dir)

        def compute() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            self.log.info("encoding the prompt with umT5 (once per film) -> %s", path)
            with watch("encoders"):
                t5 = self.models("t5")["t5"]
                context, context_null = t5.encode([self.opts.prompt, self.opts.negative_prompt])
            return {"context": context, "context_null": context_null}, {"prompt": self.opts.prompt}

        return load_file(str(cached_tensors(path, compute)))

    def audio_features_file(self, film_dir: Path, dialogue_path: Path, watch: _Stopwatch) -> Path:
        """The dub track's wav2vec2 features at 25 fps for the whole film (cached per film)."""

        spec = self.load_spec(_device(self.opts.device))
        dtype = str(spec.dtype).removeprefix("torch.")
        key = hashlib.sha256(
            "\0".join([audio_digest(dialogue_path), self._model_tag("audio"), dtype]).encode()
        ).hexdigest()[:16]
        path = film_dir / f"audio_features-{key}.safetensors"

        def compute() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
            import soundfile as sf  # noqa: PLC0415

            from model.wav2vec import frame_count, loudness_normalize  # noqa: PLC0415

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
        """Gate the shot: speech in its dub slice, a face in its (sampled) frames, the policy."""
        self._bind(context.config)

        def frames_fn(indices: list[int]) -> dict[int, np.ndarray]:
            wanted, out = set(indices), {}
            for j, frame in enumerate(iter_frames(context.video, plan.start_frame, plan.end_frame)):
                if j in wanted:
                    out[j] = geometry.to_display(frame)
            return out

        d = decide_shot(
            plan.shot_index,
            shot_audio,
            sample_rate,
            plan.num_frames,
            frames_fn,
            self.config.gate,
            self.region_cfg,
        )
        if d.dub and self.tiny:
            d = ShotDecision(d.dub, f"{TINY_BANNER}; {d.reason}", d.details)
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
    ) -> _Session:
        if context is None:
            raise ValueError("InfiniteTalkBackend.open_shot needs the ShotContext (tasks.render passes it)")
        self._bind(context.config)
        check_plan_agreement(plan)
        if decision is None:
            decision = self.prepare_shot(plan, geometry, shot_audio, sample_rate, context)
        return _Session(self, plan, geometry, decision, context, resume_state)


class _Session:
    """One shot being dubbed: the sampler state between chunks and the region mapping."""

    def __init__(
        self,
        backend: InfiniteTalkBackend,
        plan: ShotPlan,
        geometry: ModelGeometry,
        decision: ShotDecision,
        context: ShotContext,
        resume_state: Any | None,
    ):
        import torch  # noqa: PLC0415
        from safetensors import safe_open  # noqa: PLC0415

        from model.sampler import StreamState, sampler_preset, speaker_masks  # noqa: PLC0415

        self.backend, self.plan, self.context = backend, plan, context
        self.log = backend.log
        opts = backend.opts
        self.device = _device(opts.device)
        self.watch = _Stopwatch(self.device, opts.profile)
        film_dir = context.work_dir / "film"

        # 1. per-film inputs (cached files), then the generation models
        prompt = backend.prompt_embeddings(film_dir, self.watch)
        features_path = backend.audio_features_file(film_dir, Path(context.dialogue.path), self.watch)
        self.sp_size = opts.gpus_per_shot
        with self.watch("load"):
            if self.sp_size > 1:  # the ranks hold the generation models; this process keeps none
                dcfg = backend.shot_worker_config()
                self.chunk_models = None
                host = "cpu"
            else:
                m = backend.models("dit", "vae", "clip")
                self.dit, self.vae, self.clip = m["dit"], m["vae"], m["clip"]
                dcfg = self.dit.config
                self.chunk_models = ChunkModels(
                    _TimedDiT(self.dit, self.watch),
                    _TimedVAE(_TiledVAE(self.vae, backend.vae_tiling, self.log), self.watch),
                    self._clip,
                    self._color,
                    self.device,
                )
                host = self.device
        if prompt["context"].shape[-1] != dcfg.text_dim:
            raise MediaError(
                film_dir,
                f"prompt embedding width {prompt['context'].shape[-1]} != DiT text_dim {dcfg.text_dim}",
            )
        with safe_open(str(features_path), framework="pt") as f:
            timeline = FeatureTimeline.from_metadata(f.metadata())
            offset, stop = shot_feature_range(plan, timeline)
            feats = f.get_slice("features")[offset:stop]  # (L, 12, 768)
        if tuple(feats.shape[1:]) != (dcfg.audio_blocks, dcfg.audio_channels):
            raise MediaError(
                features_path, f"features {tuple(feats.shape)} do not fit the DiT's audio adapter"
            )
        self.feature_offset = offset

        # 2. where the model looks: the region plan's box (or the full frame) at the model's size
        region = decision.details.get("region")
        rplan = RegionPlan.from_dict(region) if region else None
        if rplan is not None and rplan.mode == "full":
            bucket = geometry.model_hw
        else:
            bucket = rplan.bucket if rplan is not None else geometry.model_hw
        model_hw = tiny_hw(bucket) if backend.tiny else bucket
        self.region = ShotRegion(geometry, rplan, model_hw, backend.config.region.feather_px)
        self.coded_hw = geometry.coded_hw

        # 3. sampler settings (chunking = the shot plan's) and conditioning
        preset = "tiny" if backend.tiny else opts.mode
        changes: dict[str, Any] = {
            "frame_num": plan.frame_num,
            "motion_frames": plan.motion_frames,
            "text_guide_scale": opts.text_guide_scale,
            "audio_guide_scale": opts.audio_guide_scale,
            "use_apg": opts.use_apg,
            "apg_momentum": opts.apg_momentum,
            "apg_norm_threshold": opts.apg_norm_threshold,
            "color_correction_strength": backend.config.color.strength,
            "color_reference": "first" if backend.config.color.reference == "shot_first" else "chunk",
            "denoise_strength": opts.denoise_strength,
            "seed": opts.seed + plan.shot_index,
            "batch_branches": opts.batch_branches,
        }
        if opts.steps is not None:
            changes["sampling_steps"] = opts.steps
        if opts.shift is not None:
            changes["shift"] = opts.shift
        self.settings = sampler_preset(preset, **changes)
        mh, mw = model_hw
        text_len = dcfg.text_len
        self.job = ChunkJob(  # per-chunk fields (reference, source, state) are filled by dub_chunk
            settings=self.settings,
            context=prompt["context"][:text_len].to(host),
            context_null=prompt["context_null"][:text_len].to(host),
            audio=feats,
            masks=speaker_masks(None, 1, model_hw, model_hw, (mh // 8, mw // 8)),  # one speaker: all ones
            n_frames=plan.model_frames,
            reference=torch.empty(0),
            source=None,
            state=None,
            teacache=opts.teacache,
            teacache_preset="infinitetalk-720" if opts.mode == "infinitetalk-720" else "infinitetalk-480",
        )
        self._source_cache: dict[int, np.ndarray] = {}
        if resume_state is None:
            self.stream_state = None
        else:
            if resume_state.get("format") != STATE_FORMAT:
                raise MediaError(context.video.path, f"shot {plan.shot_index}: unknown checkpoint format")
            self.stream_state = StreamState.from_state_dict(resume_state["stream"])
        self.log.info(
            "shot %04d: %d chunk(s) at %dx%d, %d steps, feature offset %d%s",
            plan.shot_index, len(plan.chunks), mw, mh, self.settings.sampling_steps, offset,
            "" if self.stream_state is None else f", resuming at chunk {self.stream_state.next_chunk + 1}",
        )  # fmt: skip

    # --- sampler callbacks

    def _clip(self, reference: torch.Tensor) -> torch.Tensor:
        with self.watch("clip"):
            return self.clip.encode(reference)  # (1, 257, 1280)

    def _color(self, video: torch.Tensor, reference: torch.Tensor, strength: float) -> torch.Tensor:
        from tasks.color import match_and_blend  # noqa: PLC0415

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
        return _to_tensor(np.stack([self._source_cache[j] for j in js]))

    # --- ShotSession

    def dub_chunk(self, inp: ChunkInput) -> np.ndarray:
        from model.sampler import StreamState  # noqa: PLC0415

        c = inp.chunk
        expected = 0 if self.stream_state is None else self.stream_state.next_chunk
        if c.index != expected:
            raise RuntimeError(
                f"shot {self.plan.shot_index}: chunk {c.index} given, the sampler is at {expected}"
            )
        self.log.info(
            "shot %04d: generating chunk %d/%d", self.plan.shot_index, c.index + 1, len(self.plan.chunks)
        )
        reference = _to_tensor(self._crop(inp.reference, c.ref_frame)[None])  # (3, 1, H, W)
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
            kept = _to_uint8(out.frames)  # (n_kept, H, W, 3): model frames [new_start, new_end)
        else:  # on the ShotWorker's ranks; only rank 0's frames and state come back
            with self.watch("sp_chunk"):
                got = RESIDENT.run_chunk(job)
            index, state, kept = got["index"], StreamState.from_state_dict(got["state"]), got["frames"]
        if index != c.index:
            raise RuntimeError(f"shot {self.plan.shot_index}: sampler ran chunk {index}, expected {c.index}")
        self.stream_state = state
        first_kept = c.new_start - c.model_start
        if inp.frames.shape[0] == 0:
            return np.zeros((0, *self.coded_hw, 3), np.uint8)
        with self.watch("composite"):
            frames = []
            for t, k in enumerate(self.plan.conform_indices(c)):
                j = c.src_start + t
                frame = self.region.paste(kept[k - first_kept], inp.frames[t], j)
                if self.backend.tiny:
                    frame = label_tiny(frame, self.region.coded_box(j))
                frames.append(frame)
        return np.stack(frames)

    def state(self) -> dict[str, Any] | None:
        if self.stream_state is None:
            return None
        return {"format": STATE_FORMAT, "stream": self.stream_state.state_dict()}

    def timings(self) -> dict[str, float]:
        return dict(self.watch.totals)

    def close(self) -> None:
        self._source_cache.clear()
