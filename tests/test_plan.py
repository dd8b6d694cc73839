"""Chunk plans on the 25 fps model timeline and sliding reference frames."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from tasks.config.media import PlanConfig
from tasks.config.pipeline import load_config
from tasks.timeline.plan import (
    ShotPlan,
    chunk_windows,
    model_frame_of,
    model_length,
    plan_shot,
    round_up_4n1,
    source_frame_at,
)
from tasks.timeline.shots import Shot

CFG = PlanConfig(model_fps=25, frame_num=81, motion_frames=9)


def test_defaults_come_from_the_yaml():
    assert load_config().plan == CFG


def test_chunk_windows_examples():
    assert chunk_windows(1, 81, 9) == [(0, 1, 0, 1)]
    assert chunk_windows(30, 81, 9) == [(0, 33, 0, 30)]  # one shorter 4n+1 chunk
    assert chunk_windows(81, 81, 9) == [(0, 81, 0, 81)]
    assert chunk_windows(82, 81, 9) == [(0, 81, 0, 81), (72, 13, 81, 82)]  # 9 motion + 1 new -> 13 (4n+1)
    assert chunk_windows(153, 81, 9) == [(0, 81, 0, 81), (72, 81, 81, 153)]
    assert chunk_windows(154, 81, 9)[-1] == (144, 13, 153, 154)
    assert [round_up_4n1(x) for x in (1, 2, 5, 6, 81)] == [1, 5, 5, 9, 81]
    with pytest.raises(ValueError):
        chunk_windows(100, 80, 9)


def test_25fps_matches_the_official_streaming_bookkeeping():
    # official: chunk k covers audio frames [72k, 72k+81) and its reference is cond_video frame 72k
    plan = plan_shot(Shot(0, 0, 300), Fraction(25), CFG)
    assert plan.model_frames == 300
    assert [c.model_start for c in plan.chunks] == [0, 72, 144, 216, 288]
    assert [c.ref_frame for c in plan.chunks] == [0, 72, 144, 216, 288]
    assert [(c.src_start, c.src_end) for c in plan.chunks] == [
        (0, 81),
        (81, 153),
        (153, 225),
        (225, 297),
        (297, 300),
    ]
    assert all(
        plan.conform_indices(c) == list(range(c.new_start - c.model_start, c.new_end - c.model_start))
        for c in plan.chunks
    )


def test_film_rate_reference_frames_do_not_drift():
    fps = Fraction(24000, 1001)
    n = 10 * 60 * 24  # ten minutes of one shot
    plan = plan_shot(Shot(0, 0, n), fps, CFG)
    for c in plan.chunks:
        t_chunk = Fraction(c.model_start, 25)
        # the reference is the source frame on screen when the chunk starts
        assert Fraction(c.ref_frame) / fps <= t_chunk < Fraction(c.ref_frame + 1) / fps
    last = plan.chunks[-1]
    assumed_25 = last.model_start  # what an "every input is 25 fps" index would pick
    assert assumed_25 - last.ref_frame > 500  # ~4 % of ten minutes: the official drift
    assert plan.model_frames == model_frame_of(n - 1, fps, 25) + 1 == 15015  # 600.6 s * 25


def test_conform_maps_every_source_frame_to_a_generated_frame():
    fps = Fraction(30000, 1001)
    plan = plan_shot(Shot(3, 100, 400), fps, CFG)
    seen = []
    for c in plan.chunks:
        idx = plan.conform_indices(c)
        assert all(c.new_start - c.model_start <= i < c.new_end - c.model_start for i in idx)
        seen += [c.model_start + i for i in idx]
    assert len(seen) == 300 and seen == sorted(seen)
    assert seen == [model_frame_of(j, fps, 25) for j in range(300)]


def test_mapping_helpers():
    fps = Fraction(24000, 1001)
    assert [model_frame_of(j, fps, 25) for j in range(5)] == [0, 1, 2, 3, 4]
    assert model_frame_of(23, fps, 25) == 24  # 23 * 1.0427 = 23.98
    assert source_frame_at(25, fps, 25) == 23  # 1 s = frame 23.976 -> 23
    assert model_length(0, fps, 25) == 0 and model_length(1, fps, 25) == 1


def test_plan_serialises():
    plan = plan_shot(Shot(2, 50, 250), Fraction(24), CFG)
    assert ShotPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plan.to_dict()["fps"] == "24" and plan.chunks[0].model_end == 81
