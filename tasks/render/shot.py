"""The per-shot unit: decode a shot, run the backend chunk by chunk, colour-correct, write it losslessly.

`render_shot(job)` takes a `ShotJob` (small serialisable records: paths and dicts, no tensors) so
an orchestrator can ship it to any worker. Per chunk it writes a lossless FFV1 segment plus the
backend's state (`tasks.render.chunk_checkpoints`: data-only safetensors, hash-checked; never a pickle); a
restarted shot skips the chunks verifiably written and recomputes any damaged one. At the end the
segments are joined (stream copy) into the shot's intermediate, atomically, and its frame count and
hash are recorded (`"file"`) so every later use can verify it.

`render_shot_result(job)` does the same and returns a JSON-ready `ShotResult` dict for the flow:
`{"index", "path", "dubbed", "reason", "chunks", "chunks_resumed", "backend", "tiny", "timings_s",
"qc", "file"}`. With a gating backend (`prepare_shot`) the shot's dub decision is taken first and kept next
to the chunk checkpoints; a shot the gate skips is copied through untouched (no model call). Every
dubbed shot gets QC artefacts (`qc.enabled`): a side-by-side preview and a contact sheet under
`<work dir>/qc/`, written at the end of the render or, with `qc=False`, later by `write_job_qc` (a group
writes them behind the next shot's render, off the GPU's path); the decision they draw is kept beside the
intermediate (`tasks.render.shot_qc`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.config.pipeline import PipelineConfig
from tasks.decision.record import ShotDecision
from tasks.decision.shot_decision import switch_frames
from tasks.errors import DecodeError, MediaError
from tasks.files import atomic_path
from tasks.media import ffmpeg
from tasks.media.audio import DialogueTrack, read_samples
from tasks.media.frames import (
    FrameCursor,
    LosslessWriter,
    NativeFrames,
    intermediate_format,
    iter_frames,
    iter_native,
    read_frames,
    write_rendered,
)
from tasks.media.intermediates import clean_temps, read_marker, record_written, write_marker
from tasks.media.probe import VideoInfo
from tasks.picture.color import match_and_blend
from tasks.picture.geometry import ModelGeometry
from tasks.render.backend import ChunkInput, ShotContext, get_backend
from tasks.render.chunk_checkpoints import ChunkCheckpoints
from tasks.render.overlap import dub_chunk_deferred, run_chunks
from tasks.render.shot_qc import decision_path, kept_decision, write_shot_qc
from tasks.timeline.plan import ShotPlan, split_at

log = logging.getLogger(__name__)

PREVIEW_LABEL = "PREVIEW PASS - NOT THE FINAL DUB"  # QC banner and output metadata of a preview run


@dataclass(frozen=True)
class ShotJob:
    """Everything one shot's render needs."""

    video: dict[str, Any]  # VideoInfo.to_dict()
    plan: dict[str, Any]  # ShotPlan.to_dict()
    dialogue: dict[str, Any]  # DialogueTrack.to_dict()
    audio_range: tuple[int, int]  # the shot's samples in the dialogue track
    out_path: str  # the shot's lossless intermediate (.mkv)
    config: dict[str, Any]  # PipelineConfig.to_dict()
    work_dir: str | None = None  # the run's work dir (per-film caches, QC); None: see `run_dir`
    stems: dict[str, str] = field(
        default_factory=dict
    )  # character name -> its checked stem wav (tasks.decision.cast)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShotJob:
        d = dict(d)
        d["audio_range"] = tuple(d["audio_range"])
        return cls(**d)


def color_correct(frames: np.ndarray, reference: np.ndarray, strength: float) -> np.ndarray:
    """uint8 (T, H, W, 3) frames matched to a uint8 (H, W, 3) reference with `match_and_blend`."""
    if strength == 0.0 or frames.shape[0] == 0:
        return frames
    video = torch.from_numpy(np.array(frames)).permute(3, 0, 1, 2).float() / 127.5 - 1.0  # (3,T,H,W)
    ref = torch.from_numpy(np.array(reference)).permute(2, 0, 1).float() / 127.5 - 1.0  # (3,H,W)
    out = match_and_blend(video, ref, strength)
    return ((out + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 3, 0).numpy()


def chunk_audio(shot_audio: np.ndarray, sample_rate: int, plan: ShotPlan, chunk_index: int) -> np.ndarray:
    """The shot audio under the chunk's model window [model_start, model_end) / model_fps, zero-padded."""
    c = plan.chunks[chunk_index]
    a = (c.model_start * sample_rate * 2 + plan.model_fps) // (2 * plan.model_fps)
    b = (c.model_end * sample_rate * 2 + plan.model_fps) // (2 * plan.model_fps)
    out = np.zeros((b - a, shot_audio.shape[1]), np.float32)
    have = shot_audio[a:b]
    out[: have.shape[0]] = have
    return out


def _concat_copy(segments: list[Path], out: Path, workdir: Path) -> None:
    """Join FFV1 segments by stream copy into `out` (atomic)."""
    if len(segments) == 1:
        with atomic_path(out) as tmp:
            shutil.copyfile(segments[0], tmp)
        return
    listing = workdir / "concat.txt"
    listing.write_text("ffconcat version 1.0\n" + "".join(f"file {_quote(p)}\n" for p in segments))
    with atomic_path(out) as tmp:
        ffmpeg.run(
            ["-v", "error", "-y", "-f", "concat", "-safe", "0", "-i", str(listing), "-c", "copy"]
            + ["-f", "matroska", str(tmp)],
            path=out,
            what="joining chunk segments",
        )


def _quote(p: Path) -> str:
    return "'" + str(p.resolve()).replace("'", "'\\''") + "'"


class _Timer:
    """Wall-clock seconds per named stage of one shot."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] += time.perf_counter() - t0

    def add(self, other: dict[str, float]) -> None:
        for k, v in other.items():
            self.totals[k] += v

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.totals.items()}


def run_dir(out: Path) -> Path:
    """The run's work dir for a shot written to `out` when the job does not name one: the nearest
    folder above it holding a run-workspace manifest (`workspace.json`), else `out`'s own folder."""
    for parent in list(out.parents)[:4]:
        if (parent / "workspace.json").is_file():
            return parent
    return out.parent


def _copy_through(info: VideoInfo, plan: ShotPlan, out: Path) -> None:
    """Write the shot's decoded source frames unchanged into its lossless intermediate (in the source's
    own pixel format where it is planar Y'CbCr: the decoded values bit for bit)."""
    fmt = intermediate_format(info)
    with LosslessWriter(out, (info.height, info.width), info.fps, **fmt) as w:
        native = fmt["pix_fmt"] != "gbrp"
        for frame in (iter_native if native else iter_frames)(info, plan.start_frame, plan.end_frame):
            w.write(frame)


def write_job_qc(job: ShotJob | dict[str, Any]) -> dict[str, Any]:
    """The QC artefacts of a rendered shot (`write_shot_qc`) from its job alone, after the render:
    the source, the job's intermediate, its dub slice and its kept decision."""
    job = ShotJob.from_dict(job) if isinstance(job, dict) else job
    cfg = PipelineConfig.from_dict(job.config)
    info, plan = VideoInfo.from_dict(job.video), ShotPlan.from_dict(job.plan)
    track = DialogueTrack.from_dict(job.dialogue)
    context = _context(job, info, track, cfg)
    title = PREVIEW_LABEL if cfg.workspace.preview else None
    return write_shot_qc(
        info, plan, Path(job.out_path), context.work_dir / "qc", read_samples(track, *job.audio_range),
        track.sample_rate, cfg.qc.height, title=title, decision=kept_decision(Path(job.out_path)),
        lip_min_fit=cfg.qc.lip_min_fit,
    )  # fmt: skip


def _context(job: ShotJob, info: VideoInfo, track: DialogueTrack, cfg: PipelineConfig) -> ShotContext:
    """The film-level facts a gating backend sees for this shot (its run workspace, its stems)."""
    work_dir = Path(job.work_dir) if job.work_dir else run_dir(Path(job.out_path))
    stems = {name: Path(p) for name, p in job.stems.items()}
    return ShotContext(work_dir, info, track, tuple(job.audio_range), cfg, stems)


def _decision(
    backend: Any, plan: ShotPlan, geometry: ModelGeometry, shot_audio: np.ndarray, context: ShotContext,
    seg_dir: Path,
) -> ShotDecision | None:  # fmt: skip
    """The shot's dub decision with a gating backend (None without one): the one kept next to the chunk
    checkpoints (`decision.json`, e.g. written ahead by `prepare_decision`), else the gate's, then kept."""
    if not callable(getattr(backend, "prepare_shot", None)):
        return None
    decision_file = seg_dir / "decision.json"
    kept = read_marker(decision_file)  # unreadable: logged, the gate runs again
    if kept is not None:
        return ShotDecision.from_dict(kept)
    sr = context.dialogue.sample_rate
    decision = backend.prepare_shot(plan, geometry, shot_audio, sr, context)
    write_marker(decision_file, decision.to_dict())
    return decision


def prepare_decision(job: ShotJob | dict[str, Any], backend: Any | None = None) -> ShotDecision | None:
    """A shot's CPU preparation ahead of its render (the next shot's, while the current one generates):
    its dub decision (speech, face analysis when needed, region plan) is taken and kept where
    `render_shot_result` looks for it, which then reads it instead of gating again. Same decision as the
    render's own, so nothing in the output changes. `backend`: a gating backend of the shot's config,
    not the one rendering now (the gate binds its backend to the shot's config)."""
    job = ShotJob.from_dict(job) if isinstance(job, dict) else job
    cfg = PipelineConfig.from_dict(job.config)
    info, plan = VideoInfo.from_dict(job.video), ShotPlan.from_dict(job.plan)
    track = DialogueTrack.from_dict(job.dialogue)
    out = Path(job.out_path)
    backend = backend or get_backend(cfg.backend.name, cfg.backend.options, config=cfg)
    seg_dir = out.with_name(out.stem + ".chunks")
    seg_dir.mkdir(parents=True, exist_ok=True)
    context = _context(job, info, track, cfg)
    geometry = ModelGeometry.for_video(info, cfg.frames.bucket)
    shot_audio = read_samples(track, *job.audio_range)  # (S, C) float32
    return _decision(backend, plan, geometry, shot_audio, context, seg_dir)


def render_shot(
    job: ShotJob | dict[str, Any],
    *,
    on_progress: Callable[[float], None] | None = None,
    backend: Any | None = None,
) -> str:
    """Render one shot to its lossless intermediate; return its path (see `render_shot_result`)."""
    return render_shot_result(job, on_progress=on_progress, backend=backend)["path"]


def render_shot_result(
    job: ShotJob | dict[str, Any],
    *,
    on_progress: Callable[[float], None] | None = None,
    backend: Any | None = None,
    qc: bool = True,
) -> dict[str, Any]:
    """Render one shot to its lossless intermediate; return its JSON-ready `ShotResult` dict.

    `on_progress(fraction)` is called after every chunk (0 < fraction <= 1). `backend` overrides
    the configured one (an already-built Backend instance, e.g. with a loaded model). `qc=False` leaves
    the QC artefacts to `write_job_qc` (the result's "qc" stays None).
    """
    t_start = time.perf_counter()
    timer = _Timer()
    job = ShotJob.from_dict(job) if isinstance(job, dict) else job
    cfg = PipelineConfig.from_dict(job.config)
    info = VideoInfo.from_dict(job.video)
    plan = ShotPlan.from_dict(job.plan)
    track = DialogueTrack.from_dict(job.dialogue)
    out = Path(job.out_path)
    backend = backend or get_backend(cfg.backend.name, cfg.backend.options, config=cfg)
    geometry = ModelGeometry.for_video(info, cfg.frames.bucket)
    a0, a1 = job.audio_range
    shot_audio = read_samples(track, a0, a1)  # (S, C) float32

    seg_dir = out.with_name(out.stem + ".chunks")
    seg_dir.mkdir(parents=True, exist_ok=True)
    clean_temps(out.parent, out.stem)  # a crashed earlier attempt's half-written intermediate

    # 1. the dub decision (gating backends), taken once and kept with the checkpoints
    context = _context(job, info, track, cfg)
    gating = callable(getattr(backend, "prepare_shot", None))
    with timer("gate") if gating else nullcontext():
        decision = _decision(backend, plan, geometry, shot_audio, context, seg_dir)
    if decision is not None:
        plan = split_at(plan, switch_frames(decision))  # a speaker switch: one sampler run per part
    result = _result_head(plan, out, backend, decision)
    if decision is not None and not decision.dub:
        _copy_through_shot(result, info, plan, out, seg_dir, timer, on_progress)
        timer.totals["total"] = time.perf_counter() - t_start
        result["timings_s"] = timer.rounded()
        return result

    # 2. resume after the last chunk verifiably done (segment + state checked against its marker)
    checkpoints = ChunkCheckpoints(seg_dir, len(plan.chunks))
    segments = [checkpoints.segment(c.index) for c in plan.chunks]
    first, resume_state = checkpoints.resume()
    result["chunks_resumed"] = first
    if first:
        log.info("shot %04d: resuming at chunk %d/%d", plan.shot_index, first + 1, len(plan.chunks))

    # 3. the chunks: decode ahead, the backend, composite + encode + checkpoint behind (`run_chunks`)
    todo = plan.chunks[first:]
    if todo:
        shot_first = cfg.color.reference == "shot_first"
        start = min(min(c.ref_frame, c.src_start) for c in todo)
        lookback = max(c.src_end - min(c.ref_frame, c.src_start) for c in todo) + 1
        cursor = FrameCursor(info, plan.start_frame + start, plan.end_frame, lookback=lookback)
        native = (
            NativeFrames(info, plan.end_frame) if intermediate_format(info)["pix_fmt"] != "gbrp" else None
        )
        with timer("decode"):
            first_frame = (
                read_frames(info, [plan.start_frame])[plan.start_frame] if shot_first and start > 0 else None
            )
        extra = {"decision": decision, "context": context} if decision is not None else {}
        with timer("open"):
            session = backend.open_shot(
                plan, geometry, shot_audio, track.sample_rate, resume_state=resume_state, **extra
            )
        io = _ChunkIO(
            info, plan, cfg, backend, session, cursor, shot_audio, track.sample_rate, segments, checkpoints,
            timer, first_frame, native,
        )  # fmt: skip
        try:
            waits = run_chunks(
                todo,
                io.read,
                io.generate,
                io.write,
                depth=cfg.pipeline.queue,
                overlap=cfg.pipeline.overlap,
                on_done=on_progress and (lambda c: on_progress((c.index + 1) / len(plan.chunks))),
            )
            timer.add(waits)
        finally:
            session.close()
            cursor.close()
            if native is not None:
                native.close()
        session_timings = getattr(session, "timings", None)
        if callable(session_timings):
            timer.add(session_timings())
    elif on_progress:
        on_progress(1.0)

    # 4. join, QC
    written = [s for c, s in zip(plan.chunks, segments, strict=True) if c.src_end > c.src_start]
    if not written:
        raise DecodeError(info.path, f"shot {plan.shot_index} produced no frames")
    with timer("join"):
        _concat_copy(written, out, seg_dir)
        result["file"] = record_written(out, plan.num_frames)  # verified on every reuse (done marker)
    if decision is not None:  # what QC draws, also when it is written later (`write_job_qc`)
        write_marker(decision_path(out), decision.to_dict())
    shutil.rmtree(seg_dir, ignore_errors=True)
    if result["dubbed"] and cfg.qc.enabled and qc:
        with timer("qc"):
            result["qc"] = write_job_qc(job)  # the same QC a group writes behind the next render
    timer.totals["total"] = time.perf_counter() - t_start
    result["timings_s"] = timer.rounded()
    log.info("shot %04d: %d frames -> %s (%s)", plan.shot_index, plan.num_frames, out, result["reason"])
    return result


def _result_head(plan: ShotPlan, out: Path, backend: Any, decision: ShotDecision | None) -> dict[str, Any]:
    """The `ShotResult` fields known before any chunk: whether and why the shot is dubbed."""
    if decision is not None:
        dubbed, reason = decision.dub, decision.reason
    elif bool(getattr(backend, "dubs", True)):
        dubbed, reason = True, f"backend {backend.name}"
    else:
        dubbed, reason = False, f"{backend.name} backend: dry run, not dubbed"
    return {
        "index": plan.shot_index,
        "path": str(out),
        "dubbed": dubbed,
        "reason": reason,
        "chunks": len(plan.chunks),
        "chunks_resumed": 0,
        "backend": backend.name,
        "tiny": bool(getattr(backend, "tiny", False)),
        "timings_s": {},
        "qc": None,
        "file": None,  # the intermediate's record (size, sha256, frames): checked before any reuse
    }


def _copy_through_shot(
    result: dict[str, Any], info: VideoInfo, plan: ShotPlan, out: Path, seg_dir: Path, timer: _Timer,
    on_progress: Callable[[float], None] | None,
) -> None:  # fmt: skip
    """A shot the gate does not dub: its source frames copied into the intermediate (no model call)."""
    log.info(
        "shot %04d: not dubbed (%s): copying %d frames", plan.shot_index, result["reason"], plan.num_frames
    )
    with timer("copy"):
        _copy_through(info, plan, out)
        result["file"] = record_written(out, plan.num_frames)
    shutil.rmtree(seg_dir, ignore_errors=True)
    if on_progress:
        on_progress(1.0)
    result["chunks"] = 0


@dataclass
class _ChunkIO:
    """The chunk loop's three stages over one shot (`tasks.render.overlap.run_chunks`): `read` decodes a
    chunk's frames ahead (reader thread), `generate` runs the backend (the caller's thread: the GPU),
    `write` composites, colour-corrects, encodes and checkpoints behind it (writer thread)."""

    info: VideoInfo
    plan: ShotPlan
    cfg: PipelineConfig
    backend: Any
    session: Any
    cursor: FrameCursor
    shot_audio: np.ndarray  # (S, C) float32
    sample_rate: int
    segments: list[Path]
    checkpoints: ChunkCheckpoints
    timer: _Timer
    first_frame: np.ndarray | None  # the shot's first frame (colour reference `shot_first`), read on demand
    native: NativeFrames | None  # the source's own decoded samples (planar Y'CbCr intermediates), else None

    def read(self, c: Any) -> tuple[ChunkInput, np.ndarray]:
        """The chunk's input (frames, reference, audio window) and its colour reference."""
        s0, shot_first = self.plan.start_frame, self.cfg.color.reference == "shot_first"
        with self.timer("decode"):
            frames = self.cursor.range(s0 + c.src_start, s0 + c.src_end)  # (T, H, W, 3)
            ref = self.cursor.get(s0 + c.ref_frame)
            if shot_first and self.first_frame is None:
                self.first_frame = self.cursor.get(s0)
        color_ref = self.first_frame if shot_first else ref
        window = chunk_audio(self.shot_audio, self.sample_rate, self.plan, c.index)
        return ChunkInput(c, frames, ref, window, self.sample_rate), color_ref

    def generate(self, c: Any, got: tuple[ChunkInput, np.ndarray]) -> tuple[Any, np.ndarray, Any, np.ndarray]:
        inp, color_ref = got
        with self.timer("backend"):
            finish = dub_chunk_deferred(self.session, inp)
        # the state after this chunk (for its checkpoint) and the source frames (what stays unchanged)
        return finish, color_ref, self.session.state(), inp.frames

    def write(self, c: Any, product: tuple[Any, np.ndarray, Any, np.ndarray]) -> None:
        finish, color_ref, st, source_rgb = product
        info = self.info
        with self.timer("composite"):
            chunk_out = finish()
        n_out = c.src_end - c.src_start
        if chunk_out.shape != (n_out, info.height, info.width, 3) or chunk_out.dtype != np.uint8:
            raise MediaError(
                info.path,
                f"backend {self.backend.name} returned {chunk_out.shape} {chunk_out.dtype} for chunk {c.index} "
                f"of shot {self.plan.shot_index}, expected {(n_out, info.height, info.width, 3)} uint8",
            )
        if not self.backend.applies_color:
            with self.timer("colour"):
                chunk_out = color_correct(chunk_out, color_ref, self.cfg.color.strength)
        with self.timer("encode"):
            if n_out:  # only what the backend changed; the rest stays the source's decoded values
                s0 = self.plan.start_frame
                write_rendered(
                    self.segments[c.index], info, chunk_out, source_rgb, self.native, s0 + c.src_start
                )
            self.checkpoints.commit(c.index, n_out, st)  # verified, then marked done
