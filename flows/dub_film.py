"""`dub-film` and `dub-group`: a film fanned out as groups of consecutive shots, one model load per group.

    dub-film  (deployment dub-film/default, cpu-pool)
      probe -> workspace -> shots -> dialogue -> chunk plans -> shot groups (flows/groups.py)
      ├─ task "group-000 shots 0000-0004" ─> child run dub-group (deployment dub-group/gpu, gpu-pool)
      │                                        ├─ task "shot-0000 00:00:00.000-00:00:02.502" (progress artifact)
      │                                        └─ ...   one backend (model load) for the whole group
      ├─ task "group-001 shots 0005-0009" ─> ...
      └─ wait for every group -> shot table -> assemble (only when every shot is done) -> summary

The flows only orchestrate: media work is in `tasks/`, the workspace and its markers in
`flows/workspace.py`, UI artifacts in `flows/progress.py`. Resume is file based and Prefect based at
once: each shot's `done.json` in the run workspace (keyed by film + dub track + config + code version)
and a Prefect cache record keyed by the same workspace + shot + shot plan, never by a run id. A group
whose shots are all done starts no child run; a re-run or a UI Retry of a failed group redoes only its
failed shots, and a shot resumes at its last finished chunk.

`fanout` picks how groups run:
* ``deployments``: each group is a child run of `dub-group/gpu` on a GPU worker (`run_deployment`),
  all groups submitted at once and all awaited;
* ``local``: each group is an in-process subflow, one after another (one device; `dubflow dub`);
* ``auto`` (default): ``deployments`` in a deployment run, else ``local``.
`dub_film_inline` runs the same sequence as plain calls without any Prefect API
(`dubflow dub --no-prefect`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.deployments import run_deployment
from prefect.futures import wait
from prefect.runtime import deployment, flow_run, task_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.groups import GpuCost, Group, ShotCost, plan_groups
from flows.progress import ShotProgress, artifact_key, publish_shot_table, publish_summary, shot_run_name
from flows.workspace import (
    Workspace,
    atomic_write_json,
    film_fingerprint,
    log_attempt,
    mark_shot_done,
    mark_shot_failed,
    open_workspace,
    read_json,
    read_shot_done,
    read_shot_failed,
    shot_done,
    stable_hash,
)
from tasks.assemble import AudioSource, assemble, check_output_path
from tasks.audio import DialogueTrack, check_mix, prepare_dialogue, slice_bounds
from tasks.backend import BACKENDS, Backend, get_backend
from tasks.config import DebugConfig, PipelineConfig, load_config
from tasks.errors import ConfigError, DubflowError
from tasks.plan import ShotPlan, plan_film
from tasks.probe import VideoInfo, probe
from tasks.render import ShotJob, render_shot_result
from tasks.shots import ShotList, detect_shots

log = logging.getLogger(__name__)

GROUP_DEPLOYMENT = "dub-group/gpu"
GPU_POOL = "gpu-pool"
# Config sections that never change a shot's pixels: outside the workspace key, so changing them resumes.
# config that never changes a shot's pixels: changing it resumes the same workspace
# (sequence parallelism and block offload give bit-identical outputs; profiling only adds device syncs)
NON_SHOT_CONFIG = (
    "encode", "workspace", "cost", "estimate", "debug", "infinitetalk.gpus_per_shot", "infinitetalk.profile",
    "infinitetalk.offload",
)  # fmt: skip
Fanout = Literal["auto", "local", "deployments"]


class ShotsFailed(DubflowError):
    """One or more shots failed; the message lists them and the first reason."""


class InjectedFault(RuntimeError):
    """The fault `debug.fail_shots` asks for (tests and demos)."""


def _logger() -> logging.Logger | logging.LoggerAdapter:
    from prefect.context import FlowRunContext, TaskRunContext

    if TaskRunContext.get() is None and FlowRunContext.get() is None:  # inline mode
        return log
    return get_run_logger()


def _reason(exc: BaseException | None, fallback: str = "unknown error") -> str:
    """One-line failure reason for the shot table, e.g. ``RuntimeError: CUDA out of memory``."""
    if exc is None or not isinstance(exc, BaseException):
        return fallback
    text = exc.problem if isinstance(exc, DubflowError) else str(exc)
    return " ".join(f"{type(exc).__name__}: {text}".split())[:500]


def where_am_i() -> dict[str, str]:
    """Host, Prefect worker (set by the worker in its flow-run processes) and device of this process."""
    return {
        "host": socket.gethostname(),
        "worker": os.environ.get("PREFECT__WORKER_NAME", "") or "in-process",
        "device": os.environ.get("CUDA_VISIBLE_DEVICES", "") or "cpu",
    }


def default_output(source: str) -> str:
    """``$DUBFLOW_OUT_DIR`` (default ``./out``) / ``<film stem>.dubbed<.mp4|.mov|.mkv>``."""
    suffix = Path(source).suffix.lower()
    suffix = suffix if suffix in (".mp4", ".mov", ".mkv") else ".mp4"
    root = Path(os.environ.get("DUBFLOW_OUT_DIR", "out"))
    return str((root / f"{Path(source).stem}.dubbed{suffix}").resolve())


def workspace_root(cfg: PipelineConfig) -> str:
    """`workspace.root`, except that `DUBFLOW_WORKSPACE` replaces the default root (shared across hosts)."""
    env = os.environ.get("DUBFLOW_WORKSPACE", "").strip()
    if env and cfg.workspace.root == load_config().workspace.root:
        return env
    return cfg.workspace.root


def film_tag(source: str) -> str:
    """Artifact-key prefix of a film (its file stem)."""
    try:
        return artifact_key(Path(source).stem)
    except ValueError:
        return "film"


# ------------------------------------------------------------------------------- film-level tasks


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


@task(task_run_name="workspace {name}")
def open_film_workspace(
    source: str, audio: str, config: dict[str, Any], root: str, name: str = ""
) -> dict[str, str]:
    """Create or reopen the run workspace of film + dub track + shot config + code version."""
    ws = open_workspace(root, source, config, inputs=[audio], exclude=NON_SHOT_CONFIG)
    _logger().info("workspace %s", ws.path)
    return ws.as_dict()


@task(task_run_name="shots {name}")
def find_shots(video: dict[str, Any], config: dict[str, Any], ws: dict[str, str], name: str = "") -> dict:
    """Frame-exact shot partition of the whole film; kept in the workspace, so a re-run skips detection."""
    saved = Workspace.from_dict(ws).path / "shots.json"
    if saved.exists():
        return read_json(saved)
    cfg = PipelineConfig.from_dict(config)
    shots = detect_shots(VideoInfo.from_dict(video), cfg.shots)
    _logger().info("%d shot(s): cuts at %s", len(shots.shots), [s.start_frame for s in shots.shots[1:]])
    atomic_write_json(saved, shots.to_dict())
    return shots.to_dict()


@task(task_run_name="audio {name}")
def load_dialogue(
    audio: str, frame_count: int, fps: str, config: dict[str, Any], out_wav: str, name: str = ""
) -> dict[str, Any]:
    """Decode and length-check the dubbed dialogue track into the workspace."""
    cfg = PipelineConfig.from_dict(config)
    track = prepare_dialogue(
        audio, frame_count=frame_count, fps=Fraction(fps), cfg=cfg.audio, out_wav=out_wav
    )
    return track.to_dict()


@task(task_run_name="mix {name}")
def check_final_mix(mix: str, frame_count: int, fps: str, config: dict[str, Any], name: str = "") -> str:
    """Length-check the final mix; returns the action ('ok', 'pad' or 'trim')."""
    cfg = PipelineConfig.from_dict(config)
    return check_mix(mix, frame_count=frame_count, fps=Fraction(fps), policy=cfg.audio.length_policy).action


@task(task_run_name="plan {name}")
def plan_shots(shots: dict[str, Any], config: dict[str, Any], name: str = "") -> list[dict[str, Any]]:
    """Chunk plan (25 fps timeline, sliding reference frames) of every shot."""
    cfg = PipelineConfig.from_dict(config)
    sl = ShotList.from_dict(shots)
    return [p.to_dict() for p in plan_film(sl.shots, sl.fps, cfg.plan)]


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
    """Join the shots, encode once, mux the dubbed audio, write `out` atomically.

    Skipped when `out` is the file this workspace last assembled from the same shot files, audio and
    encode settings (`assembled.json`): re-running a finished film costs no second encode.
    """
    cfg = PipelineConfig.from_dict(config)
    inputs = stable_hash(
        {
            "shots": [[p, Path(p).stat().st_size, Path(p).stat().st_mtime_ns] for p in shot_paths],
            "audio": film_fingerprint(audio_path),
            "pad": pad_audio,
            "encode": cfg.encode,
            "out": str(Path(out).resolve()),
        }
    )
    stamp_path = Path(workdir) / "assembled.json"
    if stamp_path.exists() and Path(out).is_file():
        stamp, st = read_json(stamp_path), Path(out).stat()
        if stamp.get("inputs") == inputs and [stamp.get("size"), stamp.get("mtime_ns")] == [
            st.st_size,
            st.st_mtime_ns,
        ]:
            _logger().info("%s is up to date (same shots, audio and encode settings): not re-encoded", out)
            return out
    final = assemble(
        VideoInfo.from_dict(video),
        shot_paths,
        out,
        cfg.encode,
        audio=AudioSource(audio_path, pad_audio),
        workdir=workdir,
    )
    st = Path(final).stat()
    atomic_write_json(
        stamp_path, {"inputs": inputs, "out": final, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    )
    return final


# ------------------------------------------------------------------------------------ the shot unit


class BackendSlot:
    """The group's backend: built on first use (a group of cached shots loads nothing), then reused
    for the group's later shots, so one group process pays one model load."""

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


def _fault(ws: Workspace, index: int, debug: DebugConfig) -> Callable[[float], None] | None:
    """`debug.fail_shots`: raise once half of the shot's chunks are checkpointed (optionally only once)."""
    if index not in debug.fail_shots:
        return None
    marker = ws.shot_dir(index) / "injected-fault"
    if debug.fail_once and marker.exists():
        return None

    def check(fraction: float) -> None:
        if fraction >= 0.5:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            raise InjectedFault(f"injected fault (debug.fail_shots) in shot {index:04d} at {fraction:.0%}")

    return check


def render_one_shot(
    ws: Workspace,
    film: dict[str, Any],
    shot: dict[str, Any],
    backends: BackendSlot,
    on_progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Render one shot into the workspace unless its `done.json` says it is done; its ShotResult.

    Writes `done.json` last, and one line per attempt to `attempts.jsonl`.
    """
    index = shot["index"]
    done = read_shot_done(ws, index)
    if done is not None and done.get("plan_hash") == shot["plan_hash"]:
        return done["result"]
    cfg = PipelineConfig.from_dict(film["config"])
    job = ShotJob(
        film["video"],
        shot["plan"],
        film["dialogue"],
        tuple(shot["audio_range"]),
        str(ws.shot_dir(index) / "shot.mkv"),
        film["config"],
        work_dir=str(ws.path),  # per-film caches and QC previews live in the run workspace
    )
    hooks = [h for h in (on_progress, _fault(ws, index, cfg.debug)) if h is not None]

    def report(fraction: float) -> None:
        for hook in hooks:
            hook(fraction)

    where = where_am_i()
    t0 = time.monotonic()
    try:
        raw = render_shot_result(job, on_progress=report if hooks else None, backend=backends.get())
    except Exception as exc:
        log_attempt(ws, {"shot": index, "status": "failed", "reason": _reason(exc), **where,
                         "seconds": round(time.monotonic() - t0, 3)})  # fmt: skip
        raise
    seconds = time.monotonic() - t0
    result = shot_result(raw, shot, cfg.backend.name, seconds)
    mark_shot_done(
        ws, index, {"plan_hash": shot["plan_hash"], "output": result["path"], "result": result, **where}
    )
    log_attempt(
        ws, {"shot": index, "status": "done", **where, "pid": os.getpid(), "seconds": round(seconds, 3)}
    )
    return result


def _shot_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    shot = parameters["shot"]
    return Workspace.from_dict(parameters["ws"]).shot_cache_key(shot["index"], shot["plan_hash"])


def _shot_task_name() -> str:
    shot = task_run.parameters["shot"]
    return shot_run_name(shot["index"], shot["start_s"], shot["end_s"])


def _publish_qc(tag: str, result: dict[str, Any]) -> None:
    """A markdown artifact linking the shot's QC preview and contact sheet, when the renderer made them."""
    qc = result.get("qc") or {}
    links = [f"[{label}]({Path(qc[k]).resolve().as_uri()})" for k, label in
             (("preview", "preview"), ("contact_sheet", "contact sheet")) if qc.get(k)]  # fmt: skip
    if not links:
        return
    from prefect.artifacts import create_markdown_artifact

    try:
        create_markdown_artifact(
            f"shot {result['index']:04d}: " + " · ".join(links),
            key=artifact_key(tag, "shot", f"{result['index']:04d}", "qc"),
            description=f"QC of shot {result['index']:04d}",
        )
    except Exception as exc:  # noqa: BLE001 - telemetry must not fail a rendered shot
        log.warning("QC artifact of shot %04d: %s", result["index"], exc)


@task(task_run_name=_shot_task_name, cache_key_fn=_shot_cache_key, persist_result=True)
def dub_shot(
    ws: dict[str, str], film: dict[str, Any], shot: dict[str, Any], backends: BackendSlot | None = None
) -> dict[str, Any]:
    """One shot, all its chunks, into the workspace (resuming at its last finished chunk); its ShotResult.

    Cached on workspace + shot index + shot plan hash: a later film run, a UI retry or another host
    gets the result without rendering again.
    """
    workspace = Workspace.from_dict(ws)
    plan = shot["plan"]
    logger = _logger()
    logger.info(
        "shot %04d: %d frames, %d chunk(s), backend %s on %s",
        shot["index"], plan["end_frame"] - plan["start_frame"], shot["chunks"],
        film["config"]["backend"]["name"], where_am_i(),
    )  # fmt: skip
    progress = None
    if logger is not log:  # a Prefect task run: a progress artifact updated after every chunk
        progress = ShotProgress(
            artifact_key(film["tag"], "shot", f"{shot['index']:04d}"),
            f"shot {shot['index']:04d} of {film['tag']}, {shot['chunks']} chunk(s)",
        )
    result = render_one_shot(
        workspace, film, shot, backends or BackendSlot.for_config(film["config"]), progress
    )
    if logger is not log:
        _publish_qc(film["tag"], result)
    return result


ShotRunner = Callable[[dict[str, Any]], BaseException | None]


def render_group(ws: Workspace, shots: Sequence[dict[str, Any]], run_shot: ShotRunner) -> list[int]:
    """Every shot of a group in order; failures are recorded and never stop the others. Failed indices."""
    failed = []
    for shot in shots:
        error = run_shot(shot)
        if error is not None:
            mark_shot_failed(ws, shot["index"], _reason(error), where_am_i())
            failed.append(shot["index"])
    return failed


@flow(name="dub-group")
def dub_group(ws: dict[str, str], film: dict[str, Any], shots: list[dict[str, Any]]) -> dict[str, Any]:
    """One group of consecutive shots on this worker's device: a task run per shot, one model load.

    Ends Failed naming its failed shots; a Retry of this run redoes only those (the others are Cached).
    """
    workspace = Workspace.from_dict(ws)
    backends = BackendSlot.for_config(film["config"])
    where = where_am_i()
    get_run_logger().info("%d shot(s) on %s", len(shots), where)

    def run_shot(shot: dict[str, Any]) -> BaseException | None:
        done = shot_done(workspace, shot["index"], shot["plan_hash"])
        state = dub_shot.with_options(refresh_cache=not done)(ws, film, shot, backends, return_state=True)
        if state.is_completed():
            return None
        error = state.result(raise_on_failure=False)
        return error if isinstance(error, BaseException) else RuntimeError(state.message or state.name)

    failed = render_group(workspace, shots, run_shot)
    if failed:
        raise ShotsFailed(
            film["source"],
            f"{len(failed)} of {len(shots)} shot(s) failed: {failed}; retry this run to redo them",
        )
    return {"shots": [s["index"] for s in shots], "model_load_s": backends.load_s, **where}


# ---------------------------------------------------------------------------------- group fan-out


def _group_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    ws = Workspace.from_dict(parameters["ws"])
    plans = stable_hash([s["plan_hash"] for s in parameters["shots"]])
    return f"dubflow-{ws.key}-{ws.incarnation}-group-{plans}"


def group_report(ws: Workspace, shots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Done/failed shots of a group and where they were rendered (from the workspace markers)."""
    done, failed, workers = [], [], set()
    for shot in shots:
        record = read_shot_done(ws, shot["index"])
        if record is not None and record.get("plan_hash") == shot["plan_hash"]:
            done.append(shot["index"])
        else:
            failed.append(shot["index"])
            record = read_shot_failed(ws, shot["index"])
        if record is not None and record.get("worker"):
            workers.add(f"{record['worker']}@{record.get('host', '?')}:{record.get('device', '?')}")
    return {"done": done, "failed": failed, "workers": sorted(workers)}


@task(task_run_name="{name}", cache_key_fn=_group_cache_key, persist_result=True)
def run_group(
    ws: dict[str, str], film: dict[str, Any], shots: list[dict[str, Any]], name: str, fanout: str
) -> dict[str, Any]:
    """One shot group: no child run when every shot is done, else a child run of `dub-group`.

    fanout "deployments": a run of the `dub-group/gpu` deployment on a GPU worker (waits for it);
    "local": the `dub-group` flow as an in-process subflow.
    """
    workspace = Workspace.from_dict(ws)
    if all(shot_done(workspace, s["index"], s["plan_hash"]) for s in shots):
        return group_report(workspace, shots)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    if fanout == "deployments":
        child = run_deployment(
            GROUP_DEPLOYMENT,
            parameters={"ws": ws, "film": film, "shots": shots},
            flow_run_name=name,
            timeout=None,
            poll_interval=2,
            as_subflow=True,
        )
        outcome = f"child run {child.name} ({child.id}) ended {child.state.name}"
        ok = child.state.is_completed()
    else:
        state = dub_group.with_options(flow_run_name=name)(ws, film, shots, return_state=True)
        outcome, ok = f"subflow ended {state.name}", state.is_completed()
    report = group_report(workspace, shots)
    if not ok or report["failed"]:
        for index in report["failed"]:  # never attempted in this child (e.g. it crashed): say so
            record = read_shot_failed(workspace, index)
            if record is None or str(record.get("failed", "")) < started:
                mark_shot_failed(workspace, index, f"{name}: {outcome}")
        raise RuntimeError(f"{name}: {outcome}; shots not done: {report['failed']}")
    return report


def online_workers(pool: str) -> int:
    """Online workers polling `pool` (at least 1, so planning works before workers report)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkerStatus

    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    return max(1, sum(w.status == WorkerStatus.ONLINE for w in workers))


class InlineRunner:
    """The film sequence as plain function calls: no Prefect API, no artifacts, groups in order."""

    fanout = "inline"

    def call(self, t: Any, *args: Any, **kwargs: Any) -> Any:
        return t.fn(*args, **kwargs)

    def n_workers(self) -> int:
        return 1

    def run_groups(
        self, ws: Workspace, film: dict[str, Any], shots: list[dict[str, Any]], groups: list[Group]
    ) -> dict[int, str]:
        backends = BackendSlot.for_config(film["config"])  # one backend for the whole film

        def run_shot(shot: dict[str, Any]) -> BaseException | None:
            try:
                dub_shot.fn(ws.as_dict(), film, shot, backends)
            except Exception as exc:  # keep going: every failed shot is reported
                log.error("shot %04d failed: %s", shot["index"], _reason(exc))
                return exc
            return None

        states = {}
        for group in groups:
            failed = render_group(ws, [shots[i] for i in group.shots], run_shot)
            states[group.index] = "Failed" if failed else "Completed"
        return states

    def publish(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        pass


class PrefectRunner:
    """The film sequence as Prefect task runs; groups as child runs (deployments or in-process)."""

    def __init__(self, fanout: Literal["local", "deployments"]) -> None:
        self.fanout = fanout

    def call(self, t: Any, *args: Any, **kwargs: Any) -> Any:
        return t(*args, **kwargs)

    def n_workers(self) -> int:
        return online_workers(GPU_POOL) if self.fanout == "deployments" else 1

    def run_groups(
        self, ws: Workspace, film: dict[str, Any], shots: list[dict[str, Any]], groups: list[Group]
    ) -> dict[int, str]:
        states, futures = {}, {}
        for group in groups:
            members = [shots[i] for i in group.shots]
            all_done = all(shot_done(ws, s["index"], s["plan_hash"]) for s in members)
            wrapper = run_group.with_options(refresh_cache=not all_done)
            args = (ws.as_dict(), film, members, group.name, self.fanout)
            if self.fanout == "deployments":
                futures[group.index] = wrapper.submit(*args)
            else:  # one device: groups one after another
                states[group.index] = wrapper(*args, return_state=True).name
        wait(list(futures.values()))  # always wait for every group: one failure must not cancel others
        states.update({i: f.state.name for i, f in futures.items()})
        return states

    def publish(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - UI telemetry must not fail a film
            log.warning("artifact %s failed: %s", getattr(fn, "__name__", fn), exc)


# ------------------------------------------------------------------------------------ the sequence


def _shot_records(
    shots: dict[str, Any], plans: list[dict[str, Any]], track: DialogueTrack
) -> list[dict[str, Any]]:
    """Small serialisable per-shot records: span, plan, audio samples, and the hash that keys resume."""
    edges = [s["start_frame"] for s in shots["shots"]] + [shots["frame_count"]]
    bounds = slice_bounds(edges, Fraction(shots["fps"]), track.sample_rate, track.n_samples)
    records = []
    for s, plan, (a, b) in zip(shots["shots"], plans, bounds, strict=True):
        record = {
            "index": s["index"],
            "start_s": s["start_s"],
            "end_s": s["end_s"],
            "frames": s["end_frame"] - s["start_frame"],
            "chunks": len(plan["chunks"]),
            "plan": plan,
            "audio_range": [a, b],
        }
        record["plan_hash"] = stable_hash({"plan": plan, "audio_range": [a, b]})
        records.append(record)
    return records


def shot_rows(ws: Workspace, shots: list[dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    """Shot table rows (status done / copied / failed / planned, and why) from the workspace markers."""
    rows = []
    for shot in shots:
        row = {k: shot[k] for k in ("index", "start_s", "end_s", "frames", "chunks")}
        done = read_shot_done(ws, shot["index"])
        if done is not None and done.get("plan_hash") == shot["plan_hash"]:
            result = done.get("result", {})
            status = "done" if result.get("dubbed", True) else "copied"
            row |= {
                "backend": result.get("backend", backend),
                "status": status,
                "reason": result.get("reason"),
            }
            row["output"] = done["output"]
        else:
            failed = read_shot_failed(ws, shot["index"])
            status = "failed" if failed else "planned"
            row |= {"backend": backend, "status": status, "reason": failed and failed.get("reason")}
        rows.append(row)
    return rows


def _shot_timings(rows: list[dict[str, Any]], ws: Workspace) -> dict[str, float]:
    """Sum of the shots' renderer timings per stage (seconds)."""
    total: dict[str, float] = {}
    for row in rows:
        done = read_shot_done(ws, row["index"]) or {}
        for stage, seconds in (done.get("result", {}).get("timings_s") or {}).items():
            if isinstance(seconds, int | float):
                total[f"shots: {stage}"] = total.get(f"shots: {stage}", 0.0) + float(seconds)
    return total


def run_pipeline(
    source: str, audio: str, out: str | None, mix: str | None, config: dict[str, Any], runner: Any
) -> str:
    """The dub-film sequence (no media math here: every step is a task)."""
    t0 = time.monotonic()
    logger = _logger()
    cfg = PipelineConfig.from_dict(config)
    # every process of the run (group runs on other hosts too) sees the one resolved workspace root
    cfg = dataclasses.replace(
        cfg, workspace=dataclasses.replace(cfg.workspace, root=str(Path(workspace_root(cfg)).resolve()))
    )
    cfgd = cfg.to_dict()
    out = out or default_output(source)
    check_output_path(out, source, audio, mix)
    if cfg.backend.name not in BACKENDS:
        raise ConfigError(
            "backend.name", f"unknown backend {cfg.backend.name!r} (known: {', '.join(BACKENDS)})"
        )
    name, tag = Path(source).name, film_tag(source)
    video = runner.call(probe_source, source, cfgd, name=name)
    ws = Workspace.from_dict(
        runner.call(open_film_workspace, source, audio, cfgd, cfg.workspace.root, name=name)
    )
    shots = runner.call(find_shots, video, cfgd, ws.as_dict(), name=name)
    n, fps = shots["frame_count"], shots["fps"]
    if n != video["frame_count"]:
        video = {**video, "frame_count": n}
    track = DialogueTrack.from_dict(
        runner.call(load_dialogue, audio, n, fps, cfgd, str(ws.path / "dialogue.wav"), name=Path(audio).name)
    )
    mix_action = runner.call(check_final_mix, mix, n, fps, cfgd, name=Path(mix).name) if mix else None
    plans = runner.call(plan_shots, shots, cfgd, name=name)
    records = _shot_records(shots, plans, track)
    film = {"tag": tag, "source": source, "video": video, "dialogue": track.to_dict(), "config": cfgd}

    needs_gpu = cfg.backend.name != "passthrough"
    cost = GpuCost.from_config(cfg, needs_gpu=needs_gpu)  # the `dubflow estimate` chunk price
    logger.info("group sizing: %s; load share <= %g", cost.describe(), cost.max_load_share)  # names stand-ins
    n_workers = runner.n_workers()
    groups = plan_groups(
        [ShotCost(r["index"], cost.shot_s(ShotPlan.from_dict(r["plan"]))) for r in records],
        n_workers=n_workers,
        model_load_s=cost.model_load_s,
        max_load_share=cost.max_load_share,
    )
    shares = [g.load_share(cost.model_load_s) for g in groups] if needs_gpu else [0.0]
    logger.info(
        "%s: %d shots, %d chunks, backend %s; %d group(s) for %d worker(s) (%s), model-load share %.1f-%.1f %%",
        name, len(records), sum(r["chunks"] for r in records), cfg.backend.name, len(groups), n_workers,
        runner.fanout, 100 * min(shares), 100 * max(shares),
    )  # fmt: skip
    table_key = artifact_key(tag, "shots")
    runner.publish(publish_shot_table, table_key, shot_rows(ws, records, cfg.backend.name), "shot plan")
    t_prepared = time.monotonic()

    states = runner.run_groups(ws, film, records, groups)
    t_rendered = time.monotonic()
    rows = shot_rows(ws, records, cfg.backend.name)
    runner.publish(publish_shot_table, table_key, rows, "shot states")
    runner.publish(_publish_groups, tag, ws, groups, records, states, cost.model_load_s if needs_gpu else 0.0)
    failed = [r for r in rows if r["status"] not in ("done", "copied")]
    if failed:
        raise ShotsFailed(
            source,
            f"{len(failed)} shot(s) failed {[r['index'] for r in failed]}; "
            f"first: {failed[0]['reason'] or failed[0]['status']}; re-run to resume",
        )

    audio_path, pad = (mix, mix_action == "pad") if mix else (audio, track.action == "pad")
    paths = [r["output"] for r in rows]
    final = runner.call(assemble_film, video, paths, out, audio_path, pad, cfgd, str(ws.path), name=name)
    per_stage = _shot_timings(rows, ws)
    if not cfg.workspace.keep:
        shutil.rmtree(ws.path, ignore_errors=True)
    t_end = time.monotonic()
    timings = {
        "prepare (probe, shots, audio, plan)": t_prepared - t0,
        "render (all groups)": t_rendered - t_prepared,
        "assemble": t_end - t_rendered,
        "total": t_end - t0,
        **per_stage,
    }
    notes = [
        f"{len(records)} shots in {len(groups)} group(s), fan-out {runner.fanout}, backend {cfg.backend.name}",
        f"model-load share per group (plan): {100 * min(shares):.1f}-{100 * max(shares):.1f} %",
    ]
    if not needs_gpu:
        notes.append("DRY RUN: passthrough backend, the film is NOT dubbed")
    runner.publish(
        publish_summary, artifact_key(tag, "summary"), title=f"{name} dubbed", output=final,
        timings=timings, notes=notes,
    )  # fmt: skip
    logger.info("%s -> %s in %.1f s", source, final, t_end - t0)
    return final


def _publish_groups(
    tag: str,
    ws: Workspace,
    groups: list[Group],
    shots: list[dict[str, Any]],
    states: dict[int, str],
    model_load_s: float,
) -> None:
    """Table artifact: each group's shots, estimated GPU time, model-load share, state and workers."""
    from prefect.artifacts import create_table_artifact

    rows = []
    for group in groups:
        report = group_report(ws, [shots[i] for i in group.shots])
        rows.append(
            {
                "group": group.name,
                "est_gpu_s": round(group.est_gpu_s, 1),
                "load_share_pct": round(100 * group.load_share(model_load_s), 1),
                "state": states.get(group.index, "?"),
                "failed": ", ".join(f"{i:04d}" for i in report["failed"]),
                "workers": ", ".join(report["workers"]),
            }
        )
    create_table_artifact(rows, key=artifact_key(tag, "groups"), description="shot groups")


# ---------------------------------------------------------------------------------------- entries


def _film_run_name() -> str:
    return f"dub {Path(flow_run.parameters['source']).name}"


@flow(name="dub-film", flow_run_name=_film_run_name, task_runner=ThreadPoolTaskRunner(max_workers=64))
def dub_film(
    source: str,
    audio: str,
    out: str | None = None,
    mix: str | None = None,
    config: dict[str, Any] | None = None,
    fanout: Fanout = "auto",
) -> str:
    """Dub `source` with the dialogue track `audio` (and optional final `mix`) into `out`.

    `config` is a (partial) nested config dict applied over `configs/default.yaml`; `out` defaults to
    `out/<stem>.dubbed.mp4`. `fanout`: see the module docstring. The thread pool bounds the groups in
    flight at once in deployments mode (64 GPUs).
    """
    cfg = load_config(updates=config or {})
    if fanout == "auto":
        fanout = "deployments" if deployment.id else "local"
    if fanout not in ("local", "deployments"):
        raise ConfigError("fanout", f"unknown fan-out {fanout!r} (auto, local or deployments)")
    return run_pipeline(source, audio, out, mix, cfg.to_dict(), PrefectRunner(fanout))


def dub_film_inline(
    source: str,
    audio: str,
    out: str | None = None,
    mix: str | None = None,
    config: dict[str, Any] | None = None,
) -> str:
    """The same pipeline without Prefect (plain calls, same tasks, same workspace and resume)."""
    cfg = load_config(updates=config or {})
    return run_pipeline(source, audio, out, mix, cfg.to_dict(), InlineRunner())
