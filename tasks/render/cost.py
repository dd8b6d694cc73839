"""The price of rendering through a backend, in GPU seconds: one full chunk's price (`ChunkPrice`, from
the backend's `price` hook: `tasks.render.backend.backend_price`) and a shot's chunks scaled by their
latent frames. Pure, no I/O; the figures come from the config's `estimate:` section (measured in
benchmarks), so `dubflow estimate` and the film run's group sizing use one rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.timeline.plan import ShotPlan


def latent_frames(frames: int) -> int:
    """Latent frames of a 4n+1-frame chunk."""
    return 1 + (frames - 1) // 4


def shot_gpu_s(plan: ShotPlan, per_full_chunk_s: float) -> float:
    """GPU seconds of a shot's chunks, each scaled by its latent frames over a full chunk's."""
    full = latent_frames(plan.frame_num)
    return sum(per_full_chunk_s * latent_frames(c.num_frames) / full for c in plan.chunks)


@dataclass(frozen=True)
class ChunkPrice:
    """GPU seconds of one full chunk under a config's backend settings, and the figures behind it.

    `missing` names the `estimate:` figures that are null for this mode/precision; `fallbacks` names the
    ones replaced by a `cost.fallback_*` stand-in (only when asked for: group sizing), the others count 0.
    """

    mode: str
    precision: str  # key of estimate.dit_forward_s.<mode>: dtype or quant, "fp8" for fp8 GEMMs, +fp8attn
    steps: int  # denoising steps run per chunk (after denoise_strength)
    branches: int  # guidance branches = DiT forwards per step
    dit_forward_s: float | None
    vae_chunk_s: float | None
    load_s: float | None  # one process's start-up: imports + loading every component
    missing: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()

    @property
    def chunk_s(self) -> float:
        """steps x branches x dit_forward_s + vae_chunk_s (unknown figures count 0)."""
        return self.steps * self.branches * (self.dit_forward_s or 0.0) + (self.vae_chunk_s or 0.0)

    def describe(self) -> str:
        """One line for logs: the formula with its figures and where unmeasured ones came from."""
        line = (
            f"{self.mode} ({self.precision}): {self.steps} steps x {self.branches} branches x "
            f"{seconds_text(self.dit_forward_s)} + VAE {seconds_text(self.vae_chunk_s)} = {self.chunk_s:.1f} s per full chunk, "
            f"model load {seconds_text(self.load_s)}"
        )
        if self.fallbacks:
            line += f"; not measured, stand-ins used: {', '.join(self.fallbacks)}"
        elif self.missing:
            line += f"; not measured (counted 0): {', '.join(self.missing)}"
        return line


def seconds_text(x: float | None) -> str:
    """A figure for reports: 'unknown' when not measured."""
    return "unknown" if x is None else f"{x:g} s"
