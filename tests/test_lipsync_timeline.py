"""Lip-sync timeline over a 10-minute 23.976 fps film (pure functions, no video): every source frame's
conformed model frame, and the audio feature frame the sampler conditions it on, lie within one source
frame of that source frame's audio time."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from model.network.wav2vec import frame_count
from model.sampling.chunks import chunk_audio_indices, plan_chunks
from tasks.config.media import PlanConfig
from tasks.infinitetalk import FeatureTimeline, check_plan_agreement, shot_feature_range
from tasks.media.audio import sample_at_frame
from tasks.timeline.plan import plan_shot
from tasks.timeline.shots import Shot

FPS = Fraction(24000, 1001)
SR = 16000


def _shots(n_frames: int, seed: int) -> list[Shot]:
    """A random partition into shots of 1..400 frames (short shots included)."""
    rng = np.random.default_rng(seed)
    out, start = [], 0
    while start < n_frames:
        length = int(
            rng.choice([1, 2, 5, 12, 40, 81, 82, 150, 400]) if rng.random() < 0.3 else rng.integers(1, 400)
        )
        end = min(n_frames, start + length)
        out.append(Shot(len(out), start, end))
        start = end
    return out


def test_every_frame_and_its_audio_feature_are_within_one_source_frame():
    n = round(600 * FPS)  # 10 minutes: 14386 frames
    n_samples = sample_at_frame(n, FPS, SR)  # a dub track exactly as long as the picture
    timeline = FeatureTimeline(frame_count(n_samples, 25, SR), n_samples, SR, stride=320, receptive_field=400)
    cfg = PlanConfig(model_fps=25, frame_num=81, motion_frames=9)
    frame_s = 1 / float(FPS)
    worst_video = worst_audio = 0.0
    covered = 0
    for shot in _shots(n, seed=7):
        plan = plan_shot(shot, FPS, cfg)
        check_plan_agreement(plan)  # the renderer's chunks are the sampler's
        offset, stop = shot_feature_range(plan, timeline)
        specs = plan_chunks(plan.model_frames, cfg.frame_num, cfg.motion_frames)
        t0 = float(shot.start_frame / FPS)
        for chunk, spec in zip(plan.chunks, specs, strict=True):
            # the centre of each generated frame's 5-frame audio window, as the sampler indexes the shot's slice
            centres = chunk_audio_indices(spec, stop - offset)[1][:, 2].numpy()
            for t, k in enumerate(plan.conform_indices(chunk)):
                j = shot.start_frame + chunk.src_start + t  # film frame
                audio_t = j * frame_s
                model_frame = chunk.model_start + k
                worst_video = max(worst_video, abs(t0 + model_frame / 25 - audio_t))
                worst_audio = max(worst_audio, abs(timeline.time_s(offset + int(centres[k])) - audio_t))
                covered += 1
    assert covered == n  # every source frame was checked exactly once
    assert worst_video <= 0.5 / 25 + 1e-9  # conform: nearest model frame
    assert worst_audio <= frame_s, (
        f"audio feature {worst_audio * 1000:.1f} ms off (> one frame, {frame_s * 1000:.1f} ms)"
    )


def test_feature_timeline_period_and_offsets():
    # 10 minutes of 16 kHz audio: wav2vec2's 50 Hz conv frames interpolate onto exactly 25 fps
    tl = FeatureTimeline(15000, 600 * SR, SR, 320, 400)
    assert abs(tl.period_s - 0.04) < 1e-12
    assert tl.nearest(-1.0) == 0 and tl.nearest(1e6) == tl.n_frames - 1
    assert tl.nearest(0.0199) == 0 and tl.nearest(0.0201) == 1
    # a short track stretches the grid a little (align_corners) and the offset follows it
    short = FeatureTimeline(frame_count(SR * 2 + 100, 25, SR), SR * 2 + 100, SR, 320, 400)
    assert short.n_frames == 50 and short.period_s != 0.04
    assert abs(short.time_s(short.n_frames - 1) - (SR * 2 + 100 - 400) // 320 * 320 / SR) < 1e-9
    assert FeatureTimeline.from_metadata(tl.to_metadata()) == tl
