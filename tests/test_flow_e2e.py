"""End to end on the real stack: `prefect deployment run dub-film/default` on a 4-shot clip.

Server, pools, deployments (prefect.yaml), one cpu worker and two "gpu" workers run as subprocesses
(`dub_stack` in conftest.py, driven by scripts/stack.sh). The pass-through backend keeps the media work
small, so what is measured is the orchestration: the film run fans two shot groups out to the two gpu
workers, a fault injected into one shot fails its group and the film (which names the shot), a retry
of the failed group redoes only that shot, and re-running the deployment without the fault renders
only that shot and assembles the film with the source's frame count.
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import time
from pathlib import Path

import pytest

from flows.progress import attempt_phases
from tasks.files import read_json
from tasks.media.probe import probe
from tasks.run.workspace import Workspace, read_attempts, read_shot_done
from tests.media import make_audio, make_clip
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FILM = "dub-film/default"
CONFIG = {
    "backend": {"name": "passthrough"},
    "plan": {"frame_num": 5, "motion_frames": 1},  # several chunks per shot: the progress moves per chunk
    "encode": {"preset": "veryfast"},
}


def _workspace(stack: Stack, stem: str) -> Workspace:
    (path,) = stack.workspace.glob(f"{stem}-*")
    manifest = read_json(path / "workspace.json")
    return Workspace(root=str(stack.workspace), key=manifest["key"], incarnation=manifest["incarnation"])


def _group_runs(stack: Stack, ws: Workspace) -> list:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with stack.client() as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["dub-group"])), sort=FlowRunSort.START_TIME_ASC
        )
    return [r for r in runs if r.parameters["ws"]["key"] == ws.key]


def _task_runs(stack: Stack, flow_run_id) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with stack.client() as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def _artifact(stack: Stack, key: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with stack.client() as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key!r}"
    return max(found, key=lambda a: a.created)


def _wait_final(stack: Stack, flow_run_id, run_count: int, timeout_s: float = 240) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with stack.client() as client:
            run = client.read_flow_run(flow_run_id)
        if run.state.is_final() and run.run_count >= run_count:
            return run
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} not final after {timeout_s} s: {run.state}\n{stack.logs()}")


def _attempt_times(stack: Stack, runs: list) -> list[dict]:
    """Per attempt of each group run: worker pickup, process start and run time, from its states."""
    with stack.client() as client:
        return [a for run in runs for a in attempt_phases(client.read_flow_run_states(run.id))]


def test_film_deployment_fans_out_fails_one_shot_and_resumes_only_it(dub_stack: Stack, tmp_path: Path):
    stack = dub_stack
    if stack.sh("status", check=False).returncode != 0:  # e.g. the stop test ran first
        stack.sh("start")
    clip = make_clip(tmp_path / "Four Shots.mp4", (12, 12, 12, 12), audio_channels=None)
    info = probe(clip)
    dub = make_audio(tmp_path / "dub.wav", info.video_duration_s)
    out = tmp_path / "out" / "four-shots.dubbed.mp4"
    params = {"source": str(clip), "audio": str(dub), "out": str(out)}

    # 1. Shot 1 fails half-way: its group and the film fail, naming it; the other shots complete.
    first = stack.run_deployment(FILM, {**params, "config": {**CONFIG, "debug": {"fail_shots": [1]}}})
    assert first.rc == 1, first.output
    with stack.client() as client:
        film_run = client.read_flow_run(first.flow_run_id)
    assert film_run.state.is_failed() and "1 shot(s) failed [1]" in film_run.state.message
    ws = _workspace(stack, "four-shots")
    attempts = read_attempts(ws)
    assert sorted((a["shot"], a["status"]) for a in attempts) == [
        (0, "done"), (1, "failed"), (2, "done"), (3, "done")
    ]  # fmt: skip
    assert "InjectedFault" in next(a["reason"] for a in attempts if a["status"] == "failed")

    # Two groups, one per gpu worker: each group run records its worker, and both workers took one.
    groups = _group_runs(stack, ws)
    assert sorted(g.name for g in groups) == ["group-000 shots 0000-0001", "group-001 shots 0002-0003"]
    assert {g.name[:9]: g.state.type.value for g in groups} == {
        "group-000": "FAILED",
        "group-001": "COMPLETED",
    }
    worker_of = {a["shot"]: a["worker"] for a in attempts}
    assert worker_of[0] == worker_of[1] != worker_of[2] == worker_of[3]
    assert {worker_of[0], worker_of[2]} == {w for w in worker_of.values() if w.startswith("gpu-")}
    assert {g.work_pool_name for g in groups} == {"gpu-pool"} and {a["host"] for a in attempts} == {
        socket.gethostname()
    }

    # The UI: shot task runs named after their spans, a progress artifact per shot, the shot table.
    group0 = next(g for g in groups if g.name.startswith("group-000"))
    shot_tasks = sorted((t.name, t.state.name) for t in _task_runs(stack, group0.id))
    assert [state for _, state in shot_tasks] == ["Completed", "Failed"]
    # 12 frames at 24000/1001 fps = 0.5005 s per shot (end exclusive; ms rounding may go either way)
    assert re.fullmatch(r"shot-0000 00:00:00\.000-00:00:00\.50[01]", shot_tasks[0][0]), shot_tasks
    assert re.fullmatch(r"shot-0001 00:00:00\.50[01]-00:00:01\.001", shot_tasks[1][0]), shot_tasks
    table = {row["shot"]: row for row in json.loads(_artifact(stack, "four-shots-shots").data)}
    assert [table[s]["status"] for s in sorted(table)] == ["copied", "failed", "copied", "copied"]  # dry run
    assert "InjectedFault" in table["0001"]["reason"] and table["0003"]["frames"] == 12
    assert _artifact(stack, "four-shots-shot-0000").data == 100.0
    assert 0 < _artifact(stack, "four-shots-shot-0001").data < 100  # failed half-way

    # 2. Retry of the failed group run (the UI's Retry button): shot 0 is Cached, only shot 1 runs
    # again (and fails again: the fault is still in this run's parameters).
    retry = stack.prefect("flow-run", "retry", str(group0.id))
    assert retry.returncode == 0, retry.stdout + retry.stderr
    group0 = _wait_final(stack, group0.id, run_count=2)
    assert group0.state.is_failed()
    states = sorted((t.name[:9], t.state.name) for t in _task_runs(stack, group0.id))
    assert states == [
        ("shot-0000", "Cached"),
        ("shot-0000", "Completed"),
        ("shot-0001", "Failed"),
        ("shot-0001", "Failed"),
    ]
    assert [(a["shot"], a["status"]) for a in read_attempts(ws)][4:] == [(1, "failed")]

    # 3. Re-running the deployment without the fault renders shot 1 only, in one new group run (the
    # done group starts none), and assembles the film.
    second = stack.run_deployment(FILM, {**params, "config": CONFIG})
    assert second.rc == 0, second.output + stack.logs()
    assert [(a["shot"], a["status"]) for a in read_attempts(ws)][5:] == [(1, "done")]
    groups = _group_runs(stack, ws)
    assert len(groups) == 3 and groups[-1].name.startswith("group-000") and groups[-1].state.is_completed()
    film_tasks = {t.name: t.state.name for t in _task_runs(stack, second.flow_run_id)}
    assert film_tasks["group-001 shots 0002-0003"] == "Cached"
    o = probe(out)
    assert (o.frame_count, o.fps, o.width, o.height) == (info.frame_count, info.fps, info.width, info.height)
    assert str(out) in _artifact(stack, "four-shots-summary").data

    # Orchestration overhead, printed for docs/gpu_pool.md (loose sanity bound only).
    times = _attempt_times(stack, groups)
    assert len(times) == 4  # 2 group runs, 1 retry, 1 group run of the resumed film
    med = {k: round(statistics.median(t[k] for t in times), 2) for k in times[0]}
    render = statistics.median(a["seconds"] for a in read_attempts(ws))
    print(
        f"\ngroup-run attempts: {len(times)}, medians {med}; render per shot (pass-through) {render:.2f} s\n"
        f"film runs: failing {first.wall_s:.1f} s, resume {second.wall_s:.1f} s (CLI wall incl. watch)"
    )
    assert all(t["pickup_s"] + t["start_s"] < 120 for t in times)


def test_two_gpu_workers_dub_groups_concurrently_with_one_model_load_each(dub_stack: Stack, tmp_path: Path):
    """The InfiniteTalk backend in tiny mode (random weights, CPU): the film's two shot groups run as
    two dub-group runs, one on each gpu worker, at the same time; every shot is dubbed and each group
    process loads the models once (its first shot pays the load, the next reuses the resident set)."""
    stack = dub_stack
    if stack.sh("status", check=False).returncode != 0:  # e.g. the stop test ran first
        stack.sh("start")
    clip = make_clip(tmp_path / "Tiny Talk.mp4", (8, 8, 8, 8), size=(64, 64), audio_channels=None)
    info = probe(clip)
    dub = make_audio(tmp_path / "dub.wav", info.video_duration_s)
    out = tmp_path / "out" / "tiny-talk.dubbed.mp4"
    config = {
        "backend": {"name": "infinitetalk"},
        "infinitetalk": {"weights": None, "mode": "tiny", "device": "cpu", "steps": 1},
        "plan": {"frame_num": 5, "motion_frames": 1},
        "gate": {"policy": "all", "require_face": False},
        "region": {"mode": "full"},
        "qc": {"enabled": False},
        "encode": {"preset": "veryfast"},
        # a load share no grouping can meet: plan_groups falls back to one group per online worker (2)
        "cost": {"max_load_share": 0.0001},
    }
    run = stack.run_deployment(
        FILM, {"source": str(clip), "audio": str(dub), "out": str(out), "config": config}
    )
    assert run.rc == 0, run.output + stack.logs()
    ws = _workspace(stack, "tiny-talk")

    # Two group runs of two shots each, both completed, one on each gpu worker.
    groups = _group_runs(stack, ws)
    assert sorted(g.name for g in groups) == ["group-000 shots 0000-0001", "group-001 shots 0002-0003"]
    assert all(g.state.is_completed() and g.work_pool_name == "gpu-pool" for g in groups)
    attempts = read_attempts(ws)
    assert sorted((a["shot"], a["status"]) for a in attempts) == [(s, "done") for s in range(4)]
    worker_of = {a["shot"]: a["worker"] for a in attempts}
    assert worker_of[0] == worker_of[1] != worker_of[2] == worker_of[3]
    assert all(w.startswith("gpu-") for w in worker_of.values())

    # Concurrency: the two group runs were running at the same time (Prefect's run start/end times).
    (a, b) = groups
    assert max(a.start_time, b.start_time) < min(a.end_time, b.end_time), [
        (g.name, g.start_time, g.end_time) for g in groups
    ]

    # Every shot dubbed by the tiny InfiniteTalk model (not copied, not skipped).
    key_of = {a["shot"]: a["key"] for a in attempts}
    done = {s: read_shot_done(ws, s, key_of[s])["result"] for s in range(4)}
    assert all(r["dubbed"] and r["backend"] == "infinitetalk" and r["tiny"] for r in done.values()), done

    # One model load per group process: one pid per group, and within it only the first shot spends
    # time in `load` (the second gets the resident DiT/VAE/CLIP: a dictionary lookup, ~0 s).
    pid_of = {a["shot"]: a["pid"] for a in attempts}
    assert pid_of[0] == pid_of[1] != pid_of[2] == pid_of[3], pid_of
    load = {s: r["timings_s"]["load"] for s, r in done.items()}
    for first, second in ((0, 1), (2, 3)):
        # a reload takes >= 0.05 s (the first shot's); a lookup stays far below it even on a loaded box
        assert load[first] >= 0.05 and load[second] < min(0.05, load[first] / 10), load

    # The film is assembled with the source's frame count, rate and size.
    o = probe(out)
    assert (o.frame_count, o.fps, o.width, o.height) == (info.frame_count, info.fps, info.width, info.height)
    print(
        f"\ntiny InfiniteTalk film: {run.wall_s:.1f} s (CLI wall); load per shot {load}; "
        f"render per shot {[a['seconds'] for a in attempts]}"
    )
