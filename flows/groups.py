"""Shot groups: the unit of distribution on the GPU pool, and the GPU-time estimate that sizes them.

Each group becomes one child flow run (deployment ``dub-group/gpu``) on a GPU worker, and every child
run pays a fixed start-up cost once (process start, imports, loading ~35 GB of weights: ``model_load_s``).
Groups are runs of *consecutive* shots, sized so that this fixed cost is at most ``max_load_share`` of the
group's total GPU time::

    load_share(group) = model_load_s / (model_load_s + sum of the group's shot estimates)

In slow quality mode (40 steps x 3 model calls per chunk) one shot already dwarfs the load, so each shot
is its own group; in fast mode (a few steps, one call) dozens of shots share one load. Among all
partitions that respect the bound, ``plan_groups`` takes the one with the *most* groups (finer retries,
better spread over workers). It never returns fewer groups than ``min(n_workers, n_shots)``: when the
bound cannot hold with that many groups, it gives exactly that many groups, balanced so the longest
group is as short as possible (the film's wall time is bounded by its longest group).

A shot's estimate and the load come from ``GpuCost``: the same chunk price as ``dubflow estimate``
(the backend's ``price`` hook, ``tasks.render.backend.backend_price``: the run's steps, guidance branches and precision against the config's
``estimate:`` figures), with the ``cost.fallback_*`` stand-ins where a figure is not measured.

Every group is charged one model load, even one made only of pass-through shots (cost ~0); this is
conservative and keeps such shots merged into neighbouring groups instead of paying a child run each.
Pure module: no Prefect, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tasks.config.pipeline import PipelineConfig
from tasks.render.backend import backend_price, backend_shot_price
from tasks.render.cost import ChunkPrice
from tasks.timeline.plan import ShotPlan

# Relative slack when comparing float sums, so that a group whose work equals the needed work up to
# rounding counts as meeting the bound.
_REL_TOL = 1e-9


@dataclass(frozen=True)
class ShotCost:
    """A shot's estimated GPU seconds (0 for shots that need no GPU, e.g. pass-through)."""

    index: int
    est_gpu_s: float


@dataclass(frozen=True)
class Group:
    """A run of consecutive shots processed by one child flow run (one model load)."""

    index: int
    shots: tuple[int, ...]
    est_gpu_s: float  # sum of the shots' estimates, without the model load

    @property
    def first(self) -> int:
        return self.shots[0]

    @property
    def last(self) -> int:
        return self.shots[-1]

    @property
    def name(self) -> str:
        """Run name shown in the UI, e.g. ``group-003 shots 0012-0019``."""
        return f"group-{self.index:03d} shots {self.first:04d}-{self.last:04d}"

    def load_share(self, model_load_s: float) -> float:
        """Fraction of this group's GPU time spent loading the model."""
        total = model_load_s + self.est_gpu_s
        return model_load_s / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        return {"index": self.index, "shots": list(self.shots), "est_gpu_s": self.est_gpu_s}


@dataclass(frozen=True)
class GpuCost:
    """The GPU-time model sizing groups: one full chunk's price and the model load every group pays.

    The price is the backend's (`tasks.render.backend.backend_price`) of the run's config, the same rule as `dubflow estimate`,
    with the `cost.fallback_*` stand-ins for unmeasured figures; ``price`` is None when the backend needs
    no GPU (pass-through: shots cost 0, a group still pays a process start, so groups = one per worker).
    """

    price: ChunkPrice | None
    model_load_s: float
    max_load_share: float
    backend: str = ""  # whose `shot_price` hook prices a shot

    @classmethod
    def from_config(cls, cfg: PipelineConfig, *, needs_gpu: bool = True) -> GpuCost:
        """From a loaded config; ``needs_gpu=False`` (pass-through) skips the InfiniteTalk settings."""
        price = backend_price(cfg, fallbacks=True) if needs_gpu else None
        if price is None:
            return cls(None, cfg.cost.fallback_load_s, cfg.cost.max_load_share, cfg.backend.name)
        assert price.load_s is not None  # filled by a fallback when unmeasured
        return cls(price, price.load_s, cfg.cost.max_load_share, cfg.backend.name)

    def shot_s(self, plan: ShotPlan, regions: Sequence[Mapping[str, Any]] = ()) -> float:
        """Estimated GPU seconds of a dubbed shot (its chunks scaled by their latent frames, and what its
        dubbed `regions` add, e.g. two speakers' model switch; 0 without GPU)."""
        return 0.0 if self.price is None else backend_shot_price(self.backend, self.price, plan, regions)

    def describe(self) -> str:
        """One line for the film run's log: the figures used and which were stand-ins."""
        if self.price is None:
            return "no GPU work (pass-through backend): every shot costs 0"
        return self.price.describe()


def min_group_work_s(model_load_s: float, max_load_share: float) -> float:
    """Smallest group work (GPU s, without the load) for which the load share is <= ``max_load_share``."""
    if model_load_s == 0 or max_load_share >= 1:
        return 0.0
    # a group with no work has load share 1: never 0 here, even when the product underflows (tiny loads)
    return max(model_load_s / max_load_share * (1.0 - max_load_share), math.ulp(0.0))


def plan_groups(
    shots: list[ShotCost], *, n_workers: int, model_load_s: float, max_load_share: float = 0.10
) -> list[Group]:
    """Partition ``shots`` (in order) into groups of consecutive shots; see the module docstring."""
    _validate(shots, n_workers, model_load_s, max_load_share)
    if not shots:
        return []
    costs = [s.est_gpu_s for s in shots]
    need = min_group_work_s(model_load_s, max_load_share)
    bounds = _most_groups_meeting(costs, need)
    min_groups = min(n_workers, len(shots))
    if len(bounds) < min_groups or not all(_meets(math.fsum(costs[a:b]), need) for a, b in bounds):
        bounds = _balanced(costs, min_groups)
    return [
        Group(index=g, shots=tuple(s.index for s in shots[a:b]), est_gpu_s=math.fsum(costs[a:b]))
        for g, (a, b) in enumerate(bounds)
    ]


def _validate(shots: Sequence[ShotCost], n_workers: int, model_load_s: float, max_load_share: float) -> None:
    if n_workers < 1:
        raise ValueError(f"plan_groups: n_workers must be >= 1, got {n_workers}")
    if not (math.isfinite(model_load_s) and model_load_s >= 0):
        raise ValueError(f"plan_groups: model_load_s must be a finite number >= 0, got {model_load_s}")
    if not (0 < max_load_share <= 1):
        raise ValueError(f"plan_groups: max_load_share must be in (0, 1], got {max_load_share}")
    for prev, shot in zip(shots, shots[1:], strict=False):
        if shot.index <= prev.index:
            raise ValueError(
                f"plan_groups: shot indices must be strictly increasing, got {prev.index} then {shot.index}"
            )
    for shot in shots:
        if not (math.isfinite(shot.est_gpu_s) and shot.est_gpu_s >= 0):
            raise ValueError(f"plan_groups: shot {shot.index} has est_gpu_s={shot.est_gpu_s}, expected >= 0")


def _meets(work: float, need: float) -> bool:
    return work >= need * (1.0 - _REL_TOL)


def _most_groups_meeting(costs: list[float], need: float) -> list[tuple[int, int]]:
    """Greedy: close a group as soon as its work reaches ``need``; a short tail joins the last group.

    With non-negative costs this gives the largest number of groups whose work all reach ``need``
    (any such partition can be turned into the greedy one without losing a group).
    """
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0.0
    for i, cost in enumerate(costs):
        acc += cost
        if _meets(acc, need):
            bounds.append((start, i + 1))
            start, acc = i + 1, 0.0
    if start < len(costs):
        if bounds:
            bounds[-1] = (bounds[-1][0], len(costs))
        else:
            bounds.append((0, len(costs)))
    return bounds


def _balanced(costs: list[float], k: int) -> list[tuple[int, int]]:
    """Exactly ``k`` consecutive groups minimising the largest group's work (bisection on the cap)."""
    lo, hi = max(costs), math.fsum(costs)
    for _ in range(200):
        if hi - lo <= _REL_TOL * max(hi, 1e-12):
            break
        mid = (lo + hi) / 2
        if len(_fill_up_to(costs, mid)) <= k:
            hi = mid
        else:
            lo = mid
    bounds = _fill_up_to(costs, hi)
    while len(bounds) < k:  # split the heaviest splittable group in two; halves never exceed the cap
        a, b = max(
            (ab for ab in bounds if ab[1] - ab[0] > 1),
            key=lambda ab: (math.fsum(costs[ab[0] : ab[1]]), -ab[0]),
        )
        i = bounds.index((a, b))
        bounds[i : i + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    return bounds


def _fill_up_to(costs: list[float], cap: float) -> list[tuple[int, int]]:
    """Greedy: fill each group while its work stays <= ``cap`` (fewest groups under that cap)."""
    bounds: list[tuple[int, int]] = []
    start, acc = 0, 0.0
    for i, cost in enumerate(costs):
        if i > start and acc + cost > cap * (1.0 + _REL_TOL):
            bounds.append((start, i))
            start, acc = i, 0.0
        acc += cost
    bounds.append((start, len(costs)))
    return bounds
