"""Per-shot chunk plan on the model's 25 fps timeline, with sliding reference frames.

Frame-rate policy (decided): dubflow **generates on a 25 fps timeline and conforms back to the
source's timestamps**. InfiniteTalk's audio features, audio windows and motion are all tied to
25 video frames per second, so a shot of `n` source frames at `fps` gets
`M = model_frame_of(n - 1) + 1` model frames, where source frame `j` (time `j / fps`) maps to
model frame `model_frame_of(j) = round(j * 25 / fps)` (halves up). After generation each source
frame takes the model frame it maps to, so the output has exactly the source's frames and
timestamps at 23.976, 24, 25, 29.97 or any other rate. (The official code assumes every input is
25 fps, which drifts by ~4 % on film.) VFR sources are treated on their average rate.

Chunks: the first chunk generates `frame_num` (81) frames; each next one starts
`frame_num - motion_frames` (72) frames later, re-using the previous chunk's last
`motion_frames` (9) frames as motion context, so it contributes 72 new frames; the last chunk is
shortened to the smallest 4n+1 length that covers the shot, and a shot shorter than one chunk
gets a single shorter 4n+1 chunk. Frames beyond `M` are generated but dropped.

Sliding reference: chunk k starts at model frame `s_k`, i.e. time `t = s_k / 25` s after the
shot start; its reference is the source frame shown at that time,
`source_frame_at(s_k) = floor(t * fps)` — computed with exact rationals, so no epsilon is needed.
All frame numbers in a ShotPlan are shot-relative except `start_frame`/`end_frame`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from tasks.config import PlanConfig
from tasks.shots import Shot


def model_frame_of(j: int, fps: Fraction, model_fps: int) -> int:
    """Model frame (25 fps timeline) that source frame j maps to: round(j * model_fps / fps), halves up."""
    num, den = fps.numerator, fps.denominator
    return (2 * j * model_fps * den + num) // (2 * num)


def first_source_frame_mapping_to(k: int, fps: Fraction, model_fps: int) -> int:
    """Smallest j >= 0 with model_frame_of(j) >= k."""
    num, den = fps.numerator, fps.denominator
    # model_frame_of(j) >= k  <=>  2*j*m*den + num >= 2*k*num  <=>  j >= (2k - 1) * num / (2 m den)
    return max(0, -((-(2 * k - 1) * num) // (2 * model_fps * den)))


def source_frame_at(k: int, fps: Fraction, model_fps: int) -> int:
    """Source frame shown at model frame k's time k / model_fps: floor(k * fps / model_fps)."""
    return (k * fps.numerator) // (model_fps * fps.denominator)


def model_length(n_source: int, fps: Fraction, model_fps: int) -> int:
    """Model frames needed so every source frame of a shot has a model frame."""
    return model_frame_of(n_source - 1, fps, model_fps) + 1 if n_source > 0 else 0


def round_up_4n1(x: int) -> int:
    """Smallest 4n+1 >= x (x >= 1)."""
    return 4 * ((max(x, 1) - 1 + 3) // 4) + 1


def chunk_windows(m: int, frame_num: int, motion_frames: int) -> list[tuple[int, int, int, int]]:
    """Chunk windows over m model frames: (start, num_frames, new_start, new_end) each (pure)."""
    if (frame_num - 1) % 4 or (motion_frames - 1) % 4 or not 0 < motion_frames < frame_num:
        raise ValueError(
            f"frame_num {frame_num} and motion_frames {motion_frames} must be 4n+1, motion < frame_num"
        )
    if m <= 0:
        return []
    if m <= frame_num:
        return [(0, round_up_4n1(m), 0, m)]
    out = []
    s = 0
    while True:
        new_start = 0 if not out else s + motion_frames
        if s + frame_num >= m:
            out.append((s, round_up_4n1(m - s), new_start, m))
            return out
        out.append((s, frame_num, new_start, s + frame_num))
        s += frame_num - motion_frames


@dataclass(frozen=True)
class ChunkPlan:
    """One generation chunk of a shot (all frame numbers shot-relative)."""

    index: int
    model_start: int  # first model frame generated (motion frames included)
    num_frames: int  # frames generated, 4n+1
    new_start: int  # first model frame this chunk contributes to the output
    new_end: int  # exclusive
    ref_frame: int  # source frame used as this chunk's reference image
    src_start: int  # source frames [src_start, src_end) whose output comes from this chunk
    src_end: int

    @property
    def model_end(self) -> int:
        return self.model_start + self.num_frames


@dataclass(frozen=True)
class ShotPlan:
    """The chunk plan of one shot (serialisable, shown in the UI)."""

    shot_index: int
    start_frame: int  # film frames [start_frame, end_frame)
    end_frame: int
    fps: Fraction
    model_fps: int
    model_frames: int
    frame_num: int
    motion_frames: int
    chunks: tuple[ChunkPlan, ...]

    @property
    def num_frames(self) -> int:
        return self.end_frame - self.start_frame

    def conform_indices(self, chunk: ChunkPlan) -> list[int]:
        """For each output source frame of `chunk`, the index into the chunk's generated frames."""
        return [
            model_frame_of(j, self.fps, self.model_fps) - chunk.model_start
            for j in range(chunk.src_start, chunk.src_end)
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fps"] = str(self.fps)
        d["chunks"] = [asdict(c) for c in self.chunks]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShotPlan:
        d = dict(d)
        d["fps"] = Fraction(d["fps"])
        d["chunks"] = tuple(ChunkPlan(**c) for c in d["chunks"])
        return cls(**d)


def plan_shot(shot: Shot, fps: Fraction, cfg: PlanConfig) -> ShotPlan:
    """Chunk plan of one shot (pure)."""
    n = shot.num_frames
    m = model_length(n, fps, cfg.model_fps)
    chunks = []
    for i, (s, length, ns, ne) in enumerate(chunk_windows(m, cfg.frame_num, cfg.motion_frames)):
        src_start = min(n, first_source_frame_mapping_to(ns, fps, cfg.model_fps))
        src_end = min(n, first_source_frame_mapping_to(ne, fps, cfg.model_fps))
        ref = min(n - 1, source_frame_at(s, fps, cfg.model_fps))
        chunks.append(ChunkPlan(i, s, length, ns, ne, ref, src_start, src_end))
    return ShotPlan(
        shot.index, shot.start_frame, shot.end_frame, fps, cfg.model_fps, m, cfg.frame_num, cfg.motion_frames,
        tuple(chunks),
    )  # fmt: skip


def plan_film(shots: list[Shot] | tuple[Shot, ...], fps: Fraction, cfg: PlanConfig) -> list[ShotPlan]:
    return [plan_shot(s, fps, cfg) for s in shots]
