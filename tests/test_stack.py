"""End to end on the real stack: server, pools, deployments, one cpu worker and two "gpu" workers.

Drives the test-only flows of ``tests/e2e_flows.py`` (film on cpu-pool fanning shot groups out to
gpu-pool) through ``scripts/stack.sh``, and checks sharing of the children between workers, failure
isolation, resume by re-running the deployment, a retry of one failed child run, the UI artifacts, and
that start is idempotent and stop leaves no process behind.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from tests.stack import Stack, running_stack, stack_processes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

FILM = "e2e-film/default"
CODE_VERSION = "e2e"  # pinned: other commits landing between runs must not change the workspace key
# 4 shots of 50 frames at 25 fps, 2 chunks of 0.3 s each; est 10 s per shot and a 2 s model load give
# groups of 2 shots (2 shots = 20 s of work >= 2 s * 0.9 / 0.1 = 18 s): [0,1] [2,3], one per worker.
PARAMS = {"n_shots": 4, "chunks": 2, "chunk_s": 0.3, "est_shot_s": 10.0, "model_load_s": 2.0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with running_stack(tmp_path_factory.mktemp("stack"), prefect_file="tests/e2e_prefect.yaml") as s:
        yield s


def _log(stack: Stack, film_tag: str, name: str) -> list[tuple[int, str]]:
    """(shot, CUDA_VISIBLE_DEVICES) lines the fake GPU work appended in the film's workspace."""
    (ws,) = stack.workspace.glob(f"{film_tag}-*")
    path = ws / name
    if not path.exists():
        return []
    return [(int(i), gpu) for i, gpu in (line.split(" ") for line in path.read_text().splitlines())]


def _child_runs(stack: Stack, film_tag: str) -> list:
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with stack.client() as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["e2e-group"])))
    return [r for r in runs if r.parameters.get("film_tag") == film_tag]


def _artifact(stack: Stack, key: str):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with stack.client() as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key!r}"
    return max(found, key=lambda a: a.created)


def _attempts(stack: Stack, runs: list) -> list[dict]:
    """Per attempt of each child run: pickup (Scheduled->Pending), process start (Pending->Running)
    and run time (Running->final), from the runs' state histories (a retry is a new attempt)."""
    out = []
    with stack.client() as client:
        for run in runs:
            current: dict = {}
            for state in sorted(client.read_flow_run_states(run.id), key=lambda s: s.timestamp):
                kind = state.type.value
                if kind == "SCHEDULED":
                    current = {kind: state.timestamp}
                elif kind in ("PENDING", "RUNNING"):
                    current.setdefault(kind, state.timestamp)
                elif state.is_final() and {"SCHEDULED", "PENDING", "RUNNING"} <= set(current):
                    out.append(
                        {
                            "pickup_s": (current["PENDING"] - current["SCHEDULED"]).total_seconds(),
                            "start_s": (current["RUNNING"] - current["PENDING"]).total_seconds(),
                            "run_s": (state.timestamp - current["RUNNING"]).total_seconds(),
                            "state": kind,
                        }
                    )
                    current = {}
    return out


def test_fanout_shares_workers_isolates_failures_and_resumes(stack: Stack, tmp_path: Path):
    film = tmp_path / "Film A.mp4"
    film.write_bytes(b"not really a film" * 1000)
    params = {"film": str(film), "film_tag": "film-a", "code_version": CODE_VERSION, **PARAMS}

    # 1. Shots 0 and 2 fail once (the first shot of each group): the others still complete.
    first = stack.run_deployment(FILM, {**params, "fail_once": [0, 2]})
    assert first.rc == 1, first.output
    assert sorted(i for i, _ in _log(stack, "film-a", "attempts.log")) == [0, 1, 2, 3]
    assert sorted(i for i, _ in _log(stack, "film-a", "completions.log")) == [1, 3]
    # The two groups ran on the two gpu workers, each pinned to its own device.
    assert {gpu for _, gpu in _log(stack, "film-a", "attempts.log")} == {"0", "1"}
    children = _child_runs(stack, "film-a")
    assert sorted(r.name for r in children) == ["group-000 shots 0000-0001", "group-001 shots 0002-0003"]
    assert [r.state.type.value for r in children] == ["FAILED", "FAILED"]

    # The film's shot table names the failed shots and why; each shot has a progress artifact.
    table = json.loads(_artifact(stack, "film-a-shots").data)
    status = {row["shot"]: (row["status"], row["reason"]) for row in table}
    assert [s for s, (st, _) in sorted(status.items()) if st == "failed"] == ["0000", "0002"]
    assert "CUDA out of memory (injected) in shot 0002" in status["0002"][1]
    assert _artifact(stack, "film-a-shot-0001").data == 100.0
    assert _artifact(stack, "film-a-shot-0002").data == 50.0  # failed after its first of two chunks

    # Every shot is a task run named after its index and time range (50 frames at 25 fps = 2 s).
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with stack.client() as client:
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id for r in children]))
        )
    assert "shot-0001 00:00:02.000-00:00:04.000" in {t.name for t in tasks}

    # 2. Retry of one failed child run (the UI's Retry button) redoes only its failed shot.
    (group0,) = [r for r in children if r.name.startswith("group-000")]
    retry = stack.prefect("flow-run", "retry", str(group0.id))
    assert retry.returncode == 0, retry.stdout + retry.stderr
    _wait_final(stack, group0.id)
    with stack.client() as client:
        group0 = client.read_flow_run(group0.id)
    assert group0.state.is_completed() and group0.run_count == 2
    assert [i for i, _ in _log(stack, "film-a", "attempts.log")][4:] == [0]
    with stack.client() as client:
        group0_tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[group0.id]))
        )
    shot1_states = {t.state.name for t in group0_tasks if t.name.startswith("shot-0001")}
    assert shot1_states == {"Completed", "Cached"}  # the retry hit the Prefect cache, not only done.json

    # 3. Re-running the film resumes: only shot 2 runs again, in one new child run (group 1); the film
    # is assembled. Group 0 (done by the retry) starts no child.
    second = stack.run_deployment(FILM, {**params, "fail_once": [0, 2]})
    assert second.rc == 0, second.output
    assert [i for i, _ in _log(stack, "film-a", "attempts.log")][4:] == [0, 2]
    assert len(_child_runs(stack, "film-a")) == 3
    (ws,) = stack.workspace.glob("film-a-*")
    lines = (ws / "out" / "film-a.txt").read_text().splitlines()
    assert [int(line.split()[1]) for line in lines] == [0, 1, 2, 3]
    summary = _artifact(stack, "film-a-summary").data
    assert str(ws / "out" / "film-a.txt") in summary

    # Orchestration overhead per child run on this box (printed for the record; loose sanity bound).
    attempts = _attempts(stack, _child_runs(stack, "film-a"))
    assert len(attempts) == 4  # 2 first attempts, 1 retry, 1 child of the resumed film
    medians = {
        k: round(statistics.median(a[k] for a in attempts), 2) for k in ("pickup_s", "start_s", "run_s")
    }
    print(f"\nchild-run attempts: {len(attempts)}, medians {medians} (fake GPU work <= 1.2 s per attempt)")
    print(f"film runs: failing {first.wall_s:.1f} s, resume {second.wall_s:.1f} s (CLI wall, incl. watch)")
    assert all(a["pickup_s"] + a["start_s"] < 120 for a in attempts)


def _wait_final(stack: Stack, flow_run_id, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with stack.client() as client:
            run = client.read_flow_run(flow_run_id)
        if run.state.is_final() and run.run_count >= 2:
            return
        time.sleep(1)
    raise AssertionError(f"flow run {flow_run_id} not final after {timeout_s} s: {run.state}\n{stack.logs()}")


def test_start_twice_keeps_processes_and_status_reports_them(stack: Stack):
    before = stack.pid_files()
    assert set(before) == {"server", "cpu", "gpu-0", "gpu-1"}
    again = stack.sh("start")
    assert "already running" in again.stderr
    assert stack.pid_files() == before
    status = stack.sh("status")
    assert status.stderr.count("running (pid") == 4


def test_stop_ends_every_process(stack: Stack):
    """Runs last (file order): stop the module's stack and check nothing of it is left."""
    assert stack_processes(stack.home)
    stack.sh("stop", timeout=90)
    assert stack_processes(stack.home) == []
    assert stack.pid_files() == {}
    assert stack.sh("status", check=False).returncode != 0
