"""`dub-film` and `dub-group`: a film fanned out as groups of consecutive shots, one model load per group.

    dub-film  (deployment dub-film/default, cpu-pool)
      probe -> workspace -> shots -> dialogue -> chunk plans -> shot groups (flows/groups.py)
      ├─ task "group-000 shots 0000-0004" ─> child run dub-group (deployment dub-group/gpu, gpu-pool)
      │                                        ├─ task "shot-0000 00:00:00.000-00:00:02.502" (progress artifact)
      │                                        └─ ...   one backend (model load) for the whole group
      ├─ task "group-001 shots 0005-0009" ─> ...
      └─ wait for every group -> shot table -> assemble (only when every shot is done) -> summary

The flows only orchestrate: the film preparation is `flows/prepare.py`'s `prepare_film` (shared with
`dubflow estimate` and `dubflow plan`; its steps as the film-level tasks of `flows/film_tasks.py`:
`flows/film_steps.py`), the per-shot task in
`flows/shot_task.py`, the group runners in `flows/runners.py`, the shot and group tables in
`flows/report.py`, the workspace and its markers in `tasks/run/workspace.py`, UI artifacts in
`flows/progress.py`, media work in `tasks/`. This module keeps the two flows (the deployments'
entrypoints), the `run_group` task that starts a `dub-group` child run, and the film sequence
(`run_pipeline`: checks, `prepare_film`, `render_groups`, `deliver`). Resume is file based and Prefect based at once: each shot's `done.json` in its result
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
import time
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.deployments import run_deployment
from prefect.futures import wait
from prefect.runtime import deployment, flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.child_runs import ChildNotStarted, await_child
from flows.delivery import Rendered, deliver, publish_film_summary
from flows.film_steps import FlowSteps
from flows.film_tasks import (
    default_output,
    film_tag,
    film_workspace_key,
    timeline_paths,
)
from flows.group_liveness import GroupLost, group_lock_path, outlived_crash
from flows.groups import GpuCost, ShotCost, plan_groups
from flows.prepare import prepare_film
from flows.progress import artifact_key, publish_shot_table
from flows.report import group_report, publish_groups, reused_shots, shot_rows, shot_timings
from flows.review import log_uncertain, review_step
from flows.runners import GPU_POOL, InlineRunner, PrefectRunner, load_group, render_group
from flows.runtime import describe_place, run_logger, where_am_i
from flows.shot_task import BackendSlot, dub_shot, prepare_one_shot, shot_qc
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.decision.cast import check_cast, plan_names
from tasks.decision.plan_file import read_plan, write_plan
from tasks.decision.review import (
    film_turns,
    fresh_plan,
)
from tasks.decision.stems import parse_stems
from tasks.errors import ConfigError, DubflowError
from tasks.media.assemble import check_output_path
from tasks.media.deliver import check_names
from tasks.media.profiles import check_container
from tasks.render.preflight import check_run_config
from tasks.run.inputs import check_inputs_unchanged, input_identity, portable
from tasks.run.outputs import check_overwrite, confine_output
from tasks.run.run_lock import hold_lock
from tasks.run.workspace import (
    Workspace,
    mark_shot_failed,
    read_shot_failed,
    shot_done,
    stable_hash,
)
from tasks.run.workspace_roots import confine_workspace_root, workspace_root
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
    confine_workspace_root(workspace.root, film["source"])  # `ws` is a run parameter too
    backends = BackendSlot.for_config(film["config"])
    where = where_am_i()
    get_run_logger().info("%d shot(s) on %s", len(shots), describe_place(where))

    qcs = []  # the done shots' QC task runs, each beside the next shot's render

    def run_shot(shot: dict[str, Any]) -> BaseException | None:
        done = shot_done(workspace, shot["index"], shot["key"])
        state = dub_shot.with_options(refresh_cache=not done)(ws, film, shot, backends, return_state=True)
        if state.is_completed():
            if (state.result() or {}).get("dubbed"):  # a copied-through shot has no QC
                qcs.append(shot_qc.submit(ws, film, shot))
            return None
        error = state.result(raise_on_failure=False)
        return error if isinstance(error, BaseException) else RuntimeError(state.message or state.name)

    prepare = functools.partial(
        prepare_one_shot, workspace, film, backends=BackendSlot.for_config(film["config"])
    )
    with hold_lock(
        group_lock_path(workspace, shots), f"group of shots {shots[0]['index']:04d}-{shots[-1]['index']:04d}"
    ):
        load = load_group(workspace, film, shots, backends)  # the model load, warmed at the planned sizes
        failed = render_group(workspace, shots, run_shot, prepare)  # the lock: this group is alive
        wait(qcs)  # the last shot's QC (the others ran beside a render)
    if failed:
        first = next(iter(failed.items()))
        raise ShotsFailed(
            film["source"],
            f"{len(failed)} of {len(shots)} shot(s) failed: {list(failed)}; first: shot {first[0]:04d}: "
            f"{first[1]}; retry this run to redo them",
        )
    return {"shots": [s["index"] for s in shots], "model_load_s": backends.load_s, "load": load, **where}


def _group_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    ws = Workspace.from_dict(parameters["ws"])
    keys = stable_hash([s["key"] for s in parameters["shots"]])
    return f"dubflow-{ws.key}-{ws.incarnation}-group-{keys}"


def _retry_lost(_task: Any, _run: Any, state: Any) -> bool:
    """Retry `run_group` only when its group was lost (a dead worker), never for failed shots."""
    return isinstance(state.result(raise_on_failure=False), GroupLost)


@task(
    task_run_name="{name}", cache_key_fn=_group_cache_key, persist_result=True, result_serializer="json",
    retries=1, retry_condition_fn=_retry_lost,
)  # fmt: skip
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
    started, lost = datetime.now(UTC).isoformat(timespec="seconds"), False
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
                outage_s=film["config"]["checks"]["api_outage_s"],
            )  # fmt: skip
            outcome = f"child run {child.name} ({child.id}) ended {child.state.name}"
            ok = child.state.is_completed()
            if not ok and child.state.is_crashed():  # e.g. marked by the heartbeat watch in an outage
                ok = outlived_crash(workspace, shots, child, name)
                lost = not ok
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
        if lost:
            raise GroupLost(
                None, f"{name}: {outcome} and its process is gone; shots not done: {report['failed']}"
            )
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
    can_ask: bool = False,
) -> str:
    """The dub-film sequence (no media math here: every step is a task); `plan`: a shot plan file;
    `stems`: {character: dub stem file} (who speaks when; `audio` stays the track that is muxed).

    1. checks: everything that would fail late is checked first (config, output path, cast, backend);
    2. the film preparation (`flows.prepare.prepare_film` with `FlowSteps`): pixel format, workspace,
       shots, dialogue, chunk plans, cast, keys, the workspace's intermediates and free space, decisions;
    3. the shot groups rendered (`render_groups`); with uncertain turns, `review.enabled` and `can_ask` (a
       deployment run) the run pauses once for them (`review_step`), else they are listed with the plan
       file to edit (`flows.review.log_uncertain`); 4. the film assembled and reported (`deliver`).
    From the workspace's opening to the end the run holds its lock (a second run of the same workspace
    waits, `checks.lock_wait_s`).
    """
    t0 = time.monotonic()
    noted = input_identity([source, audio, mix, plan, *(stems or {}).values()])  # checked before assembling
    cfg, out, stems = _checked(source, audio, out, mix, config, plan, stems, overwrite)
    if plan is None and cfg.review.enabled and Path(film_plan_file(out)).is_file():
        plan = film_plan_file(out)  # an earlier review's answers: the film's plan file
        run_logger(log).info("applying the film's plan file %s (an earlier review's answers)", plan)
        noted = refreshed(noted, plan)
        names = {
            **cfg.cast.names,
            **plan_names(plan),
        }  # its characters: section, as `_checked` reads a plan's
        cfg = dataclasses.replace(cfg, cast=dataclasses.replace(cfg.cast, names=names))
    steps = FlowSteps(runner, cfg, source, out, overwrite, held, mix)
    needs_gpu = cfg.backend.name != "passthrough"
    prepared = prepare_film(source, audio, cfg, steps, stems=stems, plan=plan, decide=needs_gpu)
    assert steps.ws is not None
    film = {
        "tag": film_tag(source), "source": source, "video": prepared.video, "dialogue": prepared.track.to_dict(),
        "config": steps.cfgd, "stems": {character: t["path"] for character, t in prepared.stems.items()},
        "source_identity": portable(noted[source]) if source in noted else None,  # each shot checks it
    }  # fmt: skip
    t_prepared = time.monotonic()
    rendered = render_groups(runner, steps.ws, film, prepared.records, cfg)
    turns = film_turns(prepared.records)
    if turns:  # every shot is rendered (uncertain turns under the policy): ask once, re-render what changed
        plan_path = plan or film_plan_file(out)
        if cfg.review.enabled and can_ask:
            prepared.records = review_step(runner, steps, film, prepared, cfg, turns, plan_path)
            rendered = render_groups(runner, steps.ws, film, prepared.records, cfg)
            noted = refreshed(noted, plan_path)  # the answers went into the plan file
        else:
            if not Path(plan_path).exists():
                fps = Fraction(prepared.video["fps"])
                fresh = fresh_plan(
                    source, audio, fps, prepared.video["frame_count"], prepared.records, film["config"]
                )
                try:
                    write_plan(plan_path, fresh)
                except (
                    OSError,
                    DubflowError,
                ) as exc:  # a listing without a file to edit, never a failed film
                    run_logger(log).warning("%s: plan file not written (%s)", plan_path, exc)
            log_uncertain(turns, Fraction(prepared.video["fps"]), plan_path)
    t_rendered = time.monotonic()
    audio_path, pad = (mix, steps.mix_action == "pad") if mix else (audio, prepared.track.action == "pad")
    check_inputs_unchanged(noted)  # a source or dub replaced while shots rendered: nothing mixed
    final = deliver(
        runner, steps.ws, film, prepared.records, rendered, out, audio_path, pad, cfg, steps.dest, noted
    )  # and again once the final encode has read them, before anything is moved into place
    t_end = time.monotonic()
    timings = {
        "prepare (probe, shots, audio, plan)": t_prepared - t0,
        "render (all groups)": t_rendered - t_prepared,
        "assemble": t_end - t_rendered,
        "total": t_end - t0,
        **rendered.per_stage,
    }
    publish_film_summary(runner, film, prepared.records, rendered, final, timings, cfg)
    logger = run_logger(log)
    rows = rendered.rows
    dubbed = sum(r["status"] == "done" for r in rows)
    logger.info(
        "%d shot(s): %d dubbed, %d not dubbed; %d reused from earlier runs", len(rows), dubbed,
        len(rows) - dubbed, len(rendered.reused),
    )  # fmt: skip
    logger.info("report (every shot, who, why, QC links): %s", final["report"])
    logger.info("%s -> %s in %.1f s", source, final["output"], t_end - t0)
    return final["output"]


def film_plan_file(out: str) -> str:
    """The film's plan file when the run names none: ``<out stem>.plan.yaml`` beside the output."""
    return str(Path(out).with_name(Path(out).stem + ".plan.yaml"))


def refreshed(noted: dict[str, Any], path: str) -> dict[str, Any]:
    """The inputs noted at the start with ``path`` (the plan file the review writes) noted again."""
    return {**{k: v for k, v in noted.items() if k != str(path)}, **input_identity([path])}


def _checked(
    source: str, audio: str, out: str | None, mix: str | None, config: dict[str, Any], plan: str | None,
    stems: dict[str, str] | None, overwrite: bool = False,
) -> tuple[PipelineConfig, str, dict[str, str]]:  # fmt: skip
    """Before any work (nothing probed, decoded or created yet): the config (with the plan's character
    names), the backend and its options, the output path and every file it delivers, the cast."""
    cfg = PipelineConfig.from_dict(config)
    # every process of the run (group runs on other hosts too) sees the one resolved workspace root
    root = confine_workspace_root(workspace_root(cfg), source)  # a run parameter: confined like `out`
    cfg = dataclasses.replace(cfg, workspace=dataclasses.replace(cfg.workspace, root=str(root)))
    out = out or default_output(source)
    check_output_path(out, source, audio, mix)
    check_container(cfg.encode, out)
    check_run_config(cfg)  # the backend's own options too: none fails first on a worker
    stems = parse_stems(stems, "stems")
    if plan:  # a malformed plan fails here (its shots are checked against the film's once they are found);
        read_plan(plan)  # its characters: section names the automatic clusters
        cfg = dataclasses.replace(
            cfg, cast=dataclasses.replace(cfg.cast, names={**cfg.cast.names, **plan_names(plan)})
        )
    check_cast(cfg, stems)  # stills exist, stems and undub name characters: before any work
    sidecars = timeline_paths(out, cfg.to_dict())
    check_names([out, *sidecars])  # its record, lock, staging names fit too
    out = str(confine_output(out, source))  # resolved, under an output root, not a foreign file
    key = film_workspace_key(source, cfg)  # the claim checks again, under the output's locks
    for target in (out, *timeline_paths(out, cfg.to_dict())):
        check_overwrite(target, key, overwrite, Path(out).name)
    return cfg, out, stems


def render_groups(
    runner: Any, ws: Workspace, film: dict[str, Any], records: list[dict[str, Any]], cfg: PipelineConfig
) -> Rendered:
    """Size the shot groups by their GPU price, publish the shot plan, run every group, publish the shot
    states; ShotsFailed (after every group ran) naming the shots that did not finish."""
    logger, name, needs_gpu = run_logger(log), Path(film["source"]).name, cfg.backend.name != "passthrough"
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
    table_key = artifact_key(film["tag"], "shots")
    reused = reused_shots(shot_rows(ws, records, cfg.backend.name))
    started = _part_done(ws, records, reused)
    if reused or started:  # the line a resumed run starts with
        part = ", ".join(f"shot {i:04d} at chunk {n + 1}" for i, n in started.items())
        logger.info(
            "resuming %s: %d of %d shot(s) reused (done by an earlier run, same shot keys)%s", name,
            len(reused), len(records), f"; resuming part-way: {part}" if part else "",
        )  # fmt: skip
    runner.publish(
        publish_shot_table, table_key, shot_rows(ws, records, cfg.backend.name, reused), "shot plan"
    )
    states = runner.run_groups(ws, film, records, groups)
    rows = shot_rows(ws, records, cfg.backend.name, reused)
    runner.publish(publish_shot_table, table_key, rows, "shot states")
    load_s = cost.model_load_s if needs_gpu else 0.0
    runner.publish(publish_groups, film["tag"], ws, groups, records, states, load_s)
    failed = [r for r in rows if r["status"] not in ("done", "copied")]
    if failed:
        first = failed[0]["reason"] or (runner.errors[0] if runner.errors else failed[0]["status"])
        raise ShotsFailed(
            film["source"],
            f"{len(failed)} shot(s) failed {[r['index'] for r in failed]}; first: {first}; re-run to resume",
        )
    return Rendered(rows, groups, shares, reused, shot_timings(rows, ws, records))


def _part_done(ws: Workspace, records: list[dict[str, Any]], reused: set[int]) -> dict[int, int]:
    """{shot index: chunks checkpointed} of the shots an earlier run left part-way (markers counted, not
    verified: the render verifies them before resuming)."""
    out = {}
    for r in records:
        if r["index"] not in reused:
            folder = ws.shot_dir(r["index"], r["key"]) / "shot.chunks"
            n = len(list(folder.glob("chunk_*.done"))) if folder.is_dir() else 0
            if n:
                out[r["index"]] = n
    return out


def _shot_cost(cost: GpuCost, record: dict[str, Any]) -> float:
    """A shot's GPU seconds for group sizing: 0 when planning already knows it is passed through."""
    decision = record.get("decision")
    if decision is not None and not decision["dub"]:
        return 0.0
    # its dubbed regions (two speakers: the multi DiT load): the planning's record, or a ShotDecision dict
    decision = decision or {}
    regions = decision.get("regions") or (decision.get("details") or {}).get("regions") or []
    return cost.shot_s(ShotPlan.from_dict(record["plan"]), regions)


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
    `out/<stem>.dubbed.mp4` and must resolve under an output root (`tasks/run/outputs.py`, set on the host
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
    return run_pipeline(
        source, audio, out, mix, cfg.to_dict(), runner, plan, overwrite, stems, can_ask=bool(deployment.id)
    )


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
