"""Shot grouping: properties checked against a brute force over every partition of small inputs."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flows.groups import GpuCost, ShotCost, est_gpu_s, plan_groups

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


def test_slow_mode_one_shot_per_group_fast_mode_dozens():
    """Two quality modes: 40 steps x 3 calls vs 4 steps x 1 call; 14B DiT at 480p ~5 s per forward of an
    81-frame chunk on one H100/H200-class GPU; 60 s process start + model load."""
    slow = GpuCost(steps=40, calls_per_step=3, s_per_forward=5.0, model_load_s=60.0, chunk_overhead_s=4.0)
    fast = GpuCost(steps=4, calls_per_step=1, s_per_forward=5.0, model_load_s=60.0, chunk_overhead_s=4.0)
    chunks = [1, 2, 1, 3, 1, 1, 2, 1] * 24  # 192 shots, 288 chunks

    slow_groups = plan_groups(
        [ShotCost(i, slow.shot_s(c)) for i, c in enumerate(chunks)],
        n_workers=4,
        model_load_s=slow.model_load_s,
    )
    assert [len(g.shots) for g in slow_groups] == [1] * len(chunks)

    fast_groups = plan_groups(
        [ShotCost(i, fast.shot_s(c)) for i, c in enumerate(chunks)],
        n_workers=4,
        model_load_s=fast.model_load_s,
    )
    # 24 s per chunk, 6912 s in all: a group needs >= 540 s of work (60 s load at <= 10 %), i.e.
    # >= 23 chunks ~ 15 shots, so at most 12 groups.
    assert 11 <= len(fast_groups) <= 12
    assert min(len(g.shots) for g in fast_groups) >= 12
    assert all(g.load_share(60.0) <= 0.10 + 1e-12 for g in fast_groups)


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


def test_est_gpu_s_and_cost_from_config_mapping():
    assert est_gpu_s(chunks=3, steps=40, calls_per_step=3, s_per_forward=2.0) == 720.0
    cost = GpuCost.from_mapping({"steps": 8, "calls_per_step": 1, "s_per_forward": 1.5, "model_load_s": 45})
    assert cost.shot_s(4) == 48.0
    assert cost.shot_s(4, needs_gpu=False) == 0.0
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['step'\]"):
        GpuCost.from_mapping({"step": 8, "calls_per_step": 1, "s_per_forward": 1.5, "model_load_s": 45})
    with pytest.raises(ValueError, match="s_per_forward"):
        GpuCost(steps=8, calls_per_step=1, s_per_forward=-1.0, model_load_s=45)


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
