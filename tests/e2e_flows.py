"""Test-only flows with dubflow's deployment shape, the GPU work faked as sleep + file writes.

``e2e-film/default`` (cpu-pool) opens a workspace, plans shot groups with ``plan_groups`` for the
online gpu workers, and fans each group out as a child run of ``e2e-group/gpu`` (gpu-pool) through a
cached wrapper task around ``run_deployment``. Inside a group every shot is its own task run, cached on
``Workspace.shot_cache_key`` and skipped when its ``done.json`` exists; a failing shot never stops the
others. The film run ends Failed naming the failed shots, and assembles only when every shot is done.
The real flows (``flows/dub_film.py``) follow the same pattern; ``tests/test_stack.py`` drives these.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import WorkerStatus
from prefect.deployments import run_deployment
from prefect.futures import wait
from prefect.runtime import task_run
from prefect.task_runners import ThreadPoolTaskRunner

from flows.groups import Group, ShotCost, plan_groups
from flows.progress import ShotProgress, artifact_key, publish_shot_table, publish_summary, shot_run_name
from flows.workspace import (
    Workspace,
    atomic_path,
    atomic_write_bytes,
    mark_shot_done,
    mark_shot_failed,
    open_workspace,
    read_shot_done,
    read_shot_failure,
    shot_done,
    stable_hash,
)

GROUP_DEPLOYMENT = "e2e-group/gpu"
GPU_POOL = "gpu-pool"
FPS = 25


def _append(path: Path, line: str) -> None:
    """Proof of real executions for the tests (O_APPEND lines are atomic across processes)."""
    with path.open("a") as fh:
        fh.write(line + "\n")


def _shot_cache_key(_context, parameters) -> str:
    shot = parameters["shot"]
    return Workspace.from_dict(parameters["ws"]).shot_cache_key(shot["index"], shot["plan_hash"])


def _shot_name() -> str:
    shot = task_run.parameters["shot"]
    return shot_run_name(shot["index"], shot["start_s"], shot["end_s"])


@task(task_run_name=_shot_name, cache_key_fn=_shot_cache_key, persist_result=True)
def render_shot(ws: dict, shot: dict, film_tag: str, fail_once: bool = False) -> str:
    """Fake GPU unit of one shot: chunks of sleep, a checkpoint and a progress update per chunk."""
    workspace, index = Workspace.from_dict(ws), shot["index"]
    if shot_done(workspace, index, shot["plan_hash"]):  # belt and braces behind the Prefect cache
        return read_shot_done(workspace, index)["output"]
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    get_run_logger().info("shot %04d on CUDA_VISIBLE_DEVICES=%r", index, gpu)
    _append(workspace.path / "attempts.log", f"{index} {gpu}")
    progress = ShotProgress(artifact_key(film_tag, "shot", f"{index:04d}"), f"shot {index:04d} of {film_tag}")
    failed_marker = workspace.shot_dir(index) / "injected-failure"
    for chunk in range(shot["chunks"]):
        if fail_once and chunk == shot["chunks"] // 2 and not failed_marker.exists():
            failed_marker.touch()  # a transient fault: the next attempt passes
            raise RuntimeError(f"CUDA out of memory (injected) in shot {index:04d}")
        time.sleep(shot["chunk_s"])
        atomic_write_bytes(workspace.chunk_dir(index) / f"{chunk:03d}.txt", f"chunk {chunk}\n".encode())
        progress((chunk + 1) / shot["chunks"])
    output = workspace.shot_dir(index) / "shot.txt"
    with atomic_path(output) as tmp:
        tmp.write_text(f"shot {index} gpu={gpu}\n")
    mark_shot_done(workspace, index, {"plan_hash": shot["plan_hash"], "output": str(output)})  # last
    _append(workspace.path / "completions.log", f"{index} {gpu}")
    return str(output)


@flow(name="e2e-group", persist_result=True)
def e2e_group(ws: dict, shots: list[dict], film_tag: str, fail_once: list[int] | None = None) -> list[int]:
    """One child run: the group's shots in order on this worker's GPU; failures are collected."""
    workspace, failed = Workspace.from_dict(ws), []
    for shot in shots:
        state = render_shot(
            ws, shot, film_tag, fail_once=shot["index"] in (fail_once or []), return_state=True
        )
        if not state.is_completed():
            reason = str(state.result(raise_on_failure=False))
            mark_shot_failed(workspace, shot["index"], reason)
            failed.append(shot["index"])
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(shots)} shot(s) failed: {failed}")
    return [shot["index"] for shot in shots]


def _group_cache_key(_context, parameters) -> str:
    ws = Workspace.from_dict(parameters["ws"])
    return f"dubflow-{ws.key}-{ws.incarnation}-group-{stable_hash([s['plan_hash'] for s in parameters['shots']])}"


@task(task_run_name="{name}", cache_key_fn=_group_cache_key, persist_result=True)
def run_group(ws: dict, shots: list[dict], film_tag: str, name: str, fail_once: list[int]) -> list[int]:
    """Run one group as a child deployment run; cached, so a re-run creates no child for done groups."""
    workspace = Workspace.from_dict(ws)
    if all(shot_done(workspace, s["index"], s["plan_hash"]) for s in shots):
        return [s["index"] for s in shots]  # done by an earlier run or a retried child: no child run
    child = run_deployment(
        GROUP_DEPLOYMENT,
        parameters={"ws": ws, "shots": shots, "film_tag": film_tag, "fail_once": fail_once},
        flow_run_name=name,
        timeout=None,
        poll_interval=1,
        as_subflow=True,
    )
    missing = [s["index"] for s in shots if not shot_done(workspace, s["index"], s["plan_hash"])]
    if not child.state.is_completed() or missing:
        raise RuntimeError(
            f"{name}: child run {child.name} ended {child.state.type.value}; not done: {missing}"
        )
    return [s["index"] for s in shots]


def online_workers(pool: str) -> int:
    """Online workers polling ``pool`` (at least 1, so planning works before workers report)."""
    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    return max(1, sum(w.status == WorkerStatus.ONLINE for w in workers))


def _plan_shots(n_shots: int, chunks: int, chunk_s: float, frames_per_shot: int) -> list[dict]:
    shots = []
    for i in range(n_shots):
        shot = {
            "index": i,
            "start_s": i * frames_per_shot / FPS,
            "end_s": (i + 1) * frames_per_shot / FPS,
            "frames": frames_per_shot,
            "chunks": chunks,
            "chunk_s": chunk_s,
            "backend": "fake",
        }
        shots.append({**shot, "plan_hash": stable_hash(shot)})
    return shots


def _status(ws: Workspace, shot: dict) -> dict:
    if shot_done(ws, shot["index"], shot["plan_hash"]):
        return {**shot, "status": "done"}
    return {**shot, "status": "failed", "reason": read_shot_failure(ws, shot["index"]) or "not run"}


@flow(name="e2e-film", flow_run_name="dub-{film_tag}", task_runner=ThreadPoolTaskRunner(max_workers=16))
def e2e_film(
    film: str,
    film_tag: str,
    n_shots: int = 6,
    chunks: int = 2,
    chunk_s: float = 0.2,
    est_shot_s: float = 10.0,
    model_load_s: float = 2.0,
    fail_once: list[int] | None = None,
    code_version: str | None = None,
) -> str:
    """Parent run: plan, fan the groups out, report, assemble only when every shot is done."""
    t0 = time.monotonic()
    root = os.environ.get("DUBFLOW_WORKSPACE", "workspace")
    config = {"n_shots": n_shots, "chunks": chunks, "chunk_s": chunk_s}
    ws = open_workspace(root, film, config, version=code_version)
    shots = _plan_shots(n_shots, chunks, chunk_s, frames_per_shot=50)
    groups: list[Group] = plan_groups(
        [ShotCost(s["index"], est_shot_s) for s in shots],
        n_workers=online_workers(GPU_POOL),
        model_load_s=model_load_s,
    )
    table_key = artifact_key(film_tag, "shots")
    planned = [
        {**s, "status": "done" if shot_done(ws, s["index"], s["plan_hash"]) else "planned"} for s in shots
    ]
    publish_shot_table(table_key, planned, "shot plan")
    t_plan = time.monotonic()

    futures = []
    for group in groups:
        members = [shots[i] for i in group.shots]
        all_done = all(shot_done(ws, s["index"], s["plan_hash"]) for s in members)
        futures.append(
            run_group.with_options(refresh_cache=not all_done).submit(
                ws.as_dict(), members, film_tag, group.name, fail_once or []
            )
        )
    wait(futures)  # always wait: unresolved futures are not awaited (recipe G6)
    t_render = time.monotonic()

    rows = [_status(ws, s) for s in shots]
    publish_shot_table(table_key, rows, "shot states")
    failed = [r["index"] for r in rows if r["status"] != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} shot(s) failed: {failed}; re-run the deployment to resume")

    output = ws.path / "out" / f"{film_tag}.txt"
    with atomic_path(output) as tmp:
        tmp.write_text("".join(Path(read_shot_done(ws, s["index"])["output"]).read_text() for s in shots))
    timings = {"plan": t_plan - t0, "render": t_render - t_plan, "assemble": time.monotonic() - t_render}
    publish_summary(
        artifact_key(film_tag, "summary"), title=f"{film_tag} dubbed", output=output, timings=timings
    )
    return str(output)
