"""Shot partition: pure tiling/merging logic and detection on real clips with known cuts."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

from tasks.config.pipeline import load_config
from tasks.media.probe import probe
from tasks.timeline.shots import ShotList, detect_shots, make_shot_list, merge_short, partition_from_cuts
from tests.media import make_clip

DATA = Path(__file__).resolve().parents[1] / "data"


def test_partition_from_cuts_tiles_and_ignores_edges():
    assert partition_from_cuts([5, 3, 0, 10, 12, 3], 10) == [(0, 3), (3, 5), (5, 10)]
    assert partition_from_cuts([], 7) == [(0, 7)]
    assert partition_from_cuts([1, 2], 3) == [(0, 1), (1, 2), (2, 3)]  # one-frame shots are kept
    assert partition_from_cuts([4], 0) == []


def test_merge_short_merges_into_shorter_neighbour_only_when_asked():
    b = [(0, 2), (2, 10), (10, 11), (11, 20)]
    assert merge_short(b, 1) == b
    assert merge_short(b, 3) == [(0, 11), (11, 20)]
    assert merge_short([(0, 5), (5, 6), (6, 8)], 2) == [
        (0, 5),
        (5, 8),
    ]  # ties of length go to the shorter side
    assert merge_short([(0, 1)], 10) == [(0, 1)]


def test_shot_list_serialises_with_exclusive_ends():
    sl = make_shot_list([24], 48, Fraction(24000, 1001))
    d = sl.to_dict()
    assert d["shots"][0] == {"index": 0, "start_frame": 0, "end_frame": 24, "start_s": 0.0, "end_s": 1.001}
    assert d["shots"][1]["start_s"] == d["shots"][0]["end_s"]
    assert ShotList.from_dict(json.loads(json.dumps(d))) == sl


def test_detects_known_cuts_including_very_short_shot(tmp_path: Path):
    clip = make_clip(tmp_path / "cuts.mp4", (12, 3, 9, 14), fps="30000/1001", gop=5)
    shots = detect_shots(probe(clip), load_config().shots)
    assert [(s.start_frame, s.end_frame) for s in shots.shots] == [(0, 12), (12, 15), (15, 24), (24, 38)]
    assert shots.frame_count == 38 and shots.fps == Fraction(30000, 1001)
    merged = detect_shots(probe(clip), load_config(overrides=["shots.min_shot_frames=4"]).shots)
    # the 3-frame shot joins its shorter neighbour (9 frames, not 12)
    assert [(s.start_frame, s.end_frame) for s in merged.shots] == [(0, 12), (12, 24), (24, 38)]


def test_sample_film_cuts_are_exact():
    meta = json.loads((DATA / "sample_film.json").read_text())
    shots = detect_shots(probe(DATA / meta["film"]), load_config().shots)
    assert [s.start_frame for s in shots.shots[1:]] == meta["cut_frames"]
    assert shots.frame_count == meta["frame_count"] and str(shots.fps) == meta["fps"]
