"""The shot's timelines: where the film's audio feature frames sit in time, which of them a shot is
conditioned on, and the check that the renderer's chunk plan is the sampler's.

Feature frame i of the film sits at time `i * period` (`FeatureTimeline`; the period is 1/25 s up to the
official align-corners stretch); a shot starting at source frame s uses the feature frames from
`FeatureTimeline.nearest(s / fps)` on, so model frame k is conditioned on feature frame `offset + k`
(tests/test_lipsync_timeline.py bounds the error by one source frame). Pure arithmetic on plans and
metadata: computing or caching the features is `backend` / `cache` work, not this file's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from model.sampling.chunks import plan_chunks
from tasks.timeline.plan import ShotPlan

MODEL_FPS = 25
WAV2VEC_RATE = 16000


@dataclass(frozen=True)
class FeatureTimeline:
    """Where the film's audio feature frames sit in time.

    wav2vec2 conv frames (every `stride` samples) are linearly interpolated (align_corners) to the
    `n_frames` video frames at 25 fps the audio covers, so feature i is read at conv position
    `i * (n_conv - 1) / (n_frames - 1)`, i.e. at time `i * period_s` (period 1/25 s up to that stretch).
    """

    n_frames: int
    n_samples: int
    sample_rate: int = WAV2VEC_RATE
    stride: int = 320
    receptive_field: int = 400

    @property
    def period_s(self) -> float:
        n_conv = (self.n_samples - self.receptive_field) // self.stride + 1
        if self.n_frames < 2:
            return 1.0 / MODEL_FPS
        return (n_conv - 1) / (self.n_frames - 1) * self.stride / self.sample_rate

    def time_s(self, i: int) -> float:
        """Audio time of feature frame i."""
        return i * self.period_s

    def nearest(self, t: float) -> int:
        """Feature frame closest to time t (clamped to the film)."""
        return min(max(round(t / self.period_s), 0), max(self.n_frames - 1, 0))

    def to_metadata(self) -> dict[str, str]:
        return {k: str(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str]) -> FeatureTimeline:
        return cls(**{f.name: int(meta[f.name]) for f in dataclasses.fields(cls)})


def shot_feature_offset(start_frame: int, fps: Fraction, timeline: FeatureTimeline) -> int:
    """First feature frame of a shot starting at film frame `start_frame`: the one nearest its start time."""
    return timeline.nearest(float(start_frame / fps))


def shot_feature_range(plan: ShotPlan, timeline: FeatureTimeline) -> tuple[int, int]:
    """Film feature frames [offset, stop) a shot is conditioned on: model frame k uses `offset + k`
    (the sampler clamps windows past `stop`, the film's end)."""
    offset = shot_feature_offset(plan.start_frame, plan.fps, timeline)
    return offset, min(timeline.n_frames, offset + plan.chunks[-1].model_end)


def check_plan_agreement(plan: ShotPlan) -> None:
    """The renderer's chunk plan (`tasks.timeline.plan`) must be the sampler's (`model.sampling.chunks.plan_chunks`), part by
    part when the plan is split at speaker switches (each part is one sampler run)."""

    for part in sorted({c.part for c in plan.chunks}):
        chunks = [c for c in plan.chunks if c.part == part]
        m0, m = chunks[0].part_start, plan.part_frames(chunks[0])
        ours = [(c.model_start - m0, c.num_frames, c.new_start - m0, c.new_end - m0) for c in chunks]
        theirs = [
            (s.start, s.length, s.start + s.keep_start, s.start + s.keep_end)
            for s in plan_chunks(m, plan.frame_num, plan.motion_frames)
        ]
        if ours != theirs:
            raise RuntimeError(
                f"chunk plans disagree for shot {plan.shot_index} ({m} model frames): "
                f"tasks.timeline.plan {ours} vs model.sampling.sampler {theirs}"
            )
