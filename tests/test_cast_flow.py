"""`dubflow dub --stem`: the film run checks the stems into its workspace, links characters in planning,
gives each shot its `cast.shot`, keys shots by their stems and hands the stems to the backend (`ShotContext`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from flows.dub_film import dub_film_inline
from flows.estimate import estimate_film
from tasks import backends as backend_registry
from tasks.config.pipeline import load_config
from tasks.decision.shot_decision import decide_shot, faces_path, regions_json
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
        return dataclasses.replace(d, dub=False, reason=f"recorded: {d.reason}")

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


def test_two_stems_speaking_at_once_run_the_two_person_model_on_their_faces(tmp_path: Path, monkeypatch):
    """The whole chain on real footage: stems → characters → a two-speaker region (planning) → the InfiniteTalk
    backend in tiny mode (the tiny root holds the multi checkpoint) runs the shot with two audio streams and
    each person's mask on that person's face; the one-speaker shot runs with one stream."""
    from model.network.dit import InfiniteTalkDiT
    from tests.speaker_cases import side_of

    files = write_short_film(tmp_path)
    monkeypatch.setenv("DUBFLOW_OUTPUT_ROOTS", str(tmp_path))
    calls: list[tuple[int, Any]] = []  # (speakers in the call, its masks) per DiT forward
    forward = InfiniteTalkDiT.forward

    def spy(self, *args, **kwargs):  # the real forward runs; only what it was given is noted
        audio = kwargs["audio"]
        if audio.dim() == 6:  # batched guidance branches: the sample with the most speakers
            speakers = max(kwargs.get("audio_speakers") or [audio.shape[1]] * audio.shape[0])
        else:
            speakers = audio.shape[0]
        calls.append((speakers, kwargs.get("ref_target_masks")))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(InfiniteTalkDiT, "forward", spy)
    config = {
        "workspace": {"root": str(tmp_path / "ws")},
        "infinitetalk": {"steps": 2},
        "cast": {"characters": {"ANNA": [str(files["ANNA_still"])], "BEN": [str(files["BEN_still"])]}},
    }
    stems = {"ANNA": str(files["ANNA"]), "BEN": str(files["BEN"])}
    out = tmp_path / "out.mp4"
    dub_film_inline(str(files["film"]), str(files["mix"]), str(out), config=config, stems=stems)
    assert out.is_file()
    two = [(n, m) for n, m in calls if n == 2]
    assert two and any(n == 1 for n, _ in calls), [n for n, _ in calls]
    # the people of the two-speaker region, in the order the model got them (the planning's decision, as
    # `dubflow estimate` shows it), and the side of each one's mask
    est = estimate_film(
        files["film"], files["mix"], load_config(updates=config), stems, work_dir=tmp_path / "e"
    )
    (region,) = est.to_dict()["shots"][1]["regions"]
    people = region["people"]
    assert region["status"] == "two" and {p["character"] for p in people} == {"ANNA", "BEN"}
    masks = two[0][1]  # (3, h, w): person 1, person 2, background
    masks = masks[0] if masks.dim() == 4 else masks
    for i, person in enumerate(people):
        cols = masks[i].nonzero()[:, 1].float()
        assert cols.numel() > 0
        side = "left" if cols.mean() < masks.shape[-1] / 2 else "right"
        assert side == side_of(person["box"]), (i, person)
