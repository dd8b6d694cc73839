"""The per-shot unit: the `dub_shot` task (cached on workspace + shot + shot key, named after the shot's
span), `render_one_shot` behind it (done/attempt markers around one `render_shot_result` call), the
group's lazily built backend (`BackendSlot`), fault injection for tests (`debug.fail_shots`), and the
shot's QC (`qc_one_shot`, the `shot_qc` task and its artifact): written after the shot is done, so a
group writes it while its next shot renders instead of with the GPU idle.

Holds nothing about groups, fan-out or the film sequence (`flows/runners.py`, `flows/dub_film.py`) and
no media work of its own (`tasks/render/shot.py` renders).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run

from flows.progress import ShotProgress, artifact_key, shot_run_name
from flows.runtime import describe_place, run_logger, where_am_i
from tasks.config.pipeline import PipelineConfig
from tasks.config.run import DebugConfig
from tasks.errors import DubflowError
from tasks.files import discard
from tasks.media.intermediates import read_marker, write_marker
from tasks.render.backend import Backend, FilmInputs, backend_warm_up, get_backend, planned_shot
from tasks.render.shot import ShotJob, prepare_decision, render_shot_result, write_job_qc
from tasks.run.inputs import InputChanged, check_input
from tasks.run.run_lock import hold_lock
from tasks.run.workspace import SHOT_LOCK, Workspace, log_attempt, mark_shot_done, read_shot_done
from tasks.timeline.shot_key import shot_config

log = logging.getLogger(__name__)

QC_RECORD = "qc.json"  # in the shot's folder: its QC artefacts' paths and what writing them took
INTERMEDIATE = "shot.mkv"  # in the shot's folder: its rendered file
CHUNKS = "shot.chunks"  # in the shot's folder: its chunk checkpoints (`tasks.render.shot`)


class InjectedFault(RuntimeError):
    """The fault `debug.fail_shots` asks for (tests and demos)."""


def failure_reason(exc: BaseException | None, fallback: str = "unknown error") -> str:
    """One-line failure reason for the shot table, e.g. ``RuntimeError: CUDA out of memory``."""
    if exc is None or not isinstance(exc, BaseException):
        return fallback
    text = exc.problem if isinstance(exc, DubflowError) else str(exc)
    return " ".join(f"{type(exc).__name__}: {text}".split())[:500]


class BackendSlot:
    """The group's backend: built on first use (a group of cached shots loads nothing), then reused
    for the group's later shots, so one group process pays one model load. `warm_up` makes that load
    happen before the first shot, warmed at the sizes the group's shots were planned at."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self.load_s: float | None = None
        self._backend: Backend | None = None

    @classmethod
    def for_config(cls, config: dict[str, Any]) -> BackendSlot:
        return cls(PipelineConfig.from_dict(config))

    def get(self) -> Backend:
        if self._backend is None:
            t0 = time.monotonic()
            backend = self.config.backend
            self._backend = get_backend(backend.name, backend.options, config=self.config)
            self.load_s = time.monotonic() - t0
        return self._backend

    def warm_up(self, ws: Workspace, film: dict[str, Any], shots: list[dict[str, Any]]) -> dict[str, Any]:
        """The group's model load before its first shot, for those of `shots` (film records) still to
        render (`tasks.render.backend.backend_warm_up` at their planned model sizes): what it spent, {}
        when nothing was warmed (no planned size, all warm already, or a backend without the hook)."""
        todo = [s for s in shots if read_shot_done(ws, s["index"], s["key"]) is None]
        planned = [planned_shot(film["config"], s) for s in todo]
        if not any(p.model_hw is not None for p in planned):
            return {}
        inputs = FilmInputs(Path(ws.path), Path(film["dialogue"]["path"]))
        return backend_warm_up(self.get(), planned, inputs)


def shot_result(raw: str | dict[str, Any], shot: dict[str, Any], backend: str, seconds: float) -> dict:
    """The renderer's ShotResult dict, with defaults for any field it leaves out (or a bare path)."""
    base = {
        "index": shot["index"],
        "path": None,
        "dubbed": backend != "passthrough",
        "reason": None if backend != "passthrough" else "dry run (passthrough backend)",
        "chunks": shot["chunks"],
        "chunks_resumed": None,
        "backend": backend,
        "tiny": False,
        "timings_s": {"render": round(seconds, 3)},
        "qc": None,
    }
    if isinstance(raw, dict):
        return {**base, **raw}
    return {**base, "path": str(raw)}


def _fault(shot_dir: Path, index: int, debug: DebugConfig) -> Callable[[float], None] | None:
    """`debug.fail_shots`: raise once half of the shot's chunks are checkpointed (optionally only once)."""
    if index not in debug.fail_shots:
        return None
    marker = shot_dir / "injected-fault"
    if debug.fail_once and marker.exists():
        return None

    def check(fraction: float) -> None:
        if fraction >= 0.5:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            raise InjectedFault(f"injected fault (debug.fail_shots) in shot {index:04d} at {fraction:.0%}")

    return check


def shot_job(ws: Workspace, film: dict[str, Any], shot: dict[str, Any]) -> ShotJob:
    """The shot's render job in the workspace (the global config + the shot's own overrides)."""
    config = shot_config(film["config"], shot.get("overrides"))
    return ShotJob(
        film["video"],
        shot["plan"],
        film["dialogue"],
        tuple(shot["audio_range"]),
        str(ws.shot_dir(shot["index"], shot["key"]) / INTERMEDIATE),
        config,
        work_dir=str(ws.path),  # per-film caches and QC previews live in the run workspace
        stems=dict(film.get("stems") or {}),  # character -> checked stem wav (`dubflow dub --stem`)
    )


def prepare_one_shot(
    ws: Workspace, film: dict[str, Any], shot: dict[str, Any], backends: BackendSlot
) -> None:
    """The shot's CPU preparation ahead of its render (`tasks.render.shot.prepare_decision`), unless it is done.
    `backends`: a slot of its own (the gate binds its backend to the shot's config; it loads no model)."""
    if read_shot_done(ws, shot["index"], shot["key"]) is None:
        prepare_decision(shot_job(ws, film, shot), backends.get())


def render_one_shot(
    ws: Workspace,
    film: dict[str, Any],
    shot: dict[str, Any],
    backends: BackendSlot,
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Render one shot into the workspace unless its `done.json` says it is done; its ShotResult.

    Holds the shot's render lock meanwhile: a shot another live process is rendering is not rendered
    twice (`LockBusy`, naming that process). Writes `done.json` last, and one line per attempt to
    `attempts.jsonl`.
    """
    with hold_lock(ws.shot_dir(shot["index"], shot["key"]) / SHOT_LOCK, f"shot {shot['index']:04d}"):
        return _render_unlocked(ws, film, shot, backends, on_progress)


def _render_unlocked(
    ws: Workspace,
    film: dict[str, Any],
    shot: dict[str, Any],
    backends: BackendSlot,
    on_progress: Callable[[float], None] | None,
) -> dict[str, Any]:
    index, key = shot["index"], shot["key"]
    done = read_shot_done(ws, index, key)
    if done is not None:
        return done["result"]
    job = shot_job(ws, film, shot)
    cfg = PipelineConfig.from_dict(job.config)
    hooks = [h for h in (on_progress, _fault(ws.shot_dir(index, key), index, cfg.debug)) if h is not None]
    hooks.append(_progress_line(index))

    def report(fraction: float) -> None:
        for hook in hooks:
            hook(fraction)

    where = where_am_i()
    t0 = time.monotonic()
    try:
        _same_source(film, ws.shot_dir(index, key))  # the file the shot keys were made from ...
        raw = render_shot_result(job, on_progress=report if hooks else None, backend=backends.get(), qc=False)
        _same_source(film, ws.shot_dir(index, key))  # ... still, after its frames were read
    except Exception as exc:
        log_attempt(ws, {"shot": index, "key": key, "status": "failed", "reason": failure_reason(exc), **where,
                         "seconds": round(time.monotonic() - t0, 3)})  # fmt: skip
        raise
    seconds = time.monotonic() - t0
    result = shot_result(raw, shot, cfg.backend.name, seconds)
    run_logger(log).info(
        "shot %04d done in %.1f s: %s", index, seconds,
        "dubbed" if result["dubbed"] else f"not dubbed ({result.get('reason') or 'copied through'})",
    )  # fmt: skip
    mark_shot_done(ws, index, key, {"output": result["path"], "result": result, **where})
    log_attempt(
        ws,
        {
            "shot": index,
            "key": key,
            "status": "done",
            **where,
            "pid": os.getpid(),
            "seconds": round(seconds, 3),
        },
    )
    return result


def _same_source(film: dict[str, Any], shot_dir: Path) -> None:
    """InputChanged when the film's source is no longer the file noted when the run began; what the shot
    rendered from it so far (its chunk checkpoints) is removed: never kept under the original's key."""
    noted = film.get("source_identity")
    if not noted:
        return
    try:
        check_input(film["video"]["path"], noted, ": this shot is not kept; re-run to dub the file as it is")
    except InputChanged:
        discard(shot_dir / CHUNKS)
        discard(shot_dir / INTERMEDIATE)
        raise


def _progress_line(index: int) -> Callable[[float], None]:
    """A console line per finished chunk of shot `index` (`shot 0003: 40 % rendered`), the last one left
    to the shot's done line."""

    def line(fraction: float) -> None:
        if fraction < 1.0:
            run_logger(log).info("shot %04d: %d %% rendered", index, round(100 * fraction))

    return line


def _shot_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    shot = parameters["shot"]
    return Workspace.from_dict(parameters["ws"]).shot_cache_key(shot["index"], shot["key"])


def _shot_task_name() -> str:
    shot = task_run.parameters["shot"]
    return shot_run_name(shot["index"], shot["start_s"], shot["end_s"])


def qc_one_shot(
    ws: Workspace, film: dict[str, Any], shot: dict[str, Any]
) -> tuple[dict[str, Any] | None, bool]:
    """The QC artefacts of a done, dubbed shot (`qc.enabled`), written unless its QC record says they
    are (their files still there): (the record or None, whether it was written now). Runs after the
    shot's done marker, so a crash loses at most the QC, which the next run of the shot writes."""
    index, key = shot["index"], shot["key"]
    done = read_shot_done(ws, index, key)
    job = shot_job(ws, film, shot)
    qc_on = PipelineConfig.from_dict(job.config).qc.enabled
    if done is None or not done["result"].get("dubbed") or not qc_on:
        return None, False
    if done["result"].get("qc"):  # written by the render itself
        return done["result"]["qc"], False
    path = ws.shot_dir(index, key) / QC_RECORD
    kept = read_marker(path)
    if kept is not None and all(Path(str(kept.get(k, ""))).is_file() for k in ("preview", "contact_sheet")):
        return kept, False
    t0 = time.monotonic()
    record = {**write_job_qc(job), "seconds": round(time.monotonic() - t0, 3)}
    write_marker(path, record)
    return record, True


def _publish_qc(tag: str, index: int, qc: dict[str, Any]) -> None:
    """A markdown artifact linking the shot's QC preview and contact sheet."""
    links = [f"[{label}]({Path(qc[k]).resolve().as_uri()})" for k, label in
             (("preview", "preview"), ("contact_sheet", "contact sheet")) if qc.get(k)]  # fmt: skip
    if not links:
        return
    from prefect.artifacts import create_markdown_artifact

    try:
        create_markdown_artifact(
            f"shot {index:04d}: " + " · ".join(links),
            key=artifact_key(tag, "shot", f"{index:04d}", "qc"),
            description=f"QC of shot {index:04d}",
        )
    except Exception as exc:  # telemetry must not fail a rendered shot
        log.warning("QC artifact of shot %04d: %s", index, exc)


def _qc_task_name() -> str:
    return "qc-" + _shot_task_name().removeprefix("shot-")


@task(task_run_name=_qc_task_name, cache_policy=NO_CACHE)
def shot_qc(ws: dict[str, str], film: dict[str, Any], shot: dict[str, Any]) -> dict[str, Any] | None:
    """A done shot's QC artefacts and their artifact (`qc_one_shot`); a group submits it after the shot
    so that it runs beside the next one. A QC that fails is logged, never a failed shot."""
    logger = run_logger(log)
    try:
        qc, fresh = qc_one_shot(Workspace.from_dict(ws), film, shot)
    except Exception as exc:
        logger.warning("shot %04d: QC not written: %s", shot["index"], failure_reason(exc))
        return None
    if qc is not None and fresh:
        logger.info("shot %04d: QC in %.1f s", shot["index"], qc["seconds"])
        if logger is not log:
            _publish_qc(film["tag"], shot["index"], qc)
    return qc


@task(
    task_run_name=_shot_task_name, cache_key_fn=_shot_cache_key, persist_result=True, result_serializer="json"
)
def dub_shot(
    ws: dict[str, str], film: dict[str, Any], shot: dict[str, Any], backends: BackendSlot | None = None
) -> dict[str, Any]:
    """One shot, all its chunks, into the workspace (resuming at its last finished chunk); its ShotResult.

    Cached on workspace + shot index + shot key: a later film run, a UI retry or another host gets the
    result without rendering again.
    """
    workspace = Workspace.from_dict(ws)
    plan = shot["plan"]
    logger = run_logger(log)
    if read_shot_done(workspace, shot["index"], shot["key"]) is not None:  # reused: the resume line said so
        return render_one_shot(workspace, film, shot, backends or BackendSlot.for_config(film["config"]))
    where = where_am_i()
    logger.info(
        "shot %04d (%s): %d frames, %d chunk(s), backend %s on %s",
        shot["index"], shot_run_name(shot["index"], shot["start_s"], shot["end_s"]).split(" ", 1)[1],
        plan["end_frame"] - plan["start_frame"], shot["chunks"], film["config"]["backend"]["name"],
        describe_place(where),
    )  # fmt: skip
    progress = None
    if logger is not log:  # a Prefect task run: a progress artifact updated after every chunk
        progress = ShotProgress(
            artifact_key(film["tag"], "shot", f"{shot['index']:04d}"),
            f"shot {shot['index']:04d} of {film['tag']}, {shot['chunks']} chunk(s)",
        )
    return render_one_shot(
        workspace, film, shot, backends or BackendSlot.for_config(film["config"]), progress
    )
