"""A group run marked Crashed while its process still renders (the server was away and its heartbeat
watch fired) is waited for and judged by its shots' markers; a really lost one is reported lost
(issue 26, class 7). Real Prefect test server, real flock held by a live thread. The fault run with
server restarts and a killed worker is `benchmarks/fault_run.py` (benchmarks/RESULTS.md)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _shots(ws, n: int) -> list[dict]:
    from tasks.run.workspace import mark_shot_done

    shots = [{"index": i, "key": f"k{i}"} for i in range(n)]
    for shot in shots[:-1]:  # all but the last are done
        out = ws.shot_dir(shot["index"], shot["key"]) / "shot.mkv"
        out.parent.mkdir(parents=True)
        out.write_bytes(b"x" * 10)
        mark_shot_done(ws, shot["index"], shot["key"], {"output": str(out), "result": {"file": {"size": 10}}})
    return shots


def _crashed_run():
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    @flow(name="outage-group")
    def group() -> None:
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(group)
        client.set_flow_run_state(run.id, Crashed(message="no heartbeat (test)"), force=True)
        return client.read_flow_run(run.id)


def _crashed_group(tmp: Path):
    """(workspace, its 3 shots with the last not done, their group's run marked Crashed)."""
    from tasks.run.workspace import open_workspace

    film = tmp / "film.mp4"
    film.write_bytes(b"film")
    ws = open_workspace(tmp / "ws", film, {"pass": "quality"})
    return ws, _shots(ws, 3), _crashed_run()


def test_a_crashed_but_live_group_is_waited_for_and_a_dead_one_is_lost(tmp_path: Path):
    from prefect.client.orchestration import get_client

    from flows.group_liveness import group_alive, group_lock_path, outlived_crash
    from tasks.run.run_lock import hold_lock
    from tasks.run.workspace import mark_shot_done

    ws, shots, child = _crashed_group(tmp_path)
    assert not group_alive(ws, shots)
    assert outlived_crash(ws, shots, child, "group-000", poll_s=0.1) is False  # gone, a shot not done: lost

    held, release = threading.Event(), threading.Event()

    def live_group() -> None:  # the group process: holds its lock, finishes its last shot, ends
        with hold_lock(group_lock_path(ws, shots), "group"):
            held.set()
            release.wait(10)
            last = shots[-1]
            out = ws.shot_dir(last["index"], last["key"]) / "shot.mkv"
            out.parent.mkdir(parents=True)
            out.write_bytes(b"y" * 10)
            mark_shot_done(
                ws, last["index"], last["key"], {"output": str(out), "result": {"file": {"size": 10}}}
            )

    thread = threading.Thread(target=live_group)
    thread.start()
    held.wait(10)
    assert group_alive(ws, shots)
    threading.Timer(1.0, release.set).start()
    t0 = time.monotonic()
    assert outlived_crash(ws, shots, child, "group-000", poll_s=0.1) is True  # waited, then all done
    assert time.monotonic() - t0 >= 0.9
    thread.join()
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(child.id).state
    assert state.is_completed() and "outlived a Crashed state" in state.message


def test_a_lost_groups_running_shot_task_is_marked_crashed(tmp_path: Path):
    """The shot a lost group was rendering shows Crashed, not Running for ever; finished ones stay."""
    from prefect import task
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from flows.group_liveness import outlived_crash

    ws, shots, child = _crashed_group(tmp_path)

    @task(name="shot")
    def shot() -> None:
        pass

    with get_client(sync_client=True) as client:
        done = client.create_task_run(shot, child.id, "0", name="shot-0001", state=Completed())
        busy = client.create_task_run(shot, child.id, "1", name="shot-0002", state=Running())
    assert outlived_crash(ws, shots, child, "group-000", poll_s=0.1) is False  # lost
    with get_client(sync_client=True) as client:
        busy_state, done_state = client.read_task_run(busy.id).state, client.read_task_run(done.id).state
    assert busy_state.is_crashed() and "was lost" in busy_state.message, busy_state
    assert done_state.is_completed()
