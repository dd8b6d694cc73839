"""The group's model load warmed at its shots' planned model sizes (issue 25 item 3), on the CPU with the
tiny model (`infinitetalk.warm_up: true` runs the warm-up on its eager DiT): a film with a face shot in
region mode and a full-frame shot warms both sizes before its first shot and none inside a shot, the
load is recorded apart from the shots, and sizes the resident models are warm for are not warmed again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tasks.infinitetalk.resident as it
from tasks.config.pipeline import load_config
from tasks.infinitetalk import InfiniteTalkBackend, ResidentModels
from tasks.render.backend import PlannedShot, planned_shot
from tasks.run.workspace import read_attempts, read_group_loads, read_shot_done
from tasks.timeline.plan import ShotPlan
from tests.test_infinitetalk import DUB, FILM, _job
from tests.tiny_weights import seed_cache

GENERATED = re.compile(r"shot (\d{4}): \d+ chunk\(s\) at (\d+x\d+)")  # the session's own line per shot
WARMED = re.compile(r"compile warm-up at (\d+x\d+)")  # the warm-up's own line


@pytest.fixture(scope="module")
def ws_root(tmp_path_factory: pytest.TempPathFactory, tiny_weights: Path) -> Path:
    """A workspace root whose .cache holds the tiny weights root (the session's, copied)."""
    root = tmp_path_factory.mktemp("ws")
    seed_cache(tiny_weights, root / ".cache")
    return root


@pytest.fixture
def resident(monkeypatch: pytest.MonkeyPatch) -> ResidentModels:
    """A fresh resident-model holder for one test: nothing loaded, nothing warm."""
    fresh = ResidentModels()
    monkeypatch.setattr(it, "RESIDENT", fresh)
    return fresh


def _film_config(ws_root: Path, seed: int = 42) -> dict:
    """Shot 0: the speaker's face crop (region mode); shot 2 (no face, forced): the full frame; the rest
    skipped (keeps the CPU test short)."""
    return {
        "backend": {"name": "infinitetalk"},
        "workspace": {"root": str(ws_root)},
        "infinitetalk": {"warm_up": True, "seed": seed},
        "gate": {"overrides": {1: "skip", 2: "dub", 3: "skip", 4: "skip"}},
    }


def _workspace(ws_root: Path):
    from tasks.run.workspace import Workspace

    (manifest,) = ws_root.glob("*/workspace.json")
    data = json.loads(manifest.read_text())
    return Workspace(root=str(ws_root), key=data["key"], incarnation=data["incarnation"])


def test_film_warms_every_planned_size_at_load_and_none_inside_a_shot(
    tmp_path: Path, ws_root: Path, resident: ResidentModels, backend_log: list[str]
):
    """`dubflow dub --no-prefect` on the sample film (the planning's decisions -> the group's load): the
    face crop and the full frame warmed at load, before shot 0, and neither inside a shot; then a second
    render of the same sizes on the same resident models warms nothing."""
    from flows.dub_film import dub_film_inline

    dub_film_inline(str(FILM), str(DUB), str(tmp_path / "a.mp4"), config=_film_config(ws_root))
    generated = dict(m.groups() for line in backend_log if (m := GENERATED.search(line)))
    assert set(generated) == {"0000", "0002"} and len(set(generated.values())) == 2, generated  # two sizes

    # every size a shot generated at was warmed once, all before the first shot started
    warmed = [m.group(1) for line in backend_log if (m := WARMED.search(line))]
    assert sorted(warmed) == sorted(set(generated.values())), (warmed, generated)
    first_shot = next(i for i, line in enumerate(backend_log) if GENERATED.search(line))
    last_warm = max(i for i, line in enumerate(backend_log) if WARMED.search(line))
    assert last_warm < first_shot, backend_log

    # the load is recorded apart from the shots: models and warm-up seconds per size, in the group record
    ws = _workspace(ws_root)
    loads = read_group_loads(ws)
    assert sorted(k for r in loads for k in r["warm_up_s"]) == sorted(warmed), loads
    assert all(r["models_s"] > 0 and all(s > 0 for s in r["warm_up_s"].values()) for r in loads), loads
    keys = {a["shot"]: a["key"] for a in read_attempts(ws)}
    for shot in (0, 2):  # no shot compiled (no "warm_up" stage) nor loaded the models itself
        timings = read_shot_done(ws, shot, keys[shot])["result"]["timings_s"]
        assert "warm_up" not in timings and timings["load"] < min(r["models_s"] for r in loads) / 2, timings
    assert resident.loads["dit"] == 1

    # another render of the same shots (a new seed: new shot keys, the same sizes) on the resident models:
    # nothing is warmed again, at load or in a shot
    backend_log.clear()
    dub_film_inline(str(FILM), str(DUB), str(tmp_path / "b.mp4"), config=_film_config(ws_root, seed=7))
    assert sum(1 for line in backend_log if GENERATED.search(line)) == 2
    assert not [line for line in backend_log if WARMED.search(line)], backend_log
    assert read_group_loads(ws) == loads and resident.loads["dit"] == 1
    again = {a["shot"]: a["key"] for a in read_attempts(ws) if a["key"] != keys.get(a["shot"])}
    assert all("warm_up" not in read_shot_done(ws, s, k)["result"]["timings_s"] for s, k in again.items())


@pytest.mark.usefixtures("prefect_harness")
def test_dub_group_run_warms_before_its_first_shot_task(
    tmp_path: Path, resident: ResidentModels, tiny_weights: Path
):
    """The `dub-film` flow (groups as in-process `dub-group` runs): the group run's load warms shot 0's
    face crop before its shot task, and the group's record names it with where it ran."""
    from flows.dub_film import dub_film
    from flows.report import group_report

    root = tmp_path / "ws"
    seed_cache(tiny_weights, root / ".cache")
    config = _film_config(root)
    config["gate"]["overrides"][2] = "skip"  # shot 0 alone is dubbed
    state = dub_film(str(FILM), str(DUB), str(tmp_path / "out.mp4"), config=config, return_state=True)
    assert state.is_completed(), state.message
    ws = _workspace(root)
    (load,) = read_group_loads(ws)
    assert list(load["warm_up_s"]) == ["32x48"] and load["shots"] == [0, 1, 2, 3, 4], load
    assert load["pid"] > 0 and load["worker"], load
    keys = {a["shot"]: a["key"] for a in read_attempts(ws)}
    shots = [{"index": i, "key": keys[i]} for i in range(5)]
    assert group_report(ws, shots)["loads"] == [load]
    assert "warm_up" not in read_shot_done(ws, 0, keys[0])["result"]["timings_s"]


def test_only_the_backends_own_dubbed_shots_add_sizes(
    tmp_path: Path, ws_root: Path, resident: ResidentModels
):
    """A passthrough shot's size and a shot without a planned size add nothing; a size is warmed once."""
    job = _job(tmp_path, ws_root, 0, (0, 60), ["infinitetalk.warm_up=true"])
    cfg = load_config(overrides=["backend.name=infinitetalk", f"workspace.root={ws_root}",
                                 "infinitetalk.warm_up=true"])  # fmt: skip
    plan = ShotPlan.from_dict(job.plan)
    other = load_config(overrides=["backend.name=passthrough", f"workspace.root={ws_root}"])
    shots = [
        PlannedShot(other, plan, (16, 16)),
        PlannedShot(cfg, plan, None),
        PlannedShot(cfg, plan, (32, 48)),
    ]
    backend = InfiniteTalkBackend({}, config=cfg)
    got = backend.warm_up_planned(shots)
    assert list(got["warm_up_s"]) == ["48x32"] and got["models_s"] > 0, got
    assert backend.warm_up_planned(shots) == {} and resident.loads["dit"] == 1  # warm already: no work

    record = {"plan": job.plan, "decision": {"dub": False, "model_hw": [32, 48]}}
    assert planned_shot(cfg.to_dict(), record).model_hw is None  # not dubbed: no size
    record = {"plan": job.plan, "decision": {"dub": True, "model_hw": [32, 48]}}
    assert planned_shot(cfg.to_dict(), record).model_hw == (32, 48)
    assert planned_shot(cfg.to_dict(), {"plan": job.plan}).model_hw is None  # no planning decision
