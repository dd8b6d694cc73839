"""The GPU-time figures of benchmarks/film_report.py on a read-back whose arithmetic is known by construction.

Two group runs of one three-shot film (dub, copy, dub): the first process warms its models for 20 s,
renders shots 0 and 1 and is killed 10 s into shot 2; the restarted one warms for 15 s and renders shot 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from film_report import figures


def _task(shot: int, group: str, start: float, end: float | None, state: str) -> dict:
    return {
        "id": f"{group}-{shot}",
        "name": f"shot-{shot:04d} x",
        "state_name": state,
        "state_type": state.upper(),
        "start": start,
        "end": end,
        "flow_run_id": group,
    }


def _readback() -> tuple[dict, dict, dict]:
    manifest = {
        "film_s": 10.0,
        "shots": [
            {"index": 0, "start_s": 0.0, "end_s": 4.0},
            {"index": 1, "start_s": 4.0, "end_s": 6.0},
            {"index": 2, "start_s": 6.0, "end_s": 10.0},
        ],
    }
    groups = [
        {"id": "g1", "name": "group-000", "state_name": "Crashed", "start": 100.0, "end": 230.0},
        {"id": "g2", "name": "group-000", "state_name": "Completed", "start": 200.0, "end": 253.0},
    ]
    data = {
        "groups": groups,
        "group_loads": [{"pid": 1, "total_s": 20.0}, {"pid": 2, "total_s": 15.0}],
        "shot_tasks": [
            _task(0, "g1", 125.0, 145.0, "Completed"),  # lead-in 25 s, of which 20 s warmed load
            _task(1, "g1", 146.0, 148.0, "Completed"),  # gap 1 s
            _task(2, "g1", 150.0, None, "Crashed"),  # gap 2 s, then 10 s of work lost at the kill (160)
            _task(2, "g2", 220.0, 250.0, "Completed"),  # lead-in 20 s, of which 15 s warmed load; tail 3 s
        ],
        "attempts": [
            {"shot": 0, "pid": 1, "status": "done"},
            {"shot": 1, "pid": 1, "status": "done"},
            {"shot": 2, "pid": 2, "status": "done"},
        ],
        "done": {
            0: {"dubbed": True, "timings_s": {"load": 0.0}},
            1: {"dubbed": False, "timings_s": {}},
            2: {"dubbed": True, "timings_s": {"load": 0.0}, "chunks_resumed": 1},
        },
        "films": [
            {"id": "f1", "state_name": "Completed", "state_type": "COMPLETED", "start": 90.0, "end": 300.0}
        ],
        "film_tasks": [],
        "qc": {},
    }
    result = {"kill": {"time": 160.0, "group_run_id": "g1", "shot": 2}}
    return data, manifest, result


def test_gpu_time_figures_with_and_without_the_kill():
    data, manifest, result = _readback()
    f = figures(data, manifest, result, [], tiny=False)
    assert f["gpu_s"] == 113.0  # 60 s of the killed run (to the kill) + 53 s of the second
    assert f["model_load_s"] == [15.0, 20.0]
    assert f["dubbed_dialogue_s"] == 8.0  # shots 0 and 2; the copied shot 1 is not dialogue
    assert f["gpu_s_per_dialogue_s"] == pytest.approx(78 / 8)  # everything but the loads
    assert f["gpu_s_per_dialogue_s_shot_tasks"] == pytest.approx(52 / 8)  # the Completed runs: 20 + 2 + 30
    assert (f["idle_between_shots_s"], f["group_lead_in_s"], f["group_tail_s"]) == (3.0, 10.0, 3.0)
    # uninterrupted: the Completed runs + gaps + lead-ins + tails = the run less its loads and lost work
    assert f["gpu_s_per_dialogue_s_uninterrupted"] == pytest.approx((52 + 3 + 10 + 3) / 8)
    lost = result["kill"]["time"] - 150.0
    assert f["gpu_s_per_dialogue_s_uninterrupted"] * 8 + lost == pytest.approx(f["gpu_s_per_dialogue_s"] * 8)


def test_without_a_kill_uninterrupted_is_the_whole_run_less_its_loads():
    data, manifest, result = _readback()
    data["shot_tasks"] = [
        t for t in data["shot_tasks"] if t["flow_run_id"] == "g2" or t["state_name"] != "Crashed"
    ]
    data["groups"][0]["end"] = 149.0  # the first run ends after shot 1's 1 s tail; nothing was lost
    f = figures(data, manifest, {"kill": None}, [], tiny=False)
    assert f["gpu_s_per_dialogue_s_uninterrupted"] == pytest.approx(f["gpu_s_per_dialogue_s"])
