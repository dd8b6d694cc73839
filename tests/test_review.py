"""The review step's rules without a server: the form built at run time, how answers settle turns (one answer
carried to the same character's other turns), and that answers written into the film's plan file give the
shot the same key as the run's own overrides (a re-run with the plan reuses the answered shots)."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction

import cv2
import numpy as np
import pytest

from flows.review import review_description, review_form, review_notes
from tasks.config.pipeline import load_config
from tasks.decision.plan_file import plan_overrides, read_plan
from tasks.decision.review import (
    NOBODY,
    POLICY,
    UncertainTurn,
    answer_overrides,
    contact_sheet,
    fresh_plan,
    plan_answers,
    settle,
    write_answers,
)
from tasks.errors import ConfigError
from tasks.timeline.shot_key import shot_config, shot_settings

FPS = Fraction(25)


def _turn(shot: int, start: int, end: int, policy: int | None, tracks: list[int]) -> UncertainTurn:
    faces = tuple({"track": k, "frame": start, "box": [10 + 60 * k, 10, 50 + 60 * k, 60]} for k in tracks)
    return UncertainTurn(shot, start, end, policy, faces)


def test_form_has_one_dropdown_per_turn_defaulting_to_the_policy():
    turns = [_turn(0, 0, 50, 0, [0, 1]), _turn(3, 300, 340, None, [2])]
    form = review_form(turns, FPS, {0: "/w/qc/shot_0000_preview.mp4", 3: None})
    props = form.model_json_schema()["properties"]
    assert list(props) == [t.field for t in turns]
    assert props[turns[0].field]["enum"] == ["face 0", "face 1", NOBODY, POLICY]
    assert props[turns[1].field]["enum"] == ["face 2", NOBODY, POLICY]
    assert all(p["default"] == POLICY for p in props.values())
    assert "00:00:12.000-00:00:13.600" in props[turns[1].field]["title"]
    form(**{turns[0].field: "face 1"})  # valid
    with pytest.raises(ValueError):
        form(**{turns[0].field: "face 2"})  # face 2 is not on screen in shot 0


def test_description_holds_the_contact_sheet_timecodes_and_previews():
    turns = [_turn(0, 0, 50, 0, [0, 1])]
    frame = np.zeros((120, 200, 3), np.uint8)
    frame[10:60, 10:50] = (250, 0, 0)  # face 0
    frame[10:60, 70:110] = (0, 250, 0)  # face 1
    jpeg = contact_sheet(turns, {0: frame}, FPS)
    sheet = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert sheet is not None and sheet.shape[0] >= 96 and len(jpeg) < 20_000
    md = review_description(turns, FPS, {0: "/w/qc/shot_0000_preview.mp4"}, jpeg, datetime.now(UTC), "p.yaml")
    assert "![faces of the uncertain turns](data:image/jpeg;base64," in md
    assert "| 0 | 00:00:00.000-00:00:02.000 | 0 1 | face 0 |" in md
    assert "(file:///w/qc/shot_0000_preview.mp4)" in md


def test_one_answer_settles_the_same_characters_other_turns():
    a = _turn(0, 0, 50, 0, [0, 1])  # ANNA is track 1 here, BEN track 0
    b = _turn(2, 200, 260, 5, [4, 5])  # ANNA is track 4 here
    c = _turn(4, 400, 450, 7, [7])  # only CARL on screen: left to the policy
    d = _turn(5, 500, 540, 8, [8, 9])  # a person says nobody
    chars = {(0, 0): "BEN", (0, 1): "ANNA", (2, 4): "ANNA", (2, 5): "BEN", (4, 7): "CARL", (5, 8): "ANNA"}
    settled = settle([a, b, c, d], {a.field: "face 1", d.field: NOBODY}, chars)
    got = [(s.turn.shot, s.speaker, s.by) for s in settled]
    assert got == [(0, 1, "person"), (2, 4, "character ANNA (shot 0)"), (4, 7, "policy"), (5, None, "person")]
    assert [s.changed for s in settled] == [True, True, False, True]
    answers = plan_answers(settled)
    assert sorted(answers) == [0, 2, 5] and answers[5][0]["speaker"] is None
    notes = review_notes(settled, by_deadline=False)
    assert notes[0] == "person: face 1" and notes[4] == "policy (face 7)" and notes[5] == "person: nobody"
    with pytest.raises(ValueError, match="not one of"):
        settle([a], {a.field: "face 9"}, {})


def test_an_answer_carries_only_to_turns_in_the_same_voice():
    """ANNA answered in shot 0; in shot 2 she is on screen in both turns, but only the first is in her voice."""
    a = _turn(0, 0, 50, 0, [0, 1])
    b1, b2 = _turn(2, 200, 250, 5, [4, 5]), _turn(2, 250, 300, 4, [4, 5])
    chars = {(0, 0): "BEN", (0, 1): "ANNA", (2, 4): "ANNA", (2, 5): "BEN"}
    anna, ben = np.array([1.0, 0.0]), np.array([0.55, np.sqrt(1 - 0.55**2)])  # unit vectors, cosine 0.55
    voices = {a.field: anna, b1.field: anna * 0.999 + 0.0447 * np.array([0, 1]), b2.field: ben}
    got = settle([a, b1, b2], {a.field: "face 1"}, chars, voices, min_cos=0.6)
    assert [(s.speaker, s.by) for s in got] == [(1, "person"), (4, "character ANNA (shot 0)"), (4, "policy")]
    no_voice = settle([a, b1], {a.field: "face 1"}, chars, {a.field: anna, b1.field: None}, min_cos=0.6)
    assert no_voice[1].by == "policy"  # no voice to compare: never carried


def test_the_plan_files_answers_key_the_shot_like_the_runs_overrides(tmp_path):
    records = [
        {"index": i, "plan": {"start_frame": 100 * i, "end_frame": 100 * (i + 1)},
         "decision": {"dub": True, "reason": "speaker uncertain", "regions": []}}
        for i in range(3)
    ]  # fmt: skip
    plan = tmp_path / "film.plan.yaml"
    fresh = fresh_plan("film.mp4", "dub.wav", FPS, 300, records, load_config().to_dict())
    answers = {1: [{"start_frame": 100, "end_frame": 200, "speaker": 3, "by": "person"}]}
    write_answers(plan, answers, fresh)
    assert read_plan(plan)[1]["overrides"]["answers"][0]["speaker"] == 3
    write_answers(plan, {2: [{"start_frame": 200, "end_frame": 260, "speaker": None, "by": "person"}]}, None)
    assert sorted(i for i, e in read_plan(plan).items() if e["overrides"]) == [1, 2]  # shot 1's answer kept

    config = load_config().to_dict()
    spans = [{"index": r["index"], **r["plan"]} for r in records]
    from_plan = plan_overrides(plan, config, spans, check_options=lambda _cfg: None)
    in_run = answer_overrides({}, 1, answers[1])
    assert shot_settings(shot_config(config, from_plan[1]), 1) == shot_settings(
        shot_config(config, in_run), 1
    )
    assert shot_settings(shot_config(config, in_run), 1) != shot_settings(config, 1)  # the key changes
    assert shot_settings(shot_config(config, in_run), 0) == shot_settings(config, 0)  # only for shot 1

    plan.write_text(plan.read_text().replace("speaker: 3", "speaker: -1"))
    with pytest.raises(ConfigError, match="shot 1: an answer must be"):
        plan_overrides(plan, config, spans, check_options=lambda _cfg: None)


def test_review_config_defaults_and_checks():
    cfg = load_config()
    assert cfg.review.enabled is False and cfg.review.timeout_s == 3600
    assert load_config(overrides=["review.enabled=true", "review.timeout_s=30"]).review.timeout_s == 30
    with pytest.raises(ConfigError, match="review.timeout_s"):
        load_config(overrides=["review.timeout_s=0"])
    on = load_config(overrides=["review.enabled=true", "review.timeout_s=30"]).to_dict()
    assert shot_settings(on, 0) == shot_settings(cfg.to_dict(), 0)  # turning review on re-renders nothing


def test_a_local_run_never_waits_it_lists_the_turns_and_the_plan_file_to_edit(tmp_path, monkeypatch, caplog):
    """`dubflow dub`'s pipeline with review on: the policy dubs, the uncertain turn and the plan file are listed;
    an answer written into that plan file makes the next run dub the answered face (the editor's loop)."""
    import logging

    import soundfile as sf

    from flows.dub_film import dub_film_inline
    from tasks import backends as backend_registry
    from tests.av_cases import av_case
    from tests.speaker_cases import SR, encode
    from tests.test_cast_flow import SEEN

    monkeypatch.setitem(
        backend_registry.BACKENDS, "recorder", "tests.test_cast_flow:Recorder"
    )  # decides, dubs nothing
    monkeypatch.setenv("DUBFLOW_OUTPUT_ROOTS", str(tmp_path))
    SEEN.clear()
    case = av_case("tune/two_moving")
    n = 60
    audio = case.audio[: round(n / 25 * SR)]
    clip = encode(tmp_path / "two.mp4", case.frames[:n], audio)
    sf.write(tmp_path / "dub.wav", audio, SR)
    out = tmp_path / "out" / "two.dubbed.mp4"
    config = {
        "backend": {"name": "recorder"},
        "speaker": {"min_score": 1.01},  # every speaker turn uncertain (see tests/test_review_e2e.py)
        "review": {"enabled": True, "timeout_s": 5},
        "workspace": {"root": str(tmp_path / "ws")},
        "qc": {"enabled": False},
    }
    with caplog.at_level(logging.WARNING, logger="flows.review"):
        dub_film_inline(str(clip), str(tmp_path / "dub.wav"), str(out), config=config)
    plan = out.with_name("two.dubbed.plan.yaml")
    turn = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("uncertain turn"))
    assert turn.startswith(
        "uncertain turn: shot 0 00:00:00.000-00:00:02.400 (faces on screen: face 0, face 1)"
    )
    assert any(f"and run again with --plan {plan}" in r.getMessage() for r in caplog.records)
    (first,) = SEEN
    policy = first["regions"][0]["speaker"]
    assert first["regions"][0]["status"] == "uncertain" and plan.is_file()

    other = 1 - policy
    text = plan.read_text().replace(
        "answers: null", f"answers: [{{start_frame: 0, end_frame: {n}, speaker: {other}}}]"
    )
    plan.write_text(text)
    SEEN.clear()
    dub_film_inline(str(clip), str(tmp_path / "dub.wav"), str(out), config=config, plan=str(plan))
    (second,) = SEEN
    assert [(r["speaker"], r["status"]) for r in second["regions"]] == [(other, "answered")], second
