"""Per-shot dub decisions: policy, overrides and the reasons shown in the shot table."""

import pytest

from tasks.gate import Decision, decide_dub, parse_overrides
from tasks.region import RegionPlan
from tasks.speech import SpeechInfo

SPEECH = SpeechInfo(True, 0.734, ((0.2, 2.4),), "speech 2.2 s (73%)")
SILENT = SpeechInfo(False, 0.0, (), "no speech in dub track (silent, peak -80 dBFS)")


def plan(face: bool, mode: str = "region", detections: int | None = None) -> RegionPlan:
    n = (8 if face else 0) if detections is None else detections
    return RegionPlan(mode, (0, 0, 64, 64), (640, 640), face, n, "test plan", (64, 64), 10)


def test_auto_needs_speech_and_a_face():
    assert decide_dub(0, SPEECH, plan(True)) == Decision(True, "speech 73% + face")
    assert decide_dub(0, SILENT, plan(True)) == Decision(False, SILENT.reason)
    assert decide_dub(0, SPEECH, plan(False)) == Decision(False, "no face found")
    assert decide_dub(0, SPEECH, plan(False, detections=2)) == Decision(False, "no steady face found")
    assert decide_dub(0, SILENT, plan(False)).reason.startswith("no speech in dub track")


def test_full_frame_mode_can_dub_without_a_face():
    assert not decide_dub(3, SPEECH, plan(False, "full")).dub
    d = decide_dub(3, SPEECH, plan(False, "full"), require_face=False)
    assert d.dub and "full frame" in d.reason
    assert not decide_dub(3, SPEECH, plan(False, "region"), require_face=False).dub
    assert not decide_dub(3, SILENT, plan(False, "full"), require_face=False).dub


def test_policies_all_and_none():
    assert decide_dub(1, SILENT, plan(False), policy="all") == Decision(True, "policy: dub all shots")
    assert decide_dub(1, SPEECH, plan(True), policy="none") == Decision(False, "policy: dub no shots")
    with pytest.raises(ValueError, match="dub policy"):
        decide_dub(1, SPEECH, plan(True), policy="some")


def test_overrides_win_over_policy_and_evidence():
    overrides = {2: "dub", "5": "SKIP"}
    assert decide_dub(2, SILENT, plan(False), "none", overrides) == Decision(True, "forced by override")
    assert decide_dub(5, SPEECH, plan(True), "all", overrides) == Decision(False, "skipped by override")
    assert decide_dub(4, SPEECH, plan(True), "auto", overrides).reason == "speech 73% + face"


def test_bad_overrides_name_the_shot():
    assert parse_overrides(None) == {} and parse_overrides({"7": " Dub "}) == {7: "dub"}
    with pytest.raises(ValueError, match="shot 3"):
        parse_overrides({3: "maybe"})
    with pytest.raises(ValueError, match="not a shot index"):
        parse_overrides({"intro": "dub"})
    with pytest.raises(ValueError, match=">= 0"):
        parse_overrides({-1: "dub"})
