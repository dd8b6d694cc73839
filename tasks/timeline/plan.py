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

Parts: a shot whose dubbed speaker changes part-way is planned in parts split at the switches
(`split_at`): each part is chunked like a shot of its own (its first chunk takes no motion frames from the
previous part, whose crop shows another face) and its chunks' source frames stay inside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from tasks.config.media import PlanConfig
from tasks.timeline.shots import Shot


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
    part: int = 0  # the part of the shot (split at speaker switches) this chunk belongs to
    part_chunk: int = 0  # index within its part (0: the part starts afresh, no motion frames)
    part_start: int = 0  # first model frame of the part
    part_frames: int = 0  # model frames of the part (0: the whole shot, an unsplit plan)

    @property
    def model_end(self) -> int:
        return self.model_start + self.num_frames

    @property
    def index_in_part(self) -> int:
        """The sampler's chunk index: within the part (the shot's when the plan is not split)."""
        return self.part_chunk if self.part_frames else self.index


_PART_FIELDS = ("part", "part_chunk", "part_start", "part_frames")


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
    switches: tuple[int, ...] = ()  # shot frames where a new part starts (speaker switches)

    @property
    def num_frames(self) -> int:
        return self.end_frame - self.start_frame

    def part_frames(self, chunk: ChunkPlan) -> int:
        """Model frames of the part ``chunk`` belongs to (the whole shot's when the plan is not split)."""
        return chunk.part_frames or self.model_frames

    def conform_indices(self, chunk: ChunkPlan) -> list[int]:
        """For each output source frame of `chunk`, the index into the chunk's generated frames."""
        return [
            model_frame_of(j, self.fps, self.model_fps) - chunk.model_start
            for j in range(chunk.src_start, chunk.src_end)
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; an unsplit plan has no part fields (its dict, and so its shot key, is as before)."""
        d = asdict(self)
        d["fps"] = str(self.fps)
        d["chunks"] = [asdict(c) for c in self.chunks]
        if not self.switches:
            del d["switches"]
            for c in d["chunks"]:
                for k in _PART_FIELDS:
                    del c[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShotPlan:
        d = dict(d)
        d["fps"] = Fraction(d["fps"])
        d["chunks"] = tuple(ChunkPlan(**c) for c in d["chunks"])
        d["switches"] = tuple(int(j) for j in d.get("switches", ()))
        return cls(**d)


def _part_chunks(
    a: int, b: int, first_index: int, part: int, n: int, fps: Fraction, cfg: PlanConfig
) -> list[ChunkPlan]:
    """Chunks of the part covering shot frames [a, b) (the whole shot: a = 0, b = n, part 0)."""
    m0 = model_frame_of(a, fps, cfg.model_fps) if a > 0 else 0
    m = model_length(b, fps, cfg.model_fps) - m0
    out = []
    for i, (s, length, ns, ne) in enumerate(chunk_windows(m, cfg.frame_num, cfg.motion_frames)):
        src_start = max(a, min(b, first_source_frame_mapping_to(m0 + ns, fps, cfg.model_fps)))
        src_end = b if ne == m else max(a, min(b, first_source_frame_mapping_to(m0 + ne, fps, cfg.model_fps)))
        ref = max(a, min(b - 1, source_frame_at(m0 + s, fps, cfg.model_fps)))
        split = (part, i, m0, m) if (a, b) != (0, n) else (0, 0, 0, 0)
        out.append(
            ChunkPlan(first_index + i, m0 + s, length, m0 + ns, m0 + ne, ref, src_start, src_end, *split)
        )
    return out


def plan_shot(shot: Shot, fps: Fraction, cfg: PlanConfig) -> ShotPlan:
    """Chunk plan of one shot (pure)."""
    n = shot.num_frames
    m = model_length(n, fps, cfg.model_fps)
    return ShotPlan(
        shot.index, shot.start_frame, shot.end_frame, fps, cfg.model_fps, m, cfg.frame_num, cfg.motion_frames,
        tuple(_part_chunks(0, n, 0, 0, n, fps, cfg)),
    )  # fmt: skip


def split_at(plan: ShotPlan, switches: list[int] | tuple[int, ...]) -> ShotPlan:
    """The plan re-chunked in parts that start at the shot frames ``switches`` (pure; unchanged without
    switches inside the shot).  Chunks are numbered through the shot; each part's first has part_chunk 0."""
    n = plan.num_frames
    cuts = sorted({int(j) for j in switches if 0 < int(j) < n})
    if not cuts:
        return plan
    cfg = PlanConfig(model_fps=plan.model_fps, frame_num=plan.frame_num, motion_frames=plan.motion_frames)
    chunks: list[ChunkPlan] = []
    for part, (a, b) in enumerate(zip([0, *cuts], [*cuts, n], strict=True)):
        chunks += _part_chunks(a, b, len(chunks), part, n, plan.fps, cfg)
    return dataclasses.replace(plan, chunks=tuple(chunks), switches=tuple(cuts))


def plan_film(shots: list[Shot] | tuple[Shot, ...], fps: Fraction, cfg: PlanConfig) -> list[ShotPlan]:
    return [plan_shot(s, fps, cfg) for s in shots]
