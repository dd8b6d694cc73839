"""The speaker verdict's stages after the analysis, as one named sequence (`STAGES`, `speaker_verdict`).

The shot's analysis (`tasks.perception.face_analysis.analyse_frames`) measures; this decides, in this order:

1. ``learned``: Light-ASD's per-frame scores and sync leads -> its own segments (`find_asd_speakers`);
2. ``fuse``: joined frame by frame with the agreement route's segments (`fuse_asd`, with its doubt rules:
   out of sync, unconfirmed switches, a contradicted shot);
3. ``content``: judged again on what each face's mouth says (`tasks.perception.content_fusion.judge_content`);
4. ``voice``: one face, two voices -> uncertain (`tasks.perception.voices.doubt_two_voices`);
5. ``likeliest``: an uncertain segment names the face whose lips follow the speech best (`name_likeliest`).

A stage whose evidence is absent (no learned scores, no mouth shapes, no voices) passes the segments on.
The pipeline and `benchmarks/speaker_replay.py` both call `speaker_verdict`, so a replayed verdict is the
product's.  Pure numpy apart from the voice encoder behind ``voices``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tasks.config.speaker import SpeakerConfig
from tasks.perception.asd_speaker import (
    AsdSettings,
    SyncEvidence,
    find_asd_speakers,
    fuse_asd,
    name_likeliest,
)
from tasks.perception.content_fusion import ContentEvidence, ContentSettings, judge_content
from tasks.perception.speaker import SpeakerSegment, SpeakerSettings
from tasks.perception.voices import VoicesOf, doubt_two_voices

STAGES = ("learned", "fuse", "content", "voice", "likeliest")


def speaker_settings(cfg: SpeakerConfig) -> SpeakerSettings:
    return SpeakerSettings(
        activity_on=cfg.activity_on, still_face=cfg.still_face, smooth_s=cfg.smooth_s, step_s=cfg.step_s,
        switch_penalty=cfg.switch_penalty, contrast_min=cfg.contrast_min,
    )  # fmt: skip


def asd_settings(cfg: SpeakerConfig) -> AsdSettings:
    return AsdSettings(
        cfg.asd_on, cfg.asd_band, cfg.asd_margin, cfg.asd_scale, cfg.asd_switch_penalty, cfg.asd_min_s,
        cfg.asd_sync_min, cfg.asd_sync_sure,
    )  # fmt: skip


def content_settings(cfg: SpeakerConfig) -> ContentSettings:
    return ContentSettings(
        cfg.content_on, cfg.content_margin, cfg.content_lone, cfg.content_min_s, cfg.content_lone_off, cfg.content_overrule,
        cfg.content_voice_split, cfg.content_turn_min_s, cfg.content_turn_guard_s, cfg.content_lone_none, cfg.content_per_turn,
    )  # fmt: skip


@dataclass(frozen=True)
class VerdictInputs:
    """What the stages read of one analysed shot."""

    n_frames: int
    fps: float
    agreed: list[SpeakerSegment]  # the agreement (rhythm) route's segments
    change: np.ndarray  # (n_tracks, T) the still-picture test's rows
    speech_prob: np.ndarray  # (T,)
    scores: np.ndarray | None = None  # (n_tracks, T) Light-ASD scores, NaN where unscored; None: not run
    lead: np.ndarray | None = None  # (n_tracks, T) its sync leads
    content: ContentEvidence | None = None  # mouth shapes against the audio's content; None: not run
    voices: VoicesOf | None = None  # GE2E embeddings of spans of the source's sound; None: no voice rule


def speaker_verdict(inp: VerdictInputs, cfg: SpeakerConfig, skip: Iterable[str] = ()) -> list[SpeakerSegment]:
    """The shot's speaker segments: `STAGES` in order on ``inp``, those named in ``skip`` left out."""
    skip = set(skip)
    unknown = skip - set(STAGES)
    if unknown:
        raise ValueError(f"unknown speaker stages {sorted(unknown)}: the stages are {', '.join(STAGES)}")
    segments = list(inp.agreed)
    asd_set = asd_settings(cfg)
    if inp.scores is not None and inp.lead is not None and "fuse" not in skip:
        learned = (
            find_asd_speakers(
                inp.scores, inp.lead, inp.change, inp.speech_prob, inp.fps, speaker_settings(cfg), asd_set
            )
            if "learned" not in skip
            else []
        )
        segments = fuse_asd(segments, learned, inp.n_frames, SyncEvidence(inp.lead, asd_set, inp.fps))
    if inp.content is not None and cfg.content != "off" and "content" not in skip:
        segments = judge_content(segments, inp.content, content_settings(cfg), inp.voices)
    if (
        inp.voices is not None
        and cfg.voice_min_cos > 0
        and "voice" not in skip
        and any(s.status == "speaker" for s in segments)
    ):
        segments = doubt_two_voices(
            segments, inp.voices, cfg.voice_min_cos, round(cfg.voice_min_s * inp.fps), inp.fps
        )
    if inp.lead is not None and "likeliest" not in skip:
        segments = name_likeliest(segments, inp.lead)
    return segments


__all__ = [
    "STAGES",
    "VerdictInputs",
    "asd_settings",
    "content_settings",
    "speaker_settings",
    "speaker_verdict",
]
