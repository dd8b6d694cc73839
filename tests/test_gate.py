"""Per-shot dub decisions: policy, overrides, who speaks (speaker turns, uncertainty) and the reasons."""

import dataclasses

import pytest

from tasks.config.pipeline import load_config
from tasks.decision.gate import apply_region_overrides, decide_dub, speaker_turns
from tasks.decision.overrides import (
    POLICIES,
    ShotOverrides,
    needs_faces,
    parse_overrides,
    precedence,
    shot_overrides,
)
from tasks.decision.record import ShotDecision, Turn
from tasks.perception.face_analysis import ShotFaces, TrackInfo
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.speech import SpeechInfo
from tasks.picture.region import RegionConfig

SPEECH = SpeechInfo(True, 0.734, ((0.2, 2.4),), "speech 2.2 s (73%)")
SILENT = SpeechInfo(False, 0.0, (), "no speech in dub track (silent)")
REGION = RegionConfig()
HW = (360, 640)
CFG = load_config()


def decide(
    shot,
    speech,
    faces,
    region,
    *,
    policy="auto",
    overrides=None,
    require_face=True,
    uncertain="most_likely",
    **kw,
):
    """The gate of shot ``shot`` under these settings (its overrides parsed as the planning does; min_score 0:
    each segment's own status counts)."""
    gate = dataclasses.replace(CFG.gate, policy=policy, require_face=require_face, overrides=overrides or {})
    speaker = dataclasses.replace(CFG.speaker, uncertain=uncertain, min_score=0.0)
    return decide_dub(shot_overrides(shot, gate), speech, faces, region, gate, speaker, **kw)


def track(k: int, x: int, side: int = 80, still: bool = False, n: int = 100) -> TrackInfo:
    frames = tuple(range(0, n, 4))
    return TrackInfo(
        k, 0, n, float(side), still, frames, tuple((x, 100, x + side, 100 + side) for _ in frames)
    )


def faces(tracks=(), segments=(), n: int = 100) -> ShotFaces:
    return ShotFaces(n, 25.0, HW, HW, True, tuple(tracks), tuple(segments), (), (), 5, 0.0)


TWO = (track(0, 100), track(1, 400, side=120))


def seg(a, b, status, speaker=None, score=0.8, runner_up=None):
    return SpeakerSegment(a, b, status, speaker, score, runner_up)


def test_the_speaker_alone_is_dubbed_over_the_whole_shot():
    d = decide(0, SPEECH, faces(TWO, [seg(10, 40, "speaker", 1), seg(50, 90, "speaker", 1, 0.6)]), REGION)
    assert d.dub and d.reason == "speech 73%; speaker: track 1 (score 0.69)"
    (r,) = d.regions
    assert (r.start_frame, r.end_frame, r.speaker, r.status) == (0, 100, 1, "speaker")
    x0, _, x1, _ = r.plan.box
    assert x0 <= 400 and x1 >= 520  # the crop holds track 1's face, not track 0's


def test_nobody_on_screen_speaking_passes_the_shot_through():
    assert decide(0, SPEECH, faces(TWO, [seg(0, 100, "none")]), REGION) == ShotDecision(
        False, "speaker off screen"
    )
    assert decide(0, SPEECH, faces((), [seg(0, 100, "none")]), REGION).reason == "no face found"
    posters = (track(0, 100, still=True),)
    assert decide(0, SPEECH, faces(posters, [seg(0, 100, "none")]), REGION).reason.startswith(
        "only still faces"
    )


def test_turn_taking_gives_one_region_per_turn_split_in_the_pause():
    segs = [seg(0, 40, "speaker", 0), seg(50, 100, "speaker", 1)]
    d = decide(0, SPEECH, faces(TWO, segs), REGION)
    assert [(r.start_frame, r.end_frame, r.speaker) for r in d.regions] == [(0, 45, 0), (45, 100, 1)]
    assert "track 0 -> track 1" in d.reason


def _scored(f: ShotFaces) -> ShotFaces:
    """``f`` with an agreement route's rows (a sure turn and an uncertain one of one face stay two turns)."""
    return dataclasses.replace(f, agreement=((0.5,) * 20, (0.1,) * 20))


def _band(a, b, speaker, change, runner_up=None):
    """An uncertain segment of content's band around a change of voice at frame ``change`` (through the JSON
    form, as the planning reads the analysis back)."""
    return SpeakerSegment.from_dict(
        {"start_frame": a, "end_frame": b, "status": "uncertain", "speaker": speaker, "score": 0.2,
         "runner_up": runner_up, "change": change}
    )  # fmt: skip


@pytest.mark.parametrize("named", [0, 1])
def test_the_band_around_a_change_of_voice_switches_at_the_change(named):
    """Turns in (track 0 sure, the uncertain band around a change of voice at frame 50 whose likeliest face is
    ``named`` over all of it, track 1 sure), regions out: under `most_likely` the switch is at the change, each
    half of the band on its own side's face and still uncertain (the review asks about both); before, the
    whole band was one region on the named face, the switch 0.6 s early or late."""
    other = 1 - named
    segs = [seg(0, 35, "speaker", 0), _band(35, 50, named, 50, other), _band(50, 65, named, 50, other),
            seg(65, 100, "speaker", 1)]  # fmt: skip
    d = decide(0, SPEECH, _scored(faces(TWO, segs)), REGION)
    assert [(r.start_frame, r.end_frame, r.speaker, r.status) for r in d.regions] == [
        (0, 35, 0, "speaker"), (35, 50, 0, "uncertain"), (50, 65, 1, "uncertain"), (65, 100, 1, "speaker"),
    ]  # fmt: skip
    # a pause inside the band: the switch in the pause, each side still its own turn's face
    segs = [
        seg(0, 35, "speaker", 0),
        _band(35, 47, named, 50),
        _band(53, 65, named, 50),
        seg(65, 100, "speaker", 1),
    ]
    d = decide(0, SPEECH, _scored(faces(TWO, segs)), REGION)
    assert [(r.start_frame, r.end_frame, r.speaker) for r in d.regions] == [
        (0, 35, 0), (35, 50, 0), (50, 65, 1), (65, 100, 1),
    ]  # fmt: skip


def test_the_band_follows_the_other_policies_and_its_own_face_without_a_neighbour():
    # skip: the band is not dubbed at all, the turns either side are
    segs = [seg(0, 35, "speaker", 0), _band(35, 50, 0, 50), _band(50, 65, 0, 50), seg(65, 100, "speaker", 1)]
    d = decide(0, SPEECH, _scored(faces(TWO, segs)), REGION, uncertain="skip")
    assert [(r.start_frame, r.end_frame, r.speaker) for r in d.regions] == [(0, 35, 0), (65, 100, 1)]
    # a change near the shot's start: the band before it has no turn on its side and keeps its own face
    segs = [_band(0, 10, 1, 10), _band(10, 25, 1, 10), seg(25, 100, "speaker", 0)]
    turns = speaker_turns(_scored(faces(TWO, segs)), "most_likely", 0.0)
    assert [(t.start, t.end, t.track, t.status) for t in turns] == [
        (0, 10, 1, "uncertain"), (10, 25, 0, "uncertain"), (25, 100, 0, "speaker"),
    ]  # fmt: skip
    # the voice-over side of a change: nobody on screen says that turn, so its half of the band is not dubbed
    segs = [seg(0, 35, "none"), _band(35, 50, 0, 50), _band(50, 65, 0, 50), seg(65, 100, "speaker", 0)]
    d = decide(0, SPEECH, faces(TWO, segs), REGION)
    assert [(r.start_frame, r.end_frame, r.speaker) for r in d.regions] == [(50, 100, 0)]


def test_an_unsure_turn_across_a_change_of_voice_is_not_dubbed_on_its_sure_neighbours_face():
    """Track 1 sure of the second turn; the first turn unsure and named track 1 too (its mouth still moves):
    across a change of voice the speaker changed, so `most_likely` dubs the unsure turn (its half of the band
    included) on the other moving face, switching at the change; a sure turn is never moved."""
    segs = [seg(0, 40, "uncertain", 1, 0.3, runner_up=0), _band(40, 50, 1, 50), _band(50, 60, 1, 50),
            seg(60, 100, "speaker", 1)]  # fmt: skip
    d = decide(0, SPEECH, _scored(faces(TWO, segs)), REGION)
    assert [(r.start_frame, r.end_frame, r.speaker, r.status) for r in d.regions] == [
        (0, 50, 0, "uncertain"), (50, 60, 1, "uncertain"), (60, 100, 1, "speaker"),
    ]  # fmt: skip
    # both sides sure of one face (a contradiction for review elsewhere) or both unsure: left as named
    for status in ("speaker", "uncertain"):
        segs = [
            seg(0, 40, status, 1, 0.3),
            _band(40, 50, 1, 50),
            _band(50, 60, 1, 50),
            seg(60, 100, status, 1, 0.3),
        ]
        turns = speaker_turns(_scored(faces(TWO, segs)), "most_likely", 0.0)
        assert {t.track for t in turns} == {1}, turns
    # a third moving face: which other face spoke is not known, left as named
    three = (*TWO, track(2, 250))
    segs = [
        seg(0, 40, "uncertain", 1, 0.3),
        _band(40, 50, 1, 50),
        _band(50, 60, 1, 50),
        seg(60, 100, "speaker", 1),
    ]
    assert {t.track for t in speaker_turns(_scored(faces(three, segs)), "most_likely", 0.0)} == {1}


def test_a_voice_over_part_is_left_undubbed():
    d = decide(0, SPEECH, faces(TWO, [seg(0, 40, "speaker", 0), seg(60, 100, "none")]), REGION)
    assert [(r.start_frame, r.end_frame) for r in d.regions] == [(0, 50)]


@pytest.mark.parametrize(
    ("policy", "dub", "speaker"), [("most_likely", True, 0), ("largest", True, 1), ("skip", False, None)]
)
def test_uncertain_segments_follow_the_policy(policy, dub, speaker):
    segs = [seg(0, 100, "uncertain", 0, 0.3, runner_up=1)]
    d = decide(0, SPEECH, faces(TWO, segs), REGION, uncertain=policy)
    assert d.dub == dub
    if dub:
        assert (
            d.regions[0].speaker == speaker and d.regions[0].status == "uncertain" and "uncertain" in d.reason
        )
    else:
        assert d.reason == "speaker uncertain (speaker.uncertain: skip)"


def test_a_low_score_counts_as_uncertain():
    f = faces(TWO, [seg(0, 100, "speaker", 0, 0.1)])
    assert speaker_turns(f, "most_likely", 0.2) == [Turn(0, 100, 0, 0.1, "uncertain")]
    assert speaker_turns(f, "most_likely", 0.05) == [Turn(0, 100, 0, 0.1, "speaker")]
    with pytest.raises(ValueError, match="speaker.uncertain"):
        speaker_turns(f, "coin", 0.2)


def test_full_frame_mode_can_dub_without_a_face():
    full = RegionConfig(mode="full")
    nobody = faces((), [seg(0, 100, "none")])
    assert not decide(3, SPEECH, nobody, full).dub
    d = decide(3, SPEECH, nobody, full, require_face=False)
    assert d.dub and "full frame" in d.reason and d.regions[0].plan.mode == "full"
    assert not decide(3, SPEECH, nobody, REGION, require_face=False).dub
    assert not decide(3, SILENT, nobody, full, require_face=False).dub


def test_policies_all_and_none():
    d = decide(1, SILENT, faces(TWO), REGION, policy="all")
    assert d.dub and d.reason == "policy: dub all shots" and d.regions[0].speaker == 1  # the largest face
    assert decide(1, SPEECH, None, REGION, policy="none") == ShotDecision(False, "policy: dub no shots")
    with pytest.raises(ValueError, match="dub policy"):
        decide(1, SPEECH, None, REGION, policy="some")


def test_overrides_win_over_policy_and_evidence():
    overrides = {2: "dub", "5": "SKIP"}
    forced = decide(2, SILENT, faces(), REGION, policy="none", overrides=overrides)
    assert forced.dub and forced.reason == "forced by override" and forced.regions[0].plan.mode == "full"
    assert decide(5, SPEECH, None, REGION, policy="all", overrides=overrides) == ShotDecision(
        False, "skipped by override"
    )
    assert decide(4, SILENT, None, REGION, overrides=overrides) == ShotDecision(False, SILENT.reason)
    with pytest.raises(ValueError, match="face analysis"):
        decide(4, SPEECH, None, REGION)


def test_bad_overrides_name_the_shot():
    assert parse_overrides(None) == {} and parse_overrides({"7": " Dub "}) == {7: "dub"}
    with pytest.raises(ValueError, match="shot 3"):
        parse_overrides({3: "maybe"})
    with pytest.raises(ValueError, match="not a shot index"):
        parse_overrides({"intro": "dub"})
    with pytest.raises(ValueError, match=">= 0"):
        parse_overrides({-1: "dub"})


def test_decision_round_trips_through_json():
    import json

    from tasks.decision.record import DubRegion

    d = decide(0, SPEECH, faces(TWO, [seg(0, 40, "speaker", 0), seg(50, 100, "speaker", 1)]), REGION)
    back = [DubRegion.from_dict(r) for r in json.loads(json.dumps(d.to_dict()))["details"]["regions"]]
    assert tuple(back) == d.regions
    f = faces(TWO, [seg(0, 40, "speaker", 0)])
    assert ShotFaces.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    # the whole shot decision, as the renderer keeps it (decision.json) and reads it back
    full = dataclasses.replace(d, speech=SPEECH, faces=f, characters={"0": "ANNA"})
    kept = json.loads(json.dumps(full.to_dict()))
    assert sorted(kept) == ["details", "dub", "reason"]
    assert sorted(kept["details"]) == ["characters", "faces", "regions", "speech"]
    assert ShotDecision.from_dict(kept) == full


def test_the_face_analysis_need_and_the_gate_follow_one_precedence():
    """Wherever `needs_faces` says the picture cannot matter, the gate and the region overrides decide without
    it (full-frame mode: on an analysis with no faces, as `needed_faces` hands them); wherever who speaks
    decides, the gate asks for it."""
    speaker = dataclasses.replace(CFG.speaker, min_score=0.0)
    for policy in POLICIES:
        for action in (None, "dub", "skip"):
            for track in (None, 0):
                for speech in (SPEECH, SILENT):
                    for region in (REGION, RegionConfig(mode="full")):
                        ov = ShotOverrides(3, action=action, speaker=track)
                        gate = dataclasses.replace(CFG.gate, policy=policy)
                        ruling = precedence(ov, policy, speech)
                        case = (policy, action, track, speech.has_speech, region.mode, ruling)
                        if needs_faces(ov, ruling, region.mode):
                            if ruling.dub is None:
                                with pytest.raises(ValueError, match="face analysis"):
                                    decide_dub(ov, speech, None, region, gate, speaker)
                            continue
                        nobody = faces() if region.mode == "full" else None
                        d = decide_dub(ov, speech, nobody, region, gate, speaker)
                        d = apply_region_overrides(d, ov, nobody, region, HW, 100)
                        assert d.dub == bool(ruling.dub) and d.reason == ruling.reason, case
    # and no analysis for nothing: a skipped shot (even one naming a track), a forced full-frame dub, silence
    skip, forced = ShotOverrides(3, action="skip", speaker=0), ShotOverrides(3, action="dub")
    assert not needs_faces(skip, precedence(skip, "auto", SPEECH), "region")
    assert not needs_faces(forced, precedence(forced, "auto", SPEECH), "full")
    assert needs_faces(forced, precedence(forced, "auto", SILENT), "region")  # the region follows the faces
    assert not needs_faces(ShotOverrides(3), precedence(ShotOverrides(3), "auto", SILENT), "region")


def test_an_uncertain_turn_handed_in_says_so():
    """The reason of a shot whose handed-in turns (e.g. `stems.undub_turns`) dub nobody names an uncertain one."""
    turns = [Turn(0, 60, None, 0.3, "uncertain"), Turn(60, 100, None, 1.0, "none")]
    d = decide(0, SPEECH, faces(TWO, [seg(0, 100, "uncertain", 0, 0.3, runner_up=1)]), REGION, turns=turns)
    assert d == ShotDecision(False, "speaker uncertain (speaker.uncertain: skip)")
