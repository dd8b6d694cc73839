"""Timeline invariants as property tests: shots tile the film, audio slices tile the track, chunk
plans cover every frame once, reference frames lie inside their chunk and their shot."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.config.media import PlanConfig
from tasks.media.audio import sample_at_frame, slice_bounds
from tasks.timeline.plan import model_frame_of, plan_shot
from tasks.timeline.shots import make_shot_list, merge_short, partition_from_cuts

RATES = [
    Fraction(24000, 1001),
    Fraction(30000, 1001),
    Fraction(25),
    Fraction(24),
    Fraction(30),
    Fraction(60000, 1001),
]
SAMPLE_RATES = [8000, 16000, 22050, 44100, 48000]

rates = st.sampled_from(RATES)
films = st.integers(min_value=1, max_value=3000).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.integers(min_value=-5, max_value=n + 5), max_size=40))
)
plan_cfgs = st.sampled_from(
    [PlanConfig(25, 81, 9), PlanConfig(25, 33, 5), PlanConfig(25, 17, 1), PlanConfig(25, 81, 25)]
)


@settings(max_examples=150, deadline=None)
@given(films, st.integers(min_value=1, max_value=30))
def test_shots_tile_the_film(film, min_frames):
    n, cuts = film
    bounds = partition_from_cuts(cuts, n)
    for b in (bounds, merge_short(bounds, min_frames)):
        assert b[0][0] == 0 and b[-1][1] == n
        assert all(a < e for a, e in b)
        assert all(p[1] == q[0] for p, q in zip(b, b[1:], strict=False))
    merged = merge_short(bounds, min_frames)
    if len(merged) > 1:
        assert all(e - a >= min_frames for a, e in merged)
    # every detected cut inside the film survives when nothing is merged
    assert {a for a, _ in bounds[1:]} == {c for c in cuts if 0 < c < n}


@settings(max_examples=150, deadline=None)
@given(films, rates, st.sampled_from(SAMPLE_RATES), st.integers(min_value=-2000, max_value=2000))
def test_audio_slices_sum_to_the_track(film, fps, sr, jitter):
    n, cuts = film
    shots = make_shot_list(cuts, n, fps)
    total = max(0, sample_at_frame(n, fps, sr) + jitter)
    edges = [s.start_frame for s in shots.shots] + [n]
    bounds = slice_bounds(edges, fps, sr, total)
    assert len(bounds) == len(shots.shots)
    assert bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a <= b for a, b in bounds)
    assert all(p[1] == q[0] for p, q in zip(bounds, bounds[1:], strict=False))
    assert sum(b - a for a, b in bounds) == total
    if jitter == 0:  # an exact-length track: inner bounds sit within half a sample of the frame time
        for (a, _), s in zip(bounds[1:], shots.shots[1:], strict=True):
            assert abs(Fraction(a) - Fraction(s.start_frame) * sr / fps) <= Fraction(1, 2)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=1500), rates, plan_cfgs)
def test_chunk_plan_covers_every_frame_once(start, n, fps, cfg):
    from tasks.timeline.shots import Shot

    plan = plan_shot(Shot(0, start, start + n), fps, cfg)
    chunks = plan.chunks
    assert chunks
    # model frames: new ranges tile [0, M); windows are 4n+1, at most frame_num long, and hold their new range
    assert chunks[0].new_start == 0 and chunks[-1].new_end == plan.model_frames
    assert all(p.new_end == q.new_start for p, q in zip(chunks, chunks[1:], strict=False))
    for c in chunks:
        assert (c.num_frames - 1) % 4 == 0 and c.num_frames <= cfg.frame_num
        assert c.model_start <= c.new_start < c.new_end <= c.model_end
        if c.index > 0:
            assert c.new_start == c.model_start + cfg.motion_frames
            assert c.model_start == chunks[c.index - 1].model_end - cfg.motion_frames
    # source frames: every frame of the shot is produced by exactly one chunk, in order
    assert chunks[0].src_start == 0 and chunks[-1].src_end == n
    assert all(p.src_end == q.src_start for p, q in zip(chunks, chunks[1:], strict=False))
    produced = [j for c in chunks for j in range(c.src_start, c.src_end)]
    assert produced == list(range(n))
    for c in chunks:
        idx = plan.conform_indices(c)
        assert all(c.new_start <= c.model_start + i < c.new_end for i in idx)
        # reference frame: inside the shot, on screen at the chunk's start time
        assert 0 <= c.ref_frame < n
        t = Fraction(c.model_start, cfg.model_fps)
        if c.ref_frame < n - 1:
            assert Fraction(c.ref_frame) / fps <= t < Fraction(c.ref_frame + 1) / fps
        else:
            assert Fraction(c.ref_frame) / fps <= t
        # ...and inside the chunk: its display time overlaps the chunk's time span
        assert Fraction(c.ref_frame) / fps < Fraction(c.model_end, cfg.model_fps)
        assert t < Fraction(c.ref_frame + 1) / fps or c.ref_frame == n - 1
    # the conform maps source frame j to model frame round(j * 25 / fps)
    assert plan.model_frames == model_frame_of(n - 1, fps, cfg.model_fps) + 1
