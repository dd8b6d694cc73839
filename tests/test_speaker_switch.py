"""A speaker switch inside one shot, through the real renderer with the tiny model: the chunk plan splits at
the switch (one sampler run per part, each in its own speaker's crop), and each face fades back to / in
from the source around it, so neither pops and no frame has both regions pasted hard."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

import tasks.infinitetalk.resident as it
from tasks.config.media import PlanConfig
from tasks.config.pipeline import load_config
from tasks.decision.record import DubRegion
from tasks.decision.shot_decision import decide_shot, switch_frames
from tasks.infinitetalk import ResidentModels, check_plan_agreement
from tasks.media.audio import prepare_dialogue, slice_bounds
from tasks.media.intermediates import write_marker
from tasks.media.probe import probe
from tasks.picture.region import switch_weights
from tasks.render.shot import ShotJob, render_shot_result
from tasks.timeline.plan import plan_shot, split_at
from tasks.timeline.shots import Shot
from tests.media import decode_all
from tests.speaker_cases import FPS, SR, cases, encode, side_of
from tests.tiny_weights import seed_cache

START, END = 36, 96  # frames of the turn-taking case around its switch (the left turn ends at frame 62)


@pytest.mark.parametrize("fps", [Fraction(25), Fraction(24000, 1001), Fraction(30)])
def test_a_split_plan_covers_the_shot_once_and_each_part_is_the_samplers(fps):
    plan = plan_shot(Shot(0, 0, 300), fps, PlanConfig(25, 33, 9))
    split = split_at(plan, [125, 0, 300])  # switches at the ends are no switches
    assert split.switches == (125,) and split_at(plan, []) is plan
    assert [j for c in split.chunks for j in range(c.src_start, c.src_end)] == list(range(300))
    assert [c.index for c in split.chunks] == list(range(len(split.chunks)))
    for c in split.chunks:
        assert (c.src_start < 125) == (c.part == 0) and (c.src_end <= 125) == (c.part == 0)
        assert (c.ref_frame < 125) == (c.part == 0)  # a part's reference shows its own speaker
        idx = split.conform_indices(c)
        assert min(idx) >= 0 and max(idx) < c.num_frames
    assert [c.part_chunk for c in split.chunks if c.part == 1][0] == 0
    check_plan_agreement(split)  # every part is chunked as the sampler chunks a shot of its length
    assert type(split).from_dict(split.to_dict()) == split
    assert "switches" not in plan.to_dict() and "part" not in plan.to_dict()["chunks"][0]  # shot keys kept


def test_switch_weights_fade_each_face_around_the_switch():
    w = switch_weights([(0, 50, None), (50, 100, None)], 100, 4)
    assert w[:46] == (1.0,) * 46 and w[54:] == (1.0,) * 46
    assert w[46:54] == (0.875, 0.625, 0.375, 0.125, 0.125, 0.375, 0.625, 0.875)
    assert switch_weights([(10, 50, None)], 60, 0) == tuple(float(10 <= t < 50) for t in range(60))


@pytest.fixture(scope="module")
def switched(tmp_path_factory, tiny_weights):
    """The composed turn-taking case (left speaks, then the right one): its speakers' crops from the whole
    case's decision, then frames [START, END) around the true switch rendered as one shot dubbed left, then
    right (tiny model)."""
    root = tmp_path_factory.mktemp("switch")
    seed_cache(tiny_weights, root / "ws" / ".cache")
    case = cases()["turn_taking"]
    whole = probe(encode(root / "whole.mp4", case.frames, case.audio))
    cfg = load_config(overrides=["backend.name=infinitetalk", f"workspace.root={root / 'ws'}"])
    full = decide_shot(0, 0, whole.frame_count, whole, case.audio, SR, cfg)
    n = END - START
    plans = {side_of(r.plan.face_box or r.plan.box): r for r in full.regions}
    left, right = plans["left"], plans["right"]  # each speaker's crop plan (static: the seeds barely move)
    cut = round(case.truth[1][0] * FPS) - START  # the true switch: this test is about the render, not who
    regions = [
        DubRegion(0, cut, left.speaker, left.score, "speaker", left.plan),
        DubRegion(cut, n, right.speaker, right.score, "speaker", right.plan),
    ]
    decision = dataclasses.replace(full, regions=tuple(regions))
    audio = case.audio[START * SR // FPS : END * SR // FPS]
    film = encode(root / "film.mp4", case.frames[START:END], audio)
    dub = root / "dub.wav"
    import soundfile as sf

    sf.write(dub, audio, SR)
    info = probe(film)
    track = prepare_dialogue(
        dub, frame_count=info.frame_count, fps=info.fps, cfg=cfg.audio, out_wav=root / "work" / "dialogue.wav"
    )
    plan = plan_shot(Shot(0, 0, n), info.fps, cfg.plan)
    (bounds,) = slice_bounds([0, n], info.fps, track.sample_rate, track.n_samples)
    job = ShotJob(
        info.to_dict(), plan.to_dict(), track.to_dict(), bounds, str(root / "shot.mkv"), cfg.to_dict(),
        work_dir=str(root / "work"),
    )  # fmt: skip
    (root / "shot.chunks").mkdir()
    write_marker(root / "shot.chunks" / "decision.json", decision.to_dict())  # the gate's, as if taken here
    old, it.RESIDENT = it.RESIDENT, ResidentModels()
    try:
        result = render_shot_result(job)
    finally:
        it.RESIDENT = old
    return case, cfg, film, result, plan, decision


def test_the_plan_splits_at_the_switch_and_each_face_fades(switched):
    case, cfg, film, result, plan, decision = switched
    regions = list(decision.regions)
    assert [side_of(r.plan.face_box or r.plan.box) for r in regions] == ["left", "right"], decision.reason
    switch = regions[1].start_frame
    split = split_at(plan, switch_frames(decision))
    assert split.switches == (switch,) and switch not in [c.src_start for c in plan.chunks]
    assert switch in [c.src_start for c in split.chunks]  # a chunk (a part's first) starts at the switch
    assert result["dubbed"] and result["chunks"] == len(split.chunks)  # the renderer ran the split plan

    src, out = decode_all(film).astype(np.int16), decode_all(result["path"]).astype(np.int16)
    diff = np.abs(src - out).mean(axis=3)  # (T, H, W)
    left, right = diff[:, :, :300], diff[:, :, 340:]  # the two clips' halves (the crops stay inside them)
    blend = cfg.region.switch_blend_frames
    far_before, far_after = slice(0, switch - blend), slice(switch + blend, len(src))
    # each speaker's turn: its own half dubbed (random tiny weights: noise), the other half the source
    assert left[far_before].mean() > 10 and right[far_before].max() == 0
    assert right[far_after].mean() > 10 and left[far_after].max() == 0
    # around the switch: each face fades, so no frame has both halves pasted at full strength
    per_frame_left = left.reshape(len(src), -1).mean(axis=1)
    per_frame_right = right.reshape(len(src), -1).mean(axis=1)
    full_l, full_r = np.median(per_frame_left[far_before]), np.median(per_frame_right[far_after])
    for t in range(switch - blend, switch + blend):
        assert per_frame_left[t] < 0.9 * full_l or per_frame_right[t] < 0.9 * full_r, t
        assert per_frame_left[t] == 0 or per_frame_right[t] == 0, t  # never both regions at once
    assert per_frame_left[switch - 1] < 0.3 * full_l and per_frame_right[switch] < 0.3 * full_r
