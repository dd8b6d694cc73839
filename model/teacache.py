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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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


@dataclass
class _BranchState:
    calls: int = 0  # calls of this branch since reset, modulo sample_steps
    accumulated: float = 0.0
    previous_modulation: torch.Tensor | None = None
    residual: torch.Tensor | None = None


@dataclass
class TeaCacheDecision:
    """One DiT call as TeaCache saw it (for logs and tests)."""

    branch: str
    computed: bool
    accumulated: float


@dataclass
class TeaCache:
    """Per-run TeaCache state for `sample_steps` denoising steps."""

    config: TeaCacheConfig
    sample_steps: int
    decisions: list[TeaCacheDecision] = field(default_factory=list)
    _branches: dict[str, _BranchState] = field(default_factory=dict)

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
        """Forget everything (start of a new generation)."""
        self._branches.clear()
        self.decisions.clear()

    def _rescale(self, x: float) -> float:
        y = 0.0
        for c in self.config.coefficients:  # Horner, as numpy.poly1d
            y = y * x + c
        return y

    def should_compute(self, branch: str, e: torch.Tensor, e0: torch.Tensor) -> bool:
        """Decide whether this call of `branch` runs the blocks; updates the branch state.

        e (B, dim) and e0 (B, 6, dim) are the float32 time embedding and projection of the call.
        Reading the distance back is one host sync per call (only when TeaCache is enabled).
        """
        state = self._branches.setdefault(branch, _BranchState())
        modulation = e0 if self.config.use_ret_steps else e
        step = state.calls
        if step < self.ret_steps or step >= self.cutoff_steps or state.previous_modulation is None:
            compute = True
            state.accumulated = 0.0
        else:
            prev = state.previous_modulation
            distance = ((modulation - prev).abs().mean() / prev.abs().mean()).item()
            state.accumulated += self._rescale(distance)
            compute = state.accumulated >= self.config.threshold
            if compute:
                state.accumulated = 0.0
        if not compute and (state.residual is None or state.residual.shape[0] != modulation.shape[0]):
            compute = True  # nothing reusable for this batch shape
            state.accumulated = 0.0
        state.previous_modulation = modulation.detach().clone()
        state.calls = (step + 1) % self.sample_steps
        self.decisions.append(TeaCacheDecision(branch, compute, state.accumulated))
        return compute

    def store_residual(self, branch: str, residual: torch.Tensor) -> None:
        self._branches[branch].residual = residual

    def residual(self, branch: str) -> torch.Tensor:
        state = self._branches.get(branch)
        if state is None or state.residual is None:
            raise RuntimeError(f"TeaCache: no stored residual for branch {branch!r}")
        return state.residual
