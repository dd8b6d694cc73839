"""A rendered shot's QC, apart from its render: `write_shot_qc` (the side-by-side preview with the dub
audio + the contact sheet, decoded at QC's size by ffmpeg: `qc_geometry`) and the dub decision a shot keeps
beside its intermediate for it (`decision_path`, `kept_decision`), so QC can run after the render, off the
GPU's path."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from tasks.decision.record import ShotDecision
from tasks.media.frames import iter_frames
from tasks.media.intermediates import read_marker
from tasks.media.probe import VideoInfo, probe
from tasks.picture.geometry import ModelGeometry
from tasks.render.qc import QcConfig, write_qc
from tasks.render.qc_overlay import speaker_overlay
from tasks.timeline.plan import ShotPlan

log = logging.getLogger(__name__)


def qc_geometry(info: VideoInfo, display_height: int) -> tuple[int | None, ModelGeometry, float]:
    """The coded width QC decodes at (None: the full size), the geometry from those frames to display
    orientation and square pixels, and the display scale, so that QC's frames come out about
    `display_height` tall (pure)."""
    g = ModelGeometry.for_video(info, "480")  # display orientation only (the bucket is not used)
    disp_h, disp_w = g.display_hw
    width = math.ceil(info.width * display_height / disp_h)
    width += width % 2
    if width >= info.width:
        return None, g, 1.0
    height = max(2, round(info.height * width / info.width / 2) * 2)  # as iter_frames scales
    fx, fy = width / info.width, height / info.height
    rotated = info.rotation in (90, 270)
    hw = (max(2, round(disp_h * (fx if rotated else fy))), max(2, round(disp_w * (fy if rotated else fx))))
    return width, dataclasses.replace(g, coded_hw=(height, width), display_hw=hw), hw[0] / disp_h


def write_shot_qc(
    info: VideoInfo,
    plan: ShotPlan,
    rendered: Path,
    qc_dir: Path,
    shot_audio: np.ndarray,
    sample_rate: int,
    height: int,
    title: str | None = None,
    decision: ShotDecision | None = None,
) -> dict[str, str]:
    """Side-by-side preview (with the shot's dub audio) + contact sheet of source vs rendered shot
    (`title`: a banner on both, e.g. for a preview pass). Both are decoded already scaled down by ffmpeg
    to the largest height QC draws (`qc_geometry`): a 1080p shot's frames would cross the pipes at
    ~25x the bytes, serially after the render on the GPU host."""

    stem = f"shot_{plan.shot_index:04d}"
    dubbed = probe(rendered, frame_count="packets")
    qc = QcConfig(height=height, fps=float(info.fps), title=title)
    width, geometry, scale = qc_geometry(info, max(qc.height, qc.thumb_height))
    overlay = speaker_overlay(decision, scale) if decision is not None else None
    qc_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{stem}.", suffix=".tmp.wav", dir=qc_dir)  # scratch, removed below
    os.close(fd)
    wav = Path(name)
    try:
        # 0.2 s of silence after the shot's audio: the preview is cut to the shorter stream (`-shortest`),
        # and a dub slice ending before the picture (a track shorter than the shot) cut the picture
        tail = np.zeros((sample_rate // 5, *shot_audio.shape[1:]), shot_audio.dtype)
        sf.write(str(wav), np.concatenate([shot_audio, tail]), sample_rate, subtype="FLOAT", format="WAV")
        result = write_qc(
            (
                geometry.to_display(f)
                for f in iter_frames(info, plan.start_frame, plan.end_frame, width=width)
            ),
            (geometry.to_display(f) for f in iter_frames(dubbed, 0, plan.num_frames, width=width)),
            qc_dir,
            stem,
            qc,
            num_frames=plan.num_frames,
            audio=wav,
            overlay=overlay,
        )
    finally:
        wav.unlink(missing_ok=True)
    return {"preview": str(result.preview), "contact_sheet": str(result.contact_sheet)}


def decision_path(out: Path) -> Path:
    """Where a rendered shot's dub decision is kept: beside its intermediate (`shot.decision.json`)."""
    return out.with_name(out.stem + ".decision.json")


def kept_decision(out: Path) -> ShotDecision | None:
    """The decision the shot rendered to `out` kept (`decision_path`), None without one (no gating
    backend) or when it cannot be read (logged; QC then draws no face boxes)."""
    path = decision_path(out)
    kept = read_marker(path)
    if kept is None:
        return None
    try:
        return ShotDecision.from_dict(kept)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        log.warning("%s: not a shot decision (%s): QC without face boxes", path, exc)
        return None
