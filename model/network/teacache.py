"""TeaCache for the InfiniteTalk DiT: skip the transformer blocks of a call when the timestep
modulation barely moved since that branch's previous call, and reuse the branch's stored residual.

One `TeaCache` object per generation run, passed to every DiT call together with the branch name
("cond", "drop_text", "uncond", ...). State is kept per branch, so the decisions do not depend on how
many calls a sampling step makes. `reset()` starts a new generation.

Decision rule (official `teacache_init` / `WanModel.forward`, use_ret_steps=True by default), for the
k-th call of a branch, k counted modulo `sample_steps`:
  * k < ret_steps (5 with use_ret_steps, else 1) or k >= cutoff (sample_steps, else sample_steps - 1):
    compute, accumulator := 0;
  * else accumulator += poly(mean|m - m_prev| / mean|m_prev|), m = e0 (use_ret_steps) or e;
    reuse if accumulator < threshold, else compute and accumulator := 0.
m_prev is updated on every call. Compute stores residual = x_after_blocks - x_before_blocks; reuse adds
the stored residual. The official code counts calls globally and labels them by `count % 3`; with three
calls per step (cond / drop_text / uncond) that is the same as counting per branch, which is what this
does for any number of calls per step.

Host syncs. The indicator depends only on the call's timestep (time embedding + projection of a
sinusoidal embedding of t), never on the latents, so every distance of a generation is known once
the timestep schedule is. `prepare_schedule` (or `prepare`) computes them on the device before the
step loop with one host read; the k-th call of a branch after it then decides from host values
only. Without a prepared schedule, or for a call that does not match it (more calls than prepared,
another batch shape, dtype or device), the distance is computed per call and read back (one sync);
`TeaCacheDecision.source` says which happened.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal

import torch

logger = logging.getLogger(__name__)

# t (B,) -> (e (B, dim), e0 (B, 6, dim)) float32, e.g. `InfiniteTalkDiT.timestep_modulation`
ModulationFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
DistanceSource = Literal["rule", "prepared", "synced"]

# Polynomial rescaling coefficients (highest power first) of the official `teacache_init`,
# keyed by (model preset, use_ret_steps).
TEACACHE_COEFFICIENTS: dict[tuple[str, bool], tuple[float, ...]] = {
    ("infinitetalk-480", True): (
        2.57151496e05,
        -3.54229917e04,
        1.40286849e03,
        -1.35890334e01,
        1.32517977e-01,
    ),
    ("infinitetalk-720", True): (
        8.10705460e03,
        2.13393892e03,
        -3.72934672e02,
        1.66203073e01,
        -4.17769401e-02,
    ),
    ("infinitetalk-480", False): (
        -3.02331670e02,
        2.23948934e02,
        -5.25463970e01,
        5.87348440e00,
        -2.01973289e-01,
    ),
    ("infinitetalk-720", False): (-114.36346466, 65.26524496, -18.82220707, 4.91518089, -0.23412683),
}


@dataclass(frozen=True)
class TeaCacheConfig:
    """TeaCache settings: reuse threshold, coefficient preset, and whether e0 (ret steps) is compared."""

    threshold: float = 0.2
    preset: str = "infinitetalk-480"
    use_ret_steps: bool = True

    def __post_init__(self) -> None:
        if (self.preset, self.use_ret_steps) not in TEACACHE_COEFFICIENTS:
            known = sorted({p for p, _ in TEACACHE_COEFFICIENTS})
            raise ValueError(f"unknown TeaCache preset {self.preset!r}; known: {known}")

    @property
    def coefficients(self) -> tuple[float, ...]:
        return TEACACHE_COEFFICIENTS[(self.preset, self.use_ret_steps)]


def relative_l1(modulation: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """mean|m - m_prev| / mean|m_prev| as a 0-dim tensor on the modulation's device (no sync)."""
    return (modulation - previous).abs().mean() / previous.abs().mean()


@dataclass
class _BranchState:
    calls: int = 0  # calls of this branch since reset, modulo sample_steps
    accumulated: float = 0.0
    previous_modulation: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    schedule_index: int | None = 0  # position of the next call in the prepared schedule; None = off it


@dataclass(frozen=True)
class _Schedule:
    """Distances of a prepared schedule: distances[j] = relative_l1(m_j, m_{j-1}) (j >= 1)."""

    distances: tuple[float, ...]
    shape: torch.Size  # of every call's modulation (B, 6, dim) or (B, dim)
    dtype: torch.dtype
    device: torch.device


@dataclass
class TeaCacheDecision:
    """One DiT call as TeaCache saw it (for logs and tests).

    source: "rule" (forced compute, no distance needed), "prepared" (distance from the prepared
    schedule, no device access) or "synced" (distance computed for this call and read back).
    """

    branch: str
    computed: bool
    accumulated: float
    source: DistanceSource = "rule"


@dataclass
class TeaCache:
    """Per-run TeaCache state for `sample_steps` denoising steps."""

    config: TeaCacheConfig
    sample_steps: int
    decisions: list[TeaCacheDecision] = field(default_factory=list)
    _branches: dict[str, _BranchState] = field(default_factory=dict)
    _schedule: _Schedule | None = None

    def __post_init__(self) -> None:
        if self.sample_steps < 1:
            raise ValueError(f"sample_steps must be >= 1, got {self.sample_steps}")

    @property
    def ret_steps(self) -> int:
        return 5 if self.config.use_ret_steps else 1

    @property
    def cutoff_steps(self) -> int:
        return self.sample_steps if self.config.use_ret_steps else self.sample_steps - 1

    def reset(self) -> None:
        """Forget everything, the prepared schedule included (start of a new generation)."""
        self._branches.clear()
        self.decisions.clear()
        self._schedule = None

    def prepare(self, modulations: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Precompute the distances of the calls every branch makes from now on, with one host read.

        modulations[j] = (e (B, dim), e0 (B, 6, dim)) exactly as the DiT computes them for the j-th
        call of each branch from now on (same batch B as the calls). Pass each call's own tensors, not
        rows of one larger batch: a float32 GEMM's rows depend on the batch size, and the distances
        must be bit-identical to the per-call ones for the decisions to be. Call after `reset()`;
        branch positions restart at 0 (a branch's first call after this uses the per-call path if
        the rule needs its distance, since its previous modulation predates the schedule).
        """
        self._schedule = None
        picked = [e0 if self.config.use_ret_steps else e for e, e0 in modulations]
        if not picked:
            return
        first = picked[0]
        for j, m in enumerate(picked):
            if m.shape != first.shape or m.dtype != first.dtype or m.device != first.device:
                raise ValueError(
                    f"TeaCache.prepare: modulation {j} is {tuple(m.shape)} {m.dtype} on {m.device}, "
                    f"modulation 0 is {tuple(first.shape)} {first.dtype} on {first.device}"
                )
        distances: list[float] = []
        if len(picked) > 1:
            # one small device op per pair, on the same shapes as the per-call path; one host read
            distances = torch.stack([relative_l1(m, p) for p, m in pairwise(picked)]).tolist()
        self._schedule = _Schedule((math.nan, *distances), first.shape, first.dtype, first.device)
        for state in self._branches.values():
            state.schedule_index = 0

    def prepare_schedule(self, modulation: ModulationFn, timesteps: torch.Tensor, batch: int = 1) -> None:
        """`prepare` for a loop that calls every branch once per timestep of `timesteps` (S,), in order.

        modulation(t (batch,)) -> (e, e0) must be the DiT's own path (`timestep_modulation`); it is
        called once per timestep with t expanded to `batch` rows, as the DiT's forward does.
        """
        with torch.no_grad():
            self.prepare([modulation(timesteps[i : i + 1].expand(batch)) for i in range(timesteps.shape[0])])

    def _schedule_position(self, state: _BranchState, modulation: torch.Tensor) -> int | None:
        """This call's position in the prepared schedule (advancing the branch), None if it does not match."""
        index, schedule = state.schedule_index, self._schedule
        if (
            schedule is None
            or index is None
            or index >= len(schedule.distances)
            or modulation.shape != schedule.shape
            or modulation.dtype != schedule.dtype
            or modulation.device != schedule.device
        ):
            state.schedule_index = None  # off the schedule until the next prepare
            return None
        state.schedule_index = index + 1
        return index

    def _rescale(self, x: float) -> float:
        y = 0.0
        for c in self.config.coefficients:  # Horner, as numpy.poly1d
            y = y * x + c
        return y

    def should_compute(self, branch: str, e: torch.Tensor, e0: torch.Tensor) -> bool:
        """Decide whether this call of `branch` runs the blocks; updates the branch state.

        e (B, dim) and e0 (B, 6, dim) are the float32 time embedding and projection of the call.
        With a prepared schedule that this call matches, no device value is read; otherwise a
        distance the rule needs is computed and read back (one host sync).
        """
        state = self._branches.setdefault(branch, _BranchState())
        modulation = e0 if self.config.use_ret_steps else e
        step = state.calls
        position = self._schedule_position(state, modulation)
        source: DistanceSource = "rule"
        if step < self.ret_steps or step >= self.cutoff_steps or state.previous_modulation is None:
            compute = True
            state.accumulated = 0.0
        else:
            if position is not None and position >= 1:  # previous call was position - 1 of the schedule
                distance = self._schedule.distances[position]
                source = "prepared"
            else:
                distance = relative_l1(modulation, state.previous_modulation).item()
                source = "synced"
                if self._schedule is not None:
                    logger.debug("TeaCache: %s call off the prepared schedule, distance synced", branch)
            state.accumulated += self._rescale(distance)
            compute = state.accumulated >= self.config.threshold
            if compute:
                state.accumulated = 0.0
        if not compute and (state.residual is None or state.residual.shape[0] != modulation.shape[0]):
            compute = True  # nothing reusable for this batch shape
            state.accumulated = 0.0
        state.previous_modulation = modulation.detach().clone()
        state.calls = (step + 1) % self.sample_steps
        self.decisions.append(TeaCacheDecision(branch, compute, state.accumulated, source))
        return compute

    def store_residual(self, branch: str, residual: torch.Tensor) -> None:
        self._branches[branch].residual = residual

    def residual(self, branch: str) -> torch.Tensor:
        state = self._branches.get(branch)
        if state is None or state.residual is None:
            raise RuntimeError(f"TeaCache: no stored residual for branch {branch!r}")
        return state.residual
