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
from typing import Any

import numpy as np
import soundfile as sf

from tasks.decision.record import ShotDecision
from tasks.media.frames import iter_frames
from tasks.media.intermediates import read_marker
from tasks.media.probe import VideoInfo, probe
from tasks.perception.face_analysis import analysis_size, display_frames
from tasks.perception.lip_check import LipCheck, lip_check
from tasks.perception.vad import RATE
from tasks.picture.geometry import ModelGeometry
from tasks.render.qc import QcConfig, write_qc
from tasks.render.qc_overlay import speaker_overlay
from tasks.timeline.plan import ShotPlan
from tasks.timeline.run_report import smpte

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
    lip_min_fit: float = 0.0,
) -> dict[str, Any]:
    """Side-by-side preview (with the shot's dub audio) + contact sheet of source vs rendered shot
    (`title`: a banner on both, e.g. for a preview pass). Both are decoded already scaled down by ffmpeg
    to the largest height QC draws (`qc_geometry`): a 1080p shot's frames would cross the pipes at
    ~25x the bytes, serially after the render on the GPU host."""

    stem = f"shot_{plan.shot_index:04d}"
    dubbed = probe(rendered, frame_count="packets")
    lips = shot_lip_check(dubbed, plan, decision, shot_audio, sample_rate, lip_min_fit)
    if lips is not None:  # on the sheet and the preview: the check's score, and REVIEW when it flags the shot
        mark = "lips ?" if lips.fit is None else f"lips {lips.fit:+.2f}"
        title = " | ".join(filter(None, [title, mark + (" REVIEW" if lips.flagged else "")]))

    def timecode(t: int) -> str:  # shot frame t as the film's timecode, with the shot frame
        return f"{smpte(plan.start_frame + t, info.fps, info.timecode)} #{t}"

    qc = QcConfig(
        height=height, fps=float(info.fps), title=title, header=sheet_header(info, plan, decision, title),
        frame_label=timecode,
    )  # fmt: skip
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
    out: dict[str, Any] = {"preview": str(result.preview), "contact_sheet": str(result.contact_sheet)}
    return out | (lips.to_dict() if lips is not None else {})


def shot_lip_check(
    dubbed: VideoInfo,
    plan: ShotPlan,
    decision: ShotDecision | None,
    shot_audio: np.ndarray,
    sample_rate: int,
    min_fit: float,
) -> LipCheck | None:
    """The output check of a rendered shot (`tasks.perception.lip_check`): its longest dubbed turn's face
    against the dub's sound over that turn; None when off (``min_fit`` 0) or no turn dubs a face."""
    if min_fit <= 0 or decision is None or decision.faces is None:
        return None
    turns = [r for r in decision.regions if r.speaker is not None]
    if not turns:
        return None
    r = max(turns, key=lambda r: r.end_frame - r.start_frame)
    faces = decision.faces
    samples = faces.track(r.speaker).samples(r.start_frame, r.end_frame) or faces.track(r.speaker).samples()
    box = np.median(np.array([b for _, b in samples], np.float64), axis=0)  # display pixels
    w, h = dubbed.display_size
    hw = analysis_size((h, w), 640)
    scale = np.array([hw[1] / w, hw[0] / h] * 2)
    mono = np.asarray(shot_audio, np.float32).reshape(len(shot_audio), -1).mean(axis=1)
    if sample_rate != RATE:
        import librosa  # only where the dub is not at the analysis rate

        mono = librosa.resample(mono, orig_sr=sample_rate, target_sr=RATE)
    f0, f1 = r.start_frame, min(r.end_frame, plan.num_frames)
    fps = float(dubbed.fps)
    clip = mono[round(f0 / fps * RATE) : round(f1 / fps * RATE)]
    frames = display_frames(dubbed, f0, f1, hw)
    return lip_check(frames, f1 - f0, fps, clip, tuple(box * scale), min_fit)


def sheet_header(
    info: VideoInfo, plan: ShotPlan, decision: ShotDecision | None, title: str | None = None
) -> tuple[str, ...]:
    """The QC sheet's header: the film, the shot and its timecode range (the film's own timecode, end
    exclusive), and the decision with its reason (`title` first, e.g. the preview label)."""
    tc = lambda f: smpte(f, info.fps, info.timecode)  # noqa: E731
    span = (
        f"{Path(info.path).name} - shot {plan.shot_index:04d} - {tc(plan.start_frame)} to {tc(plan.end_frame)} "
        f"({plan.num_frames} frames at {float(info.fps):.3f} fps)"
    )
    if decision is None:
        verdict = "decision: dubbed (the backend takes no dub decision)"
    else:
        verdict = f"decision: {'dubbed' if decision.dub else 'not dubbed'}: {decision.reason}"
    return tuple(x for x in (title, span, verdict) if x)


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
