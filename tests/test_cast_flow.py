"""`dubflow dub --stem`: the film run checks the stems into its workspace, links characters in planning,
gives each shot its `cast.shot`, keys shots by their stems and hands the stems to the backend (`ShotContext`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from flows.dub_film import dub_film_inline
from tasks import backend as backend_registry
from tasks.backend import ShotDecision
from tasks.shot_decision import decide_shot, faces_path, regions_json
from tests.cast_cases import write_short_film

SEEN: list[dict] = []  # what the recording backend was handed, per shot (this test module only)


class Recorder:
    """A gating backend that decides like the InfiniteTalk one (the planning's cached analysis), records
    its context and dubs nothing (every shot is copied through, so the run stays cheap)."""

    name = "recorder"
    applies_color = True

    def __init__(self, options, config=None):
        self.config = config

    def prepare_shot(self, plan, geometry, shot_audio, sample_rate, context):
        cache = faces_path(
            context.work_dir, plan.shot_index, plan.start_frame, plan.end_frame, context.config
        )
        d = decide_shot(plan.shot_index, plan.start_frame, plan.end_frame, context.video, shot_audio, sample_rate,
                        context.config, cache, planned=True)  # fmt: skip
        SEEN.append({"index": plan.shot_index, "stems": dict(context.stems), "dub": d.dub, "reason": d.reason,
                     "regions": regions_json(d, plan.start_frame)})  # fmt: skip
        return ShotDecision(False, f"recorded: {d.reason}", d.details)

    def open_shot(self, *args, **kwargs):  # pragma: no cover - every shot is passed through
        raise AssertionError("the recorder dubs nothing")


@pytest.fixture
def recorder(monkeypatch):
    monkeypatch.setitem(backend_registry.BACKENDS, "recorder", "tests.test_cast_flow:Recorder")
    SEEN.clear()
    return SEEN


def test_stems_flow_from_the_command_to_the_backend(tmp_path: Path, recorder, monkeypatch):
    files = write_short_film(tmp_path)
    monkeypatch.setenv("DUBFLOW_OUTPUT_ROOTS", str(tmp_path))
    config = {
        "backend": {"name": "recorder"},
        "workspace": {"root": str(tmp_path / "ws")},
        "cast": {"characters": {"ANNA": [str(files["ANNA_still"])], "BEN": [str(files["BEN_still"])]}},
    }
    stems = {"ANNA": str(files["ANNA"]), "BEN": str(files["BEN"])}
    dub_film_inline(
        str(files["film"]), str(files["mix"]), str(tmp_path / "out.mp4"), config=config, stems=stems
    )
    by_shot = {s["index"]: s for s in recorder}
    assert sorted(by_shot) == [0, 1]
    for seen in recorder:  # the checked stems in the run workspace, one wav per character
        assert sorted(seen["stems"]) == ["ANNA", "BEN"]
        for path in seen["stems"].values():
            assert Path(path).is_file() and Path(path).parent.parent == tmp_path / "ws"
            assert sf.info(path).samplerate == 16000
    # the GPU side's decision follows the stems, from the planning's cast.shot
    (first,) = by_shot[0]["regions"]
    assert (first["status"], first["character"]) == ("speaker", "ANNA") and by_shot[0]["dub"]
    (both,) = by_shot[1]["regions"]
    assert both["status"] == "two" and len(both["people"]) == 2, by_shot[1]["reason"]
    ws = next((tmp_path / "ws").glob("*/characters.json"))
    chars = json.loads(ws.read_text())["characters"]
    assert sorted((c["name"], c["shots"]) for c in chars) == [("ANNA", [0, 1]), ("BEN", [0, 1])]
    # a changed stem changes the shots' keys: a second run renders them again
    keys = {p.name for p in ws.parent.glob("shots/*")}
    ben = sf.read(files["BEN"])[0]
    sf.write(files["BEN"], (0.5 * ben).astype(np.float32), 16000, subtype="FLOAT")
    dub_film_inline(
        str(files["film"]), str(files["mix"]), str(tmp_path / "out.mp4"), config=config, stems=stems
    )
    assert {p.name for p in ws.parent.glob("shots/*")} - keys
