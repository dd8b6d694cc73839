"""`dub-film`: probe -> shots -> dialogue audio -> chunk plans -> one task per shot -> assemble.

The flow only orchestrates: every media step is a function in `tasks/`, wrapped here as a Prefect
task taking and returning small serialisable records (paths and dicts). The per-shot unit,
`dub_shot`, takes a `ShotJob` dict, so a deployment can ship it to a GPU worker unchanged.

`run_pipeline` is the orchestration itself, written against a tiny runner interface so the same
sequence runs as a Prefect flow (`dub_film`, task runs visible in the UI) or inline without any
Prefect server (`dubflow dub --no-prefect`, and fast tests).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from tasks.assemble import AudioSource, assemble, check_output_path
from tasks.audio import DialogueTrack, check_mix, prepare_dialogue, slice_bounds
from tasks.backend import BACKENDS
from tasks.config import PipelineConfig, load_config
from tasks.errors import ConfigError, DubflowError
from tasks.plan import ShotPlan, plan_film
from tasks.probe import VideoInfo, probe
from tasks.render import ShotJob, render_shot
from tasks.shots import ShotList, detect_shots

log = logging.getLogger(__name__)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "film"


def _timecode(seconds: float) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}.{ms:03d}"


def _logger() -> logging.Logger | logging.LoggerAdapter:
    from prefect.context import FlowRunContext, TaskRunContext

    if TaskRunContext.get() is None and FlowRunContext.get() is None:  # inline mode
        return log
    return get_run_logger()


def work_dir(source: str, audio: str, config: PipelineConfig) -> Path:
    """Per-film work dir under `workspace.root`, keyed by the inputs' identity and the config."""
    key = hashlib.sha256()
    for p in (source, audio):
        st = Path(p).stat()
        key.update(f"{Path(p).resolve()}|{st.st_size}|{st.st_mtime_ns}|".encode())
    key.update(config.digest().encode())
    return Path(config.workspace.root) / f"{_slug(Path(source).stem)}-{key.hexdigest()[:12]}"


# ------------------------------------------------------------------------------------------ tasks


@task(task_run_name="probe {name}")
def probe_source(source: str, config: dict[str, Any], name: str = "") -> dict[str, Any]:
    """Probe the source video (exact frame count and rate, rotation, SAR, audio streams)."""
    cfg = PipelineConfig.from_dict(config)
    info = probe(source, frame_count=cfg.probe.frame_count)
    _logger().info(
        "%s: %d frames at %s fps (%s%s), %dx%d SAR %s rotation %d",
        source, info.frame_count, info.fps, info.codec, ", VFR" if info.vfr else "",
        info.width, info.height, info.sar, info.rotation,
    )  # fmt: skip
    return info.to_dict()


@task(task_run_name="shots {name}")
def find_shots(video: dict[str, Any], config: dict[str, Any], name: str = "") -> dict[str, Any]:
    """Frame-exact shot partition of the whole video."""
    cfg = PipelineConfig.from_dict(config)
    shots = detect_shots(VideoInfo.from_dict(video), cfg.shots)
    _logger().info("%d shot(s): cuts at %s", len(shots.shots), [s.start_frame for s in shots.shots[1:]])
    return shots.to_dict()


@task(task_run_name="audio {name}")
def load_dialogue(
    audio: str, frame_count: int, fps: str, config: dict[str, Any], out_wav: str, name: str = ""
) -> dict[str, Any]:
    """Decode and length-check the dubbed dialogue track into the work dir."""
    from fractions import Fraction

    cfg = PipelineConfig.from_dict(config)
    track = prepare_dialogue(
        audio, frame_count=frame_count, fps=Fraction(fps), cfg=cfg.audio, out_wav=out_wav
    )
    return track.to_dict()


@task(task_run_name="mix {name}")
def check_final_mix(mix: str, frame_count: int, fps: str, config: dict[str, Any], name: str = "") -> str:
    """Length-check the final mix; returns the action ('ok', 'pad' or 'trim')."""
    from fractions import Fraction

    cfg = PipelineConfig.from_dict(config)
    return check_mix(mix, frame_count=frame_count, fps=Fraction(fps), policy=cfg.audio.length_policy).action


@task(task_run_name="plan {name}")
def plan_shots(shots: dict[str, Any], config: dict[str, Any], name: str = "") -> list[dict[str, Any]]:
    """Chunk plan (25 fps timeline, sliding reference frames) of every shot."""
    cfg = PipelineConfig.from_dict(config)
    sl = ShotList.from_dict(shots)
    return [p.to_dict() for p in plan_film(sl.shots, sl.fps, cfg.plan)]


def _progress_reporter(index: int, span: str) -> Callable[[float], None] | None:
    from prefect.context import TaskRunContext

    if TaskRunContext.get() is None:  # inline mode: no API to report to
        return None
    try:
        art = create_progress_artifact(0.0, key=f"shot-{index:04d}", description=f"shot {index:04d} {span}")
    except Exception as ex:  # telemetry must never fail a shot
        log.warning("cannot create a progress artifact: %s", ex)
        return None

    def report(fraction: float) -> None:
        try:
            update_progress_artifact(artifact_id=art, progress=round(100.0 * fraction, 2))
        except Exception as ex:  # telemetry must never fail a shot
            log.warning("progress update failed: %s", ex)

    return report


@task(task_run_name="shot-{index:04d} {span}")
def dub_shot(index: int, span: str, job: dict[str, Any]) -> str:
    """The per-shot unit: render one shot (all its chunks) to its lossless intermediate."""
    logger = _logger()
    if job["config"]["backend"]["name"] == "passthrough" and logger is not log:  # inline: the backend logs it
        logger.warning("DRY RUN: passthrough backend, shot %04d is copied through, NOT dubbed", index)
    plan = job["plan"]
    logger.info(
        "shot %04d: %d frames, %d chunk(s)",
        index,
        plan["end_frame"] - plan["start_frame"],
        len(plan["chunks"]),
    )
    return render_shot(job, on_progress=_progress_reporter(index, span))


@task(task_run_name="assemble {name}")
def assemble_film(
    video: dict[str, Any],
    shot_paths: list[str],
    out: str,
    audio_path: str,
    pad_audio: bool,
    config: dict[str, Any],
    workdir: str,
    name: str = "",
) -> str:
    """Join the shots, encode once, mux the dubbed audio, write `out` atomically."""
    cfg = PipelineConfig.from_dict(config)
    return assemble(
        VideoInfo.from_dict(video),
        shot_paths,
        out,
        cfg.encode,
        audio=AudioSource(audio_path, pad_audio),
        workdir=workdir,
    )


# ----------------------------------------------------------------------------------- orchestration


class PrefectRunner:
    """Runs steps as Prefect task runs; shots are submitted together and all awaited."""

    def call(self, t: Any, *args: Any, **kwargs: Any) -> Any:
        return t(*args, **kwargs)

    def map_shots(self, t: Any, calls: list[dict[str, Any]]) -> list[tuple[str | None, BaseException | None]]:
        futures = [t.submit(**kw) for kw in calls]
        wait(futures)  # always wait for every shot: one failure must not cancel the others
        out = []
        for f in futures:
            if f.state.is_completed():
                out.append((f.result(), None))
            else:
                err = f.state.result(raise_on_failure=False)
                out.append(
                    (None, err if isinstance(err, BaseException) else RuntimeError(str(f.state.message)))
                )
        return out


class InlineRunner:
    """Runs the same steps as plain function calls (no Prefect API needed)."""

    def call(self, t: Any, *args: Any, **kwargs: Any) -> Any:
        return t.fn(*args, **kwargs)

    def map_shots(self, t: Any, calls: list[dict[str, Any]]) -> list[tuple[str | None, BaseException | None]]:
        out: list[tuple[str | None, BaseException | None]] = []
        for kw in calls:
            try:
                out.append((t.fn(**kw), None))
            except Exception as ex:  # keep going: report every failed shot
                out.append((None, ex))
        return out


class ShotsFailed(DubflowError):
    """One or more shots failed; the first failure's message is kept."""


def run_pipeline(
    source: str, audio: str, out: str, mix: str | None, config: dict[str, Any], runner: Any
) -> str:
    """The dub-film sequence (no media math here: every step is a task)."""
    t0 = time.monotonic()
    logger = _logger()
    cfg = PipelineConfig.from_dict(config)
    cfgd = cfg.to_dict()
    check_output_path(out, source, audio, mix)
    if cfg.backend.name not in BACKENDS:
        raise ConfigError(
            "backend.name", f"unknown backend {cfg.backend.name!r} (known: {', '.join(BACKENDS)})"
        )
    name = Path(source).name
    video = runner.call(probe_source, source, cfgd, name=name)
    work = work_dir(source, audio, cfg)
    work.mkdir(parents=True, exist_ok=True)
    shots = runner.call(find_shots, video, cfgd, name=name)
    n, fps = shots["frame_count"], shots["fps"]
    if n != video["frame_count"]:
        video = {**video, "frame_count": n}
    track = runner.call(load_dialogue, audio, n, fps, cfgd, str(work / "dialogue.wav"), name=Path(audio).name)
    mix_action = runner.call(check_final_mix, mix, n, fps, cfgd, name=Path(mix).name) if mix else None
    plans = runner.call(plan_shots, shots, cfgd, name=name)

    dialogue = DialogueTrack.from_dict(track)
    edges = [s["start_frame"] for s in shots["shots"]] + [n]
    from fractions import Fraction

    bounds = slice_bounds(edges, Fraction(fps), dialogue.sample_rate, dialogue.n_samples)
    calls = []
    for s, p, b in zip(shots["shots"], plans, bounds, strict=True):
        job = ShotJob(video, p, track, b, str(work / f"shot_{s['index']:04d}.mkv"), cfgd)
        span = f"{_timecode(s['start_s'])}–{_timecode(s['end_s'])}"
        calls.append({"index": s["index"], "span": span, "job": job.to_dict()})
    logger.info(
        "%s: %d shots, %d chunks, backend %s", name, len(calls),
        sum(len(ShotPlan.from_dict(p).chunks) for p in plans), cfg.backend.name,
    )  # fmt: skip
    results = runner.map_shots(dub_shot, calls)
    failed = [(c["index"], e) for c, (_, e) in zip(calls, results, strict=True) if e is not None]
    if failed:
        first = failed[0][1]
        detail = first.problem if isinstance(first, DubflowError) else f"{type(first).__name__}: {first}"
        where = first.path if isinstance(first, DubflowError) else source
        raise ShotsFailed(
            where, f"{len(failed)} shot(s) failed {[i for i, _ in failed]}; first: {detail}"
        ) from first
    paths = [p for p, _ in results]
    audio_path, pad = (mix, mix_action == "pad") if mix else (audio, dialogue.action == "pad")
    final = runner.call(assemble_film, video, paths, out, audio_path, pad, cfgd, str(work), name=name)
    if not cfg.workspace.keep:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("%s -> %s in %.1f s", source, final, time.monotonic() - t0)
    return final


@flow(name="dub-film", task_runner=ThreadPoolTaskRunner(max_workers=2))
def dub_film(
    source: str, audio: str, out: str, mix: str | None = None, config: dict[str, Any] | None = None
) -> str:
    """Dub `source` with the dialogue track `audio` (and optional final `mix`) into `out`.

    `config` is a (partial) nested config dict applied over `configs/default.yaml`.
    """
    cfg = load_config(updates=config or {})
    return run_pipeline(source, audio, out, mix, cfg.to_dict(), PrefectRunner())


def dub_film_inline(
    source: str, audio: str, out: str, mix: str | None = None, config: dict[str, Any] | None = None
) -> str:
    """The same pipeline without Prefect (plain calls, same tasks)."""
    cfg = load_config(updates=config or {})
    return run_pipeline(source, audio, out, mix, cfg.to_dict(), InlineRunner())
