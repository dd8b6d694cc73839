"""`dub-film` and `dub-group`: a film fanned out as groups of consecutive shots, one model load per group.

    dub-film  (deployment dub-film/default, cpu-pool)
      probe -> workspace -> shots -> dialogue -> chunk plans -> shot groups (flows/groups.py)
      ├─ task "group-000 shots 0000-0004" ─> child run dub-group (deployment dub-group/gpu, gpu-pool)
      │                                        ├─ task "shot-0000 00:00:00.000-00:00:02.502" (progress artifact)
      │                                        └─ ...   one backend (model load) for the whole group
      ├─ task "group-001 shots 0005-0009" ─> ...
      └─ wait for every group -> shot table -> assemble (only when every shot is done) -> summary

The flows only orchestrate: the film-level tasks are in `flows/film_tasks.py`, the per-shot task in
`flows/shot_task.py`, the group runners in `flows/runners.py`, the shot and group tables in
`flows/report.py`, the workspace and its markers in `flows/workspace.py`, UI artifacts in
`flows/progress.py`, media work in `tasks/`. This module keeps the two flows (the deployments'
entrypoints), the `run_group` task that starts a `dub-group` child run, and the film sequence
(`run_pipeline`). Resume is file based and Prefect based at once: each shot's `done.json` in its result
folder of the run workspace (`shots/<index>-<shot key>/`, the key made of the shot's own inputs:
`tasks/timeline/shot_key.py`) and a Prefect cache record keyed by the same workspace + shot + shot key, never by a
run id. A group whose shots are all done starts no child
run; a re-run or a UI Retry of a failed group redoes only its failed shots, and a shot resumes at its
last finished chunk.

`fanout` picks how groups run:
* ``deployments``: each group is a child run of `dub-group/gpu` on a GPU worker (`run_deployment`),
  all groups submitted at once and all awaited;
* ``local``: each group is an in-process subflow, one after another (one device; `dubflow dub`);
* ``auto`` (default): ``deployments`` in a deployment run, else ``local``.
`dub_film_inline` runs the same sequence as plain calls without any Prefect API
(`dubflow dub --no-prefect`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.deployments import run_deployment
from prefect.runtime import deployment, flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.child_runs import ChildNotStarted, await_child
from flows.film_tasks import (
    apply_plan_file,
    assemble_film,
    check_final_mix,
    check_workspace,
    decide_speakers,
    default_output,
    dialogue_wav,
    export_timeline,
    film_tag,
    find_shots,
    key_shots,
    load_dialogue,
    load_stems,
    open_film_workspace,
    plan_characters,
    plan_shots,
    probe_source,
    workspace_root,
)
from flows.groups import GpuCost, ShotCost, plan_groups
from flows.outputs import check_overwrite, confine_output, output_comment
from flows.progress import artifact_key, publish_shot_table, publish_summary
from flows.report import group_report, publish_groups, reused_shots, shot_records, shot_rows, shot_timings
from flows.run_lock import hold_lock
from flows.runners import GPU_POOL, InlineRunner, PrefectRunner, render_group
from flows.runtime import run_logger, where_am_i
from flows.shot_task import BackendSlot, dub_shot, prepare_one_shot
from flows.workspace import (
    MANIFEST,
    RUN_LOCK,
    Workspace,
    mark_shot_failed,
    read_shot_done,
    read_shot_failed,
    shot_done,
    stable_hash,
)
from tasks.config import PipelineConfig, load_config
from tasks.decision.cast import CastPlan, cast_active, check_cast, plan_names
from tasks.decision.stems import parse_stems
from tasks.errors import ConfigError, DubflowError
from tasks.media.assemble import check_output_path
from tasks.media.audio import DialogueTrack
from tasks.media.profiles import check_container, check_size, delivery
from tasks.render.backend import BACKENDS
from tasks.render.preflight import check_config, check_frame_size
from tasks.render.shot import PREVIEW_LABEL
from tasks.timeline.plan import ShotPlan

log = logging.getLogger(__name__)

GROUP_DEPLOYMENT = "dub-group/gpu"
Fanout = Literal["auto", "local", "deployments"]


class ShotsFailed(DubflowError):
    """One or more shots failed; the message lists them and the first reason."""


# ------------------------------------------------------------- one group: the flow and the task starting it


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
        done = shot_done(workspace, shot["index"], shot["key"])
        state = dub_shot.with_options(refresh_cache=not done)(ws, film, shot, backends, return_state=True)
        if state.is_completed():
            return None
        error = state.result(raise_on_failure=False)
        return error if isinstance(error, BaseException) else RuntimeError(state.message or state.name)

    prepare = functools.partial(
        prepare_one_shot, workspace, film, backends=BackendSlot.for_config(film["config"])
    )
    failed = render_group(workspace, shots, run_shot, prepare)
    if failed:
        first = next(iter(failed.items()))
        raise ShotsFailed(
            film["source"],
            f"{len(failed)} of {len(shots)} shot(s) failed: {list(failed)}; first: shot {first[0]:04d}: "
            f"{first[1]}; retry this run to redo them",
        )
    return {"shots": [s["index"] for s in shots], "model_load_s": backends.load_s, **where}


def _group_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    ws = Workspace.from_dict(parameters["ws"])
    keys = stable_hash([s["key"] for s in parameters["shots"]])
    return f"dubflow-{ws.key}-{ws.incarnation}-group-{keys}"


@task(task_run_name="{name}", cache_key_fn=_group_cache_key, persist_result=True, result_serializer="json")
def run_group(
    ws: dict[str, str], film: dict[str, Any], shots: list[dict[str, Any]], name: str, fanout: str
) -> dict[str, Any]:
    """One shot group: no child run when every shot is done, else a child run of `dub-group`.

    fanout "deployments": a run of the `dub-group/gpu` deployment on a GPU worker (waits for it);
    "local": the `dub-group` flow as an in-process subflow.
    """
    workspace = Workspace.from_dict(ws)
    if all(shot_done(workspace, s["index"], s["key"]) for s in shots):
        return group_report(workspace, shots)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    if fanout == "deployments":
        child = run_deployment(
            GROUP_DEPLOYMENT,
            parameters={"ws": ws, "film": film, "shots": shots},
            flow_run_name=name,
            timeout=0,  # created, not awaited here: await_child fails when no worker ever starts it
            as_subflow=True,
        )
        try:
            child = await_child(
                child.id, name=name, pool=GPU_POOL,
                unscheduled_timeout_s=film["config"]["checks"]["unscheduled_timeout_s"],
            )  # fmt: skip
            outcome = f"child run {child.name} ({child.id}) ended {child.state.name}"
            ok = child.state.is_completed()
        except ChildNotStarted as exc:
            outcome, ok = exc.problem, False
    else:
        state = dub_group.with_options(flow_run_name=name)(ws, film, shots, return_state=True)
        outcome, ok = f"subflow ended {state.name}", state.is_completed()
    report = group_report(workspace, shots)
    if not ok or report["failed"]:
        for index in report["failed"]:  # never attempted in this child (e.g. it crashed): say so
            key = next(s["key"] for s in shots if s["index"] == index)
            record = read_shot_failed(workspace, index, key)
            if record is None or str(record.get("failed", "")) < started:
                mark_shot_failed(workspace, index, key, f"{name}: {outcome}")
        raise RuntimeError(f"{name}: {outcome}; shots not done: {report['failed']}")
    return report


# ------------------------------------------------------------------------------------ the sequence


def _holding_locks(fn: Callable[..., str]) -> Callable[..., str]:
    """Call `fn` with `held`, an ExitStack closed when it returns or raises (the locks it takes)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        with contextlib.ExitStack() as held:
            return fn(*args, held=held, **kwargs)

    return wrapper


def _lock_workspace(
    held: contextlib.ExitStack, runner: Any, ws: Workspace, source: str, cfg: PipelineConfig
) -> Workspace:
    """Hold `ws`'s run lock until the run ends; reopen the workspace if the run waited for removed it."""
    lock = hold_lock(
        ws.path / RUN_LOCK,
        f"workspace {ws.path}",
        wait_s=cfg.checks.lock_wait_s,
        run=str(flow_run.name or ""),
    )
    held.enter_context(lock)
    if not (ws.path / MANIFEST).exists():  # removed by the run we waited for (workspace.keep: false)
        cfgd = cfg.to_dict()
        ws = Workspace.from_dict(runner.call(open_film_workspace, source, cfgd, cfg.workspace.root))
    return ws


@_holding_locks
def run_pipeline(
    source: str,
    audio: str,
    out: str | None,
    mix: str | None,
    config: dict[str, Any],
    runner: Any,
    plan: str | None = None,
    overwrite: bool = False,
    stems: dict[str, str] | None = None,
    *,
    held: contextlib.ExitStack,
) -> str:
    """The dub-film sequence (no media math here: every step is a task); `plan`: a shot plan file;
    `stems`: {character: dub stem file} (who speaks when; `audio` stays the track that is muxed).

    Everything that would fail late is checked first (config, output path, pixel format, inputs, the
    workspace's intermediates and free space); from the workspace's opening to the end the run holds
    its lock (a second run of the same workspace waits, `checks.lock_wait_s`).
    """
    t0 = time.monotonic()
    logger = run_logger(log)
    cfg = PipelineConfig.from_dict(config)
    # every process of the run (group runs on other hosts too) sees the one resolved workspace root
    cfg = dataclasses.replace(
        cfg, workspace=dataclasses.replace(cfg.workspace, root=str(Path(workspace_root(cfg)).resolve()))
    )
    cfgd = cfg.to_dict()
    out = out or default_output(source)
    check_output_path(out, source, audio, mix)
    check_container(cfg.encode, out)
    check_config(cfg)
    stems = parse_stems(stems, "stems")
    if plan:  # the shot plan's characters: section names the automatic clusters
        cfg = dataclasses.replace(
            cfg, cast=dataclasses.replace(cfg.cast, names={**cfg.cast.names, **plan_names(plan)})
        )
        cfgd = cfg.to_dict()
    check_cast(cfg, stems)  # stills exist, stems and undub name characters: before any work
    out = str(confine_output(out, source))  # resolved, under an output root, not a foreign file
    if cfg.backend.name not in BACKENDS:
        raise ConfigError(
            "backend.name", f"unknown backend {cfg.backend.name!r} (known: {', '.join(BACKENDS)})"
        )
    name, tag = Path(source).name, film_tag(source)
    video = runner.call(probe_source, source, cfgd, name=name)
    check_frame_size(source, video["width"], video["height"], delivery(cfg.encode, video["pix_fmt"]).pix_fmt)
    check_size(cfg.encode, source, video["width"], video["height"])
    ws = Workspace.from_dict(runner.call(open_film_workspace, source, cfgd, cfg.workspace.root, name=name))
    ws = _lock_workspace(held, runner, ws, source, cfg)
    check_overwrite(out, ws.key, overwrite)
    shots = runner.call(find_shots, video, cfgd, ws.as_dict(), name=name)
    n, fps = shots["frame_count"], shots["fps"]
    if n != video["frame_count"]:
        video = {**video, "frame_count": n}
    track = DialogueTrack.from_dict(
        runner.call(load_dialogue, audio, n, fps, cfgd, dialogue_wav(ws, audio), name=Path(audio).name)
    )
    mix_action = runner.call(check_final_mix, mix, n, fps, cfgd, name=Path(mix).name) if mix else None
    stem_tracks = runner.call(load_stems, stems, n, fps, cfgd, ws.as_dict(), name=name) if stems else {}
    plans = runner.call(plan_shots, shots, cfgd, name=name)
    records = shot_records(shots, plans, track)
    if plan:
        records = runner.call(apply_plan_file, plan, records, cfgd, name=Path(plan).name, video=video)
    needs_gpu = cfg.backend.name != "passthrough"
    if needs_gpu and cast_active(cfg, stems):  # characters and who speaks when, before the keys
        cast = CastPlan(
            **runner.call(
                plan_characters, video, records, track.to_dict(), stem_tracks, cfgd, str(ws.path), name=name
            )
        )
        records = [{**r, "overrides": cast.overrides(r["index"], r.get("overrides"))} for r in records]
    records = runner.call(key_shots, source, records, track.to_dict(), cfgd, name=name, stems=stem_tracks)
    runner.call(check_workspace, ws.as_dict(), records, video, cfgd, name=name)  # verified + room to write
    film = {"tag": tag, "source": source, "video": video, "dialogue": track.to_dict(), "config": cfgd,
            "stems": {character: t["path"] for character, t in stem_tracks.items()}}  # fmt: skip

    if needs_gpu:  # who speaks where, on the CPU here: GPU workers read the cached face analysis
        decisions = runner.call(
            decide_speakers, video, records, track.to_dict(), cfgd, str(ws.path), name=name
        )
        for r in records:
            r["decision"] = decisions[r["index"]]
    cost = GpuCost.from_config(cfg, needs_gpu=needs_gpu)  # the `dubflow estimate` chunk price
    logger.info("group sizing: %s; load share <= %g", cost.describe(), cost.max_load_share)  # names stand-ins
    n_workers = runner.n_workers()
    groups = plan_groups(
        [ShotCost(r["index"], _shot_cost(cost, r)) for r in records],
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
    reused = reused_shots(shot_rows(ws, records, cfg.backend.name))
    logger.info("%d of %d shot(s) reused (same shot keys as an earlier run)", len(reused), len(records))
    runner.publish(
        publish_shot_table, table_key, shot_rows(ws, records, cfg.backend.name, reused), "shot plan"
    )
    t_prepared = time.monotonic()

    states = runner.run_groups(ws, film, records, groups)
    t_rendered = time.monotonic()
    rows = shot_rows(ws, records, cfg.backend.name, reused)
    runner.publish(publish_shot_table, table_key, rows, "shot states")
    runner.publish(publish_groups, tag, ws, groups, records, states, cost.model_load_s if needs_gpu else 0.0)
    failed = [r for r in rows if r["status"] not in ("done", "copied")]
    if failed:
        first = failed[0]["reason"] or (runner.errors[0] if runner.errors else failed[0]["status"])
        raise ShotsFailed(
            source,
            f"{len(failed)} shot(s) failed {[r['index'] for r in failed]}; first: {first}; re-run to resume",
        )

    audio_path, pad = (mix, mix_action == "pad") if mix else (audio, track.action == "pad")
    paths = [r["output"] for r in rows]
    files = [(read_shot_done(ws, r["index"], r["key"]) or {}).get("result", {}).get("file") for r in records]
    final = runner.call(
        assemble_film, video, paths, out, audio_path, pad, cfgd, str(ws.path), name=name, records=files,
        stamp=output_comment(ws.key, PREVIEW_LABEL if cfg.workspace.preview else None),
    )  # fmt: skip
    timeline = runner.call(export_timeline, final, source, video, records, rows, audio_path, cfgd, name=name)
    per_stage = shot_timings(rows, ws, records)
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
        f"{len(reused)} shot(s) reused from earlier runs, {len(records) - len(reused)} rendered",
        f"edit-suite timeline: {timeline}",
        f"model-load share per group (plan): {100 * min(shares):.1f}-{100 * max(shares):.1f} %",
    ]
    if not needs_gpu:
        notes.append("DRY RUN: passthrough backend, the film is NOT dubbed")
    if cfg.workspace.preview:
        notes.append("PREVIEW PASS (configs/preview.yaml): fast settings, not the final dub")
    runner.publish(
        publish_summary, artifact_key(tag, "summary"), title=f"{name} dubbed{' (PREVIEW)' if cfg.workspace.preview else ''}", output=final,
        timings=timings, notes=notes,
    )  # fmt: skip
    logger.info("%s -> %s in %.1f s", source, final, t_end - t0)
    return final


def _shot_cost(cost: GpuCost, record: dict[str, Any]) -> float:
    """A shot's GPU seconds for group sizing: 0 when planning already knows it is passed through."""
    from tasks.infinitetalk.multi import switch_load_s

    decision = record.get("decision")
    if decision is not None and not decision["dub"]:
        return 0.0
    regions = ((decision or {}).get("details") or {}).get("regions") or []  # two speakers: the multi DiT load
    return cost.shot_s(ShotPlan.from_dict(record["plan"])) + switch_load_s(regions, cost.model_load_s)


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
    plan: str | None = None,
    preview: bool = False,
    overwrite: bool = False,
    stems: dict[str, str] | None = None,
) -> str:
    """Dub `source` with the dialogue track `audio` (and optional final `mix`) into `out`.

    `config` is a (partial) nested config dict applied over `configs/default.yaml`; `out` defaults to
    `out/<stem>.dubbed.mp4` and must resolve under an output root (`flows/outputs.py`, set on the host
    running this flow, never by a parameter); `overwrite` lets it replace an earlier dubflow output of
    another film or pass (never a file dubflow did not write). `fanout`: see the module docstring.
    `plan`: an edited shot plan file (`dubflow plan --out`) whose per-shot overrides apply. `preview`:
    the fast preview pass (`configs/preview.yaml` over `config`, its own workspace). `stems`: {character
    name: dub stem file}, one per character (`dubflow dub --stem NAME=FILE`). The thread pool
    bounds the groups in flight at once in deployments mode (64 GPUs).
    """
    cfg = load_config(updates=config or {}, preview=preview)
    if fanout == "auto":
        fanout = "deployments" if deployment.id else "local"
    if fanout not in ("local", "deployments"):
        raise ConfigError("fanout", f"unknown fan-out {fanout!r} (auto, local or deployments)")
    runner = PrefectRunner(fanout, run_group)
    return run_pipeline(source, audio, out, mix, cfg.to_dict(), runner, plan, overwrite, stems)


def dub_film_inline(
    source: str,
    audio: str,
    out: str | None = None,
    mix: str | None = None,
    config: dict[str, Any] | None = None,
    plan: str | None = None,
    preview: bool = False,
    overwrite: bool = False,
    stems: dict[str, str] | None = None,
) -> str:
    """The same pipeline without Prefect (plain calls, same tasks, same workspace and resume)."""
    cfg = load_config(updates=config or {}, preview=preview)
    return run_pipeline(source, audio, out, mix, cfg.to_dict(), InlineRunner(), plan, overwrite, stems)
