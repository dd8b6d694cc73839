"""The film's bytes, frames and timeline settings: probe, shot detection, the dub track, chunk plans, model
frames, colour matching, the encode and the edit-suite export (`configs/default.yaml` holds their values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ProbeConfig:
    frame_count: Literal["packets", "decode"]


@dataclass(frozen=True)
class ShotsConfig:
    detector: Literal["content", "adaptive", "threshold", "histogram", "hash"]
    threshold: float | None
    min_scene_len: int
    detect_width: int
    min_shot_frames: int


@dataclass(frozen=True)
class AudioConfig:
    sample_rate: int
    channels: int
    length_policy: Literal["error", "pad", "trim", "fit"]
    resampler: Literal["soxr_hq", "ffmpeg"]  # the dialogue track: librosa.load semantics, or ffmpeg's


@dataclass(frozen=True)
class PlanConfig:
    model_fps: int
    frame_num: int
    motion_frames: int


@dataclass(frozen=True)
class FramesConfig:
    bucket: Literal["480", "720"]


@dataclass(frozen=True)
class ColorConfig:
    strength: float
    reference: Literal["chunk", "shot_first"]


@dataclass(frozen=True)
class EncodeConfig:
    codec: str
    crf: int
    preset: str
    pix_fmt: str
    audio_codec: str
    audio_bitrate: str
    audio_language: str
    keep_source_audio: bool
    intermediate: Literal["ffv1"]
    profile: Literal["web", "mezzanine", "lossless"]  # tasks/media/profiles.py
    mezzanine: Literal["prores_hq", "dnxhr_hqx"]
    per_shot: bool  # each shot its own closed-GOP segment, joined by stream copy (tasks/media/segments.py)


@dataclass(frozen=True)
class TimelineConfig:
    """The edit-suite timeline next to each output (`tasks.timeline.export`): `<out>.otio` always, and these."""

    edl: bool  # <out>.edl: a CMX 3600 EDL of the dubbed shots (an EDL holds one video track)
    fcp_xml: bool  # <out>.xml: Final Cut Pro 7 XML with the source, dubbed and dub-audio tracks
