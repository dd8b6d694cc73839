"""A shot plan's filled `speaker` and `crop` overrides: applied after the automatic decision on real footage,
keyed per shot (only that shot re-renders), and bad values as one-line errors naming the plan and shot."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main
from tasks.config.pipeline import load_config
from tasks.decision.plan_file import plan_overrides, to_config_overrides
from tasks.decision.shot_decision import decide_shot
from tasks.errors import ConfigError
from tasks.media.probe import probe
from tasks.picture.region import nearest_bucket
from tasks.render.backend import check_backend_options
from tasks.timeline.shot_key import shot_config, shot_settings
from tests.speaker_cases import SR, cases, encode, side_of
from tests.test_plan_file import SPANS, _plan, _renders, planned_clip


@pytest.fixture(scope="module")
def two_up(tmp_path_factory):
    """A speaker on the left next to a still listener on the right: (film info, audio)."""
    case = cases()["speaker_left"]
    return probe(encode(tmp_path_factory.mktemp("two") / "f.mp4", case.frames, case.audio)), case.audio


def _decide(two_up, cache: Path, *settings: str):
    info, audio = two_up
    cfg = load_config(overrides=list(settings))
    return decide_shot(0, 0, info.frame_count, info, audio, SR, cfg, cache)


def test_speaker_override_dubs_the_named_track(two_up, tmp_path):
    auto = _decide(two_up, tmp_path / "faces.json")
    (region,) = auto.regions
    assert side_of(region.plan.face_box) == "left" and region.status == "speaker", auto.reason
    listener = next(t.id for t in auto.faces.tracks if t.id != region.speaker)
    d = _decide(two_up, tmp_path / "faces.json", f"gate.speakers={{0: {listener}}}")
    (region,) = d.regions
    assert d.dub and d.reason == f"plan: speaker {listener}"
    assert (region.speaker, region.status, region.start_frame, region.end_frame) == (
        listener, "plan", 0, two_up[0].frame_count
    )  # fmt: skip
    assert side_of(region.plan.face_box) == "right" and side_of(region.plan.box) == "right"
    # a skipped shot stays skipped; a track the shot does not have is a one-line error naming the shot
    assert not _decide(
        two_up, tmp_path / "faces.json", "gate.speakers={0: 1}", "gate.overrides={0: skip}"
    ).dub
    with pytest.raises(
        ConfigError, match=r"shot 0: speaker 9: no such face track \(the shot's tracks: 0, 1\)"
    ):
        _decide(two_up, tmp_path / "faces.json", "gate.speakers={0: 9}")


def test_crop_override_dubs_that_box(two_up, tmp_path):
    info, _ = two_up
    w, h = info.display_size
    box = [w // 2, 10, w - 4, h - 20]
    d = _decide(two_up, tmp_path / "faces.json", f"gate.crops={{0: {box}}}", "gate.policy=none")
    (region,) = d.regions
    assert d.dub and d.reason == f"plan: crop [{', '.join(map(str, box))}]" and region.speaker is None
    x0, y0, x1, y1 = region.plan.box
    assert x0 <= box[0] and y0 <= box[1] and x1 >= box[2] and y1 >= box[3]  # at least the box ...
    assert min(x0, y0) >= 0 and x1 <= w and y1 <= h  # ... inside the frame
    bh, bw = region.plan.bucket  # ... at the bucket's aspect, the bucket the box's own aspect picks
    assert abs((y1 - y0) / (x1 - x0) - bh / bw) < 2 / (x1 - x0)
    assert (bh, bw) == nearest_bucket(box[3] - box[1], box[2] - box[0])
    with pytest.raises(
        ConfigError, match=rf"shot 0: crop \[0, 0, {w + 1}, 10\] lies outside the {w}x{h} frame"
    ):
        _decide(two_up, tmp_path / "faces.json", f"gate.crops={{0: [0, 0, {w + 1}, 10]}}")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"crop": [1, 2, 3]},
            "shot 1: crop must be [x0, y0, x1, y1] (4 integers, display pixels), got [1, 2, 3]",
        ),
        ({"crop": [0, 0, 1.5, 9]}, "shot 1: crop must be [x0, y0, x1, y1]"),
        ({"crop": [40, 0, 20, 9]}, "shot 1: crop [40, 0, 20, 9] needs 0 <= x0 < x1 and 0 <= y0 < y1"),
        ({"crop": [0, 0, 64, 73]}, "shot 1: crop [0, 0, 64, 73] lies outside the 128x72 frame"),
        ({"crop": "face"}, "shot 1: crop must be list, got 'face'"),
        ({"speaker": -1}, "shot 1: speaker must be a face track id (an integer >= 0), got -1"),
        ({"speaker": True}, "shot 1: speaker must be int, got True"),
        ({"dub": "no", "speaker": 1}, "shot 1: dub: no contradicts a speaker / crop override"),
    ],
)
def test_bad_speaker_and_crop_values_name_the_plan_and_shot(tmp_path: Path, override, message):
    path = _plan(tmp_path, **override)
    with pytest.raises(ConfigError) as err:
        plan_overrides(
            path, load_config().to_dict(), SPANS, frame_hw=(72, 128), check_options=check_backend_options
        )
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


def test_speaker_and_crop_enter_only_their_own_shots_settings():
    assert to_config_overrides(2, {"speaker": 1, "crop": [0, 0, 8, 8]}) == {
        "gate": {"speakers": {"2": 1}, "crops": {"2": [0, 0, 8, 8]}}
    }
    base = load_config().to_dict()
    edited = shot_config(base, to_config_overrides(2, {"crop": [0, 0, 8, 8]}))
    assert shot_settings(edited, 2) != shot_settings(base, 2)
    assert shot_settings(edited, 3) == shot_settings(base, 3)
    assert "crops" not in shot_settings(base, 3)["gate"]  # no entry: the key it had before these maps
    moved = shot_config(base, to_config_overrides(2, {"crop": [0, 0, 8, 9]}))
    assert shot_settings(moved, 2) != shot_settings(edited, 2)


def _edit(plan: Path, index: int, field: str, value: str) -> None:
    """A text edit of one shot's override field (the plan's comments stay)."""
    parts = plan.read_text().split("- index: ")
    parts[index + 1] = parts[index + 1].replace(f"{field}: null", f"{field}: {value}")
    plan.write_text("- index: ".join(parts))


def test_a_plan_speaker_or_crop_re_renders_only_its_shot(tmp_path: Path, capsys):
    from flows.dub_film import dub_film_inline

    clip, dub, out, ws_root, plan, _ = planned_clip(tmp_path)
    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(ws_root)}}
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))
    assert sorted(_renders(ws_root).elements()) == [0, 1, 2]
    _edit(plan, 1, "crop", "[10, 4, 90, 60]")
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))
    assert sorted(_renders(ws_root).elements()) == [0, 1, 1, 2]
    _edit(plan, 2, "speaker", "0")
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))
    assert sorted(_renders(ws_root).elements()) == [0, 1, 1, 2, 2]

    # with a dubbing backend the planning checks the track against the shot's faces (this clip has none):
    # one line naming the plan and the shot, before any render
    capsys.readouterr()
    dubbing = ["--set", "backend.name=infinitetalk", "--set", f"workspace.root={ws_root}"]
    cmd = ["dub", str(clip), "--audio", str(dub), "--out", str(out), "--plan", str(plan), "--no-prefect"]
    assert main([*cmd, *dubbing]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"dubflow: error: {plan}: shot 2: speaker 0: no such face track (the shot's tracks: none)"
