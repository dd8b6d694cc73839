"""Shot grouping: properties checked against a brute force over every partition of small inputs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flows.groups import GpuCost, ShotCost, plan_groups
from tasks.config.media import PlanConfig
from tasks.config.pipeline import load_config
from tasks.timeline.plan import ShotPlan, plan_shot
from tasks.timeline.shots import Shot

TOL = 1e-6


def _partitions(n: int):
    """Every split of range(n) into consecutive non-empty runs, as (start, end) bounds."""
    for k in range(n):
        for cuts in itertools.combinations(range(1, n), k):
            edges = (0, *cuts, n)
            yield list(itertools.pairwise(edges))


def _share(load: float, work: float) -> float:
    return load / (load + work) if load + work > 0 else 0.0


costs_st = st.lists(
    st.one_of(
        st.just(0.0), st.integers(1, 5).map(float), st.floats(0.0, 100.0), st.integers(1, 60).map(float)
    ),
    max_size=9,
)
load_st = st.one_of(st.just(0.0), st.floats(0.0, 60.0))
share_st = st.one_of(st.just(0.10), st.floats(0.02, 1.0))


@settings(max_examples=300, deadline=None)
@example(costs=[3.0, 1.0, 1.0, 1.0, 3.0], n_workers=3, load=100.0, share=0.1, offset=0)  # [3] [1 1 1] [3]
@example(costs=[0.0, 0.0, 5.0, 0.0], n_workers=8, load=1.0, share=0.5, offset=0)
@example(costs=[0.0, 1.0], n_workers=1, load=5e-324, share=0.5, offset=0)  # load * (1 - share) underflows
@given(costs=costs_st, n_workers=st.integers(1, 12), load=load_st, share=share_st, offset=st.integers(0, 500))
def test_plan_groups_against_brute_force(costs, n_workers, load, share, offset):
    shots = [ShotCost(offset + 3 * i, c) for i, c in enumerate(costs)]  # any increasing indices
    groups = plan_groups(shots, n_workers=n_workers, model_load_s=load, max_load_share=share)
    n = len(shots)
    if n == 0:
        assert groups == []
        return

    # Consecutive, in order, every shot exactly once, estimates summed, numbered 0..k-1.
    assert [i for g in groups for i in g.shots] == [s.index for s in shots]
    pos = {s.index: p for p, s in enumerate(shots)}
    for k, g in enumerate(groups):
        assert g.index == k
        assert [pos[i] for i in g.shots] == list(range(pos[g.first], pos[g.last] + 1))
        assert math.isclose(g.est_gpu_s, sum(costs[pos[i]] for i in g.shots), rel_tol=1e-9, abs_tol=1e-9)

    # Never fewer groups than workers while shots remain.
    min_groups = min(n_workers, n)
    assert len(groups) >= min_groups

    # Load-share bound: whenever some partition with >= min_groups groups respects it (clearly), the
    # result respects it too and has as many groups as the best such partition.
    works = [[sum(costs[a:b]) for a, b in p] for p in _partitions(n)]
    clearly_ok = [w for w in works if len(w) >= min_groups and all(_share(load, x) <= share - TOL for x in w)]
    barely_ok = [w for w in works if len(w) >= min_groups and all(_share(load, x) <= share + TOL for x in w)]
    if clearly_ok:
        assert all(_share(load, g.est_gpu_s) <= share + TOL for g in groups)
        assert len(groups) >= max(len(w) for w in clearly_ok)
    if not barely_ok:
        # Impossible: exactly min_groups groups, the longest as short as any partition allows.
        assert len(groups) == min_groups
        best = min(max(w) for w in works if len(w) == min_groups)
        assert max(g.est_gpu_s for g in groups) <= best * (1 + TOL) + TOL

    # Deterministic.
    assert plan_groups(shots, n_workers=n_workers, model_load_s=load, max_load_share=share) == groups


def _full_chunk_plans(chunks: list[int]) -> list[ShotPlan]:
    """Consecutive 25 fps shots of exactly 1, 2, 3 ... full 81-frame chunks (72 new frames per extra chunk)."""
    plans, start = [], 0
    for i, c in enumerate(chunks):
        n = 81 + 72 * (c - 1)
        plans.append(plan_shot(Shot(i, start, start + n), Fraction(25), PlanConfig(25, 81, 9)))
        start += n
    assert [[ch.num_frames for ch in p.chunks] for p in plans] == [[81] * c for c in chunks]
    return plans


def test_quality_mode_one_shot_per_group_fast_mode_dozens():
    """480P on an H200 with a measured 30 s model load: quality (40 steps x 3 branches, bf16) vs fast mode
    (4 steps, guidance distilled away: 1 branch, fp8 GEMMs + fp8 attention), priced from `estimate:`."""
    base = ["infinitetalk.mode=infinitetalk-480", "estimate.load_s.infinitetalk-480=30"]
    fast_set = ["infinitetalk.steps=4", "infinitetalk.text_guide_scale=1", "infinitetalk.audio_guide_scale=1"]
    fast_set += ["infinitetalk.fp8_compute=true", "infinitetalk.fp8_attention=true"]
    slow = GpuCost.from_config(load_config(overrides=base))
    fast = GpuCost.from_config(load_config(overrides=base + fast_set))
    figures = load_config().estimate
    fwd, vae = figures.dit_forward_s["infinitetalk-480"], figures.vae_chunk_s["infinitetalk-480"]
    assert slow.price.chunk_s == pytest.approx(40 * 3 * fwd["bfloat16"] + vae)
    assert fast.price.chunk_s == pytest.approx(4 * 1 * fwd["fp8+fp8attn"] + vae)
    assert slow.model_load_s == fast.model_load_s == 30.0 and not slow.price.fallbacks  # all measured
    chunks = [1, 2, 1, 3, 1, 1, 2, 1] * 24  # 192 shots, 288 chunks
    plans = _full_chunk_plans(chunks)

    slow_groups = plan_groups(
        [ShotCost(i, slow.shot_s(p)) for i, p in enumerate(plans)], n_workers=4, model_load_s=30.0
    )
    assert [len(g.shots) for g in slow_groups] == [1] * len(chunks)  # one chunk already needs > 270 s

    fast_groups = plan_groups(
        [ShotCost(i, fast.shot_s(p)) for i, p in enumerate(plans)], n_workers=4, model_load_s=30.0
    )
    # a group needs >= 270 s of work (30 s load at <= 10 %): 20 chunks of ~13.5 s, a dozen shots or more;
    # the greedy closes a group within one shot (<= 3 chunks) of that
    need_chunks = math.ceil(270.0 / fast.price.chunk_s)
    assert 288 // (need_chunks + 2) <= len(fast_groups) <= 288 // need_chunks
    assert min(sum(chunks[i] for i in g.shots) for g in fast_groups) >= need_chunks
    assert min(len(g.shots) for g in fast_groups) >= 12
    assert all(g.load_share(30.0) <= 0.10 + 1e-12 for g in fast_groups)


def test_unmeasured_figures_fall_back_to_the_cost_stand_ins():
    """Tiny mode has no figures: the cost: stand-ins price its chunks (and are named); pass-through costs 0."""
    cfg = load_config()
    assert cfg.sections["infinitetalk"]["mode"] == "tiny"
    c = cfg.cost
    cost = GpuCost.from_config(cfg)
    assert cost.price.chunk_s == pytest.approx(3 * 3 * c.fallback_dit_forward_s + c.fallback_vae_chunk_s)
    assert cost.model_load_s == c.fallback_load_s and len(cost.price.fallbacks) == 3
    assert "dit_forward_s.tiny.float32 -> cost.fallback_dit_forward_s" in cost.describe()
    (plan,) = _full_chunk_plans([2])
    assert cost.shot_s(plan) == pytest.approx(2 * cost.price.chunk_s)
    passthrough = GpuCost.from_config(cfg, needs_gpu=False)
    assert passthrough.price is None and passthrough.shot_s(plan) == 0.0 and passthrough.model_load_s > 0


def test_pass_through_shots_join_neighbours_not_own_groups():
    costs = [0.0, 0.0, 500.0, 0.0, 0.0, 0.0, 700.0, 0.0]
    groups = plan_groups([ShotCost(i, c) for i, c in enumerate(costs)], n_workers=1, model_load_s=50.0)
    assert [g.shots for g in groups] == [(0, 1, 2), (3, 4, 5, 6, 7)]


def test_more_workers_than_the_bound_allows_still_get_a_group_each():
    # 4 shots of 10 s with a 60 s load: no group can meet 10 %; 3 workers still get 3 groups,
    # balanced so the longest group is 20 s.
    groups = plan_groups([ShotCost(i, 10.0) for i in range(4)], n_workers=3, model_load_s=60.0)
    assert len(groups) == 3
    assert max(g.est_gpu_s for g in groups) == 20.0
    assert groups[-1].name.startswith("group-002 shots ") and groups[-1].name.endswith("-0003")


@pytest.mark.parametrize(
    ("shots", "kwargs", "message"),
    [
        ([ShotCost(0, 1.0)], {"n_workers": 0, "model_load_s": 1.0}, "n_workers"),
        ([ShotCost(0, 1.0)], {"n_workers": 1, "model_load_s": 1.0, "max_load_share": 0.0}, "max_load_share"),
        ([ShotCost(0, 1.0)], {"n_workers": 1, "model_load_s": math.inf}, "model_load_s"),
        ([ShotCost(1, 1.0), ShotCost(1, 1.0)], {"n_workers": 1, "model_load_s": 1.0}, "strictly increasing"),
        ([ShotCost(0, -1.0)], {"n_workers": 1, "model_load_s": 1.0}, "shot 0 has est_gpu_s=-1.0"),
        ([ShotCost(0, math.nan)], {"n_workers": 1, "model_load_s": 1.0}, "shot 0 has est_gpu_s=nan"),
    ],
)
def test_bad_inputs_are_named(shots, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_groups(shots, **kwargs)
