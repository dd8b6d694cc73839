"""Characters, the cast file and per-character stems: composed real footage (tests/cast_cases.py) through the
real decode, faces, dlib embeddings, stem VAD and gate; the linking and turn logic on hand-built inputs."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import soundfile as sf
import yaml

from flows.cli import main
from flows.estimate import estimate_film
from tasks.config.pipeline import load_config
from tasks.decision.cast import plan_characters, plan_names, read_cast_file
from tasks.decision.characters import TrackFaces, link_characters
from tasks.decision.plan_file import plan_document, write_plan
from tasks.decision.stems import parse_stems, stem_turns
from tasks.errors import ConfigError
from tasks.perception.face_analysis import ShotFaces, TrackInfo
from tests.cast_cases import HALF, N, write_film
from tests.speaker_cases import FPS, SR, side_of


@pytest.fixture(scope="module")
def film(tmp_path_factory):
    root = tmp_path_factory.mktemp("cast")
    files = write_film(root)
    return files, root / "ws"


def _cast_cfg(files, **extra):
    stills = {"ANNA": [str(files["ANNA_still"])], "BEN": [str(files["BEN_still"])]}
    return load_config(updates={"cast": {"characters": stills, **extra}})


@pytest.fixture(scope="module")
def named(film):
    """The film with both stills and both stems (faces and embeddings cached for the other estimates)."""
    files, ws = film
    stems = {"ANNA": str(files["ANNA"]), "BEN": str(files["BEN"])}
    return estimate_film(files["film"], files["mix"], _cast_cfg(files), stems, work_dir=ws).to_dict()


def _sides(shot):
    return [(r["start_frame"] - shot["start_frame"], side_of(r["box"]), r["status"]) for r in shot["regions"]]


def test_the_same_person_in_several_shots_is_one_character(named, film):
    files, ws = film
    est = estimate_film(
        files["film"], files["mix"], load_config(overrides=["cast.identify=always"]), work_dir=ws
    )
    chars = {c["id"]: c for c in est.to_dict()["characters"]}
    assert len(chars) == 3, chars  # ANNA and BEN in shots 0-2, CARL alone in shot 3
    assert sorted(c["shots"] for c in chars.values()) == [[0, 1, 2], [0, 1, 2], [3]]
    assert all(c["name"] is None for c in chars.values())  # nobody named them
    # the automatic clusters are the stills' characters, track for track
    by_track = {tuple(t): c["name"] for c in named["characters"] for t in c["tracks"]}
    for c in chars.values():
        assert len({by_track[tuple(t)] for t in c["tracks"]}) == 1, (c, by_track)


def test_stills_name_the_characters_on_either_side(named):
    shots = named["shots"]
    anna = next(c for c in named["characters"] if c["name"] == "ANNA")
    assert anna["shots"] == [0, 1, 2]
    # stems drive the right faces both ways: ANNA first (left in shot 0, right in shot 1), then BEN
    for shot, first, second in ((shots[0], "left", "right"), (shots[1], "right", "left")):
        sides = _sides(shot)
        assert [(s[1], s[2]) for s in sides] == [(first, "speaker"), (second, "speaker")], shot["reason"]
        assert [r["character"] for r in shot["regions"]] == ["ANNA", "BEN"]
        assert abs(sides[1][0] - HALF) <= FPS // 2, sides  # the switch within 0.5 s of the stems' switch
        assert "(ANNA)" in shot["reason"] and "(BEN)" in shot["reason"]


def test_overlapping_stems_make_one_two_speaker_region_with_both_boxes(named):
    shot = named["shots"][2]
    (region,) = shot["regions"]
    assert region["status"] == "two" and (region["start_frame"], region["end_frame"]) == (2 * N, 3 * N)
    people = {p["character"]: p for p in region["people"]}
    assert set(people) == {"ANNA", "BEN"} and side_of(people["ANNA"]["box"]) == "left"
    assert side_of(people["BEN"]["box"]) == "right"
    assert {p["stem"] for p in region["people"]} == {"ANNA", "BEN"}
    assert region["speaker"] in {p["track"] for p in region["people"]}  # the louder one: the fallback
    x0, y0, x1, y1 = region["box"]
    for p in region["people"]:
        b = p["box"]
        assert x0 <= b[0] < b[2] <= x1 and y0 <= b[1] < b[3] <= y1  # the region holds both faces


def test_a_stem_without_its_face_on_screen_is_voice_over(named):
    shot = named["shots"][3]
    assert not shot["dub"] and shot["reason"] == "voice-over: ANNA off screen", shot["reason"]


def test_an_undubbed_character_is_never_dubbed(named, film):
    files, ws = film
    stems = {"ANNA": str(files["ANNA"]), "BEN": str(files["BEN"])}
    est = estimate_film(files["film"], files["mix"], _cast_cfg(files, undub=["BEN"]), stems, work_dir=ws)
    shots = est.to_dict()["shots"]
    for shot in shots[:3]:
        assert {r["character"] for r in shot["regions"]} == {"ANNA"}, shot["reason"]
        assert all(r["status"] == "speaker" for r in shot["regions"])  # BEN's half of shot 2 is not his


def test_the_plan_file_renames_automatic_characters(named, film, tmp_path):
    files, ws = film
    auto = estimate_film(
        files["film"], files["mix"], load_config(overrides=["cast.identify=always"]), work_dir=ws
    )
    doc = plan_document(str(files["film"]), str(files["mix"]), Fraction(25), auto.frames, [])
    doc["characters"] = plan_characters(auto.characters)
    path = write_plan(tmp_path / "plan.yaml", doc)
    data = yaml.safe_load(path.read_text())
    carl = next(c for c in data["characters"] if c["shots"] == [3])
    carl["name"] = "CARL"
    path.write_text(yaml.safe_dump(data))
    assert plan_names(path) == {carl["id"]: "CARL"}
    again = estimate_film(
        files["film"], files["mix"], load_config(updates={"cast": {"names": plan_names(path)}}), work_dir=ws
    )
    assert {c["name"] for c in again.characters} == {None, "CARL"}


def test_linking_needs_a_clear_vote_and_never_merges_people_on_screen_together():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=128), rng.normal(size=128)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)

    def near(v, n, spread=0.01):
        return v + rng.normal(scale=spread, size=(n, 128))

    tracks = [
        TrackFaces(0, 0, 0, 50, near(a, 4)),
        TrackFaces(0, 1, 0, 50, near(a, 4)),  # the same face twice at once: never one character
        TrackFaces(1, 0, 0, 50, near(b, 4)),
        TrackFaces(2, 0, 0, 50, np.concatenate([near(a, 2), near(b, 2)])),  # a split vote: its own character
        TrackFaces(3, 0, 0, 50, near(a, 4)),
    ]
    chars = link_characters(tracks, {"ANNA": near(a, 1)}, link_distance=0.5, link_votes=0.6)
    tracks_of = {c.id: c.tracks for c in chars}
    assert tracks_of["ANNA"] == [(0, 0), (3, 0)]
    assert sorted(tracks_of.values()) == sorted([[(0, 0), (3, 0)], [(0, 1)], [(1, 0)], [(2, 0)]])
    assert [c.id for c in chars] == ["ANNA", "c1", "c2", "c3"]  # automatic ids in order of appearance


def _faces(n=100):
    def track(k, x):
        frames = tuple(range(0, n, 4))
        return TrackInfo(k, 0, n, 100.0, False, frames, tuple((x, 50, x + 100, 170) for _ in frames))

    return ShotFaces(n, 25.0, (360, 640), (360, 640), True, (track(0, 40), track(1, 400)), (), (), (), 5, 0.0)


def test_stem_turns_bridge_pauses_join_short_turns_and_name_voice_over():
    faces, chars = _faces(), {"0": "ANNA", "1": "BEN"}
    # ANNA pauses briefly (bridged); BEN's 3-frame "mm" over her is no turn of two; the silence is split
    speech = {"ANNA": [[0, 20, -20], [25, 45, -20]], "BEN": [[30, 33, -30], [60, 100, -25]], "CARL": []}
    turns, _ = stem_turns(faces, chars, speech, [], min_turn=10, bridge=10)
    assert [(t.start, t.end, t.track, t.status) for t in turns] == [
        (0, 52, 0, "speaker"),
        (52, 100, 1, "speaker"),
    ]
    unbridged, _ = stem_turns(faces, chars, speech, [], min_turn=10, bridge=0)
    assert [t.track for t in unbridged] == [0, 1]  # the 5-frame pause alone does not end her turn either
    # both at once, then an undubbed BEN: only ANNA
    both = {"ANNA": [[0, 100, -20]], "BEN": [[0, 100, -30]]}
    (two,), _ = stem_turns(faces, chars, both, [], min_turn=10)
    assert (
        two.status == "two" and two.track == 0 and [p["track"] for p in two.people] == [0, 1]
    )  # ANNA is louder
    turns, _ = stem_turns(faces, chars, both, ["BEN"], min_turn=10)
    assert [(t.track, t.status) for t in turns] == [(0, "speaker")]
    # a character with no face in the shot: voice-over, and the reason says who
    turns, why = stem_turns(faces, {"0": "ANNA"}, {"BEN": [[0, 100, -20]]}, [], min_turn=10)
    assert [t.track for t in turns] == [None] and why == "voice-over: BEN off screen"


def test_bad_stems_and_cast_files_are_one_line_errors(film, tmp_path, capsys):
    files, _ = film
    with pytest.raises(ConfigError, match="expected NAME=FILE"):
        parse_stems(["ANNA"])
    with pytest.raises(ConfigError, match="two stems for one character"):
        parse_stems(["ANNA=a.wav", "ANNA=b.wav"])
    cast = tmp_path / "cast.yaml"
    cast.write_text("characters: {ANNA: [missing.png]}\nvillains: [X]\n")
    with pytest.raises(ConfigError, match="unknown key 'villains'"):
        read_cast_file(cast)
    base = ["estimate", str(files["film"]), "--audio", str(files["mix"])]
    cast.write_text("characters: {ANNA: [missing.png]}\n")
    short = tmp_path / "short.wav"
    sf.write(short, np.zeros(SR, np.float32), SR)
    for args, wanted in (
        (["--stem", "ANNA"], "--stem: 'ANNA': expected NAME=FILE"),
        (["--stem", f"ANNA={tmp_path / 'nope.wav'}"], f"{tmp_path / 'nope.wav'}"),
        (["--cast", str(cast)], f"{tmp_path / 'missing.png'}: cast still of ANNA not found"),
        (["--stem", f"DAVE={files['ANNA']}"], "--stem: DAVE: no such character"),
        (["--stem", f"c1={short}"], f"{short}: audio is 1.000 s"),  # the stem's length, before any analysis
    ):
        assert main(base + args) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("dubflow: error:") and wanted in err and "\n" not in err, err


def test_two_speaker_regions_in_the_shot_table_and_the_qc_sheet():
    from flows.report import speaker_columns
    from tasks.decision.gate import decide_dub
    from tasks.decision.overrides import ShotOverrides
    from tasks.perception.speech import SpeechInfo
    from tasks.picture.region import RegionConfig
    from tasks.render.qc_overlay import GREEN, SpeakerOverlay

    faces, chars = _faces(), {"0": "ANNA", "1": "BEN"}
    turns, _ = stem_turns(faces, chars, {"ANNA": [[0, 100, -20]], "BEN": [[0, 100, -30]]}, [], min_turn=10)
    speech = SpeechInfo(True, 1.0, ((0.0, 4.0),), "speech")
    cfg = load_config()
    d = decide_dub(
        ShotOverrides(0), speech, faces, RegionConfig(), cfg.gate, cfg.speaker, turns=turns, names=chars
    )
    assert d.dub and d.reason.endswith("track 0 (ANNA) + track 1 (BEN) (score 1.00)"), d.reason
    (region,) = d.regions
    again = type(region).from_dict(region.to_dict())
    assert again == region and again.people == region.people  # the contract's JSON round trip
    row = speaker_columns({"regions": [{**region.to_dict(), "character": "ANNA"}]})
    assert row["speaker"] == "0 ANNA + 1 BEN"
    frame = np.zeros((360, 640, 3), np.uint8)
    drawn = SpeakerOverlay(faces, [region], chars).annotate(10, frame)
    for x0, y0, _x1, y1 in ((40, 50, 140, 170), (400, 50, 500, 170)):  # both faces marked as speaking
        assert (drawn[y0 + 20 : y1 - 20, x0] == GREEN).all(axis=1).any()
