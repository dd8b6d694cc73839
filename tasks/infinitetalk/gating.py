"""The gate of one shot: speech in its dub slice, then (only when the outcome can depend on it) a face
track over sampled display-oriented frames, then the dub policy (`tasks.gate.decide_dub`).

Pure decisions over audio samples and frames handed in by the caller (`frames_fn`); decoding the shot is
the backend's, and nothing here touches a model, so `dubflow estimate` gates shots with it too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tasks.backend import ShotDecision
from tasks.config import GateConfig
from tasks.errors import ConfigError
from tasks.gate import decide_dub
from tasks.region import RegionConfig, RegionPlan
from tasks.speech import detect_speech


def sample_indices(n_frames: int, cfg: RegionConfig) -> list[int]:
    """Shot-relative frames the face detector looks at (the stride rule of `tasks.region.detect_samples`)."""
    if n_frames <= 0:
        return []
    stride = max(cfg.sample_every, math.ceil(n_frames / cfg.max_samples))
    return list(range(0, n_frames, stride))


def plan_region_sampled(
    frames: Mapping[int, np.ndarray], n_frames: int, cfg: RegionConfig, detector: Any | None = None
) -> RegionPlan:
    """`tasks.region.plan_region` from the sampled frames only ({shot frame: display-oriented frame})."""
    from tasks.region import LbpFaceDetector, detect_samples, link_tracks, main_track, plan_from_track  # noqa: PLC0415

    order = sorted(frames)
    every = dataclasses.replace(cfg, sample_every=1, max_samples=max(1, len(order)))
    samples, hw, _ = detect_samples(
        [frames[t] for t in order], detector or LbpFaceDetector(), every, len(order)
    )
    samples = [(order[i], boxes) for i, boxes in samples]  # back to shot frame numbers
    return plan_from_track(main_track(link_tracks(samples)), hw, n_frames, len(samples), cfg)


def decide_shot(
    shot_index: int,
    audio: np.ndarray,
    sample_rate: int,
    n_frames: int,
    frames_fn: Callable[[list[int]], Mapping[int, np.ndarray]],
    gate: GateConfig,
    region_cfg: RegionConfig,
) -> ShotDecision:
    """Speech, then (only when the outcome can depend on it) a face track, then the policy.

    `audio` (S, C) or (S,) float32; `frames_fn(indices)` returns display-oriented frames of the shot.
    """
    mono = audio.mean(axis=1) if audio.ndim == 2 else audio
    speech = detect_speech(np.ascontiguousarray(mono, dtype=np.float32), sample_rate)
    overrides = {str(k): v for k, v in gate.overrides.items()}
    action = str(overrides.get(str(shot_index), "")).strip().lower()
    needs_frames = action == "dub" or (
        action != "skip" and (gate.policy == "all" or (gate.policy == "auto" and speech.has_speech))
    )
    if needs_frames:
        region = plan_region_sampled(frames_fn(sample_indices(n_frames, region_cfg)), n_frames, region_cfg)
    else:  # the decision cannot depend on the picture: no decoding
        region = RegionPlan(region_cfg.mode, (0, 0, 1, 1), (16, 16), False, 0, "not planned")
    try:
        d = decide_dub(shot_index, speech, region, gate.policy, overrides, gate.require_face)
    except ValueError as ex:
        raise ConfigError("gate", str(ex)) from ex
    details = {"speech": speech.to_dict(), "region": region.to_dict() if needs_frames else None}
    return ShotDecision(d.dub, d.reason, details)
