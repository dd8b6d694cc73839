"""Early checks: everything that would otherwise fail after a film's GPU time has been spent.

Run before any shot is rendered (and, where only a header is needed, before Prefect starts):

* config values that cannot work at all (`check_config`; a dub run's backend and its options too:
  `check_run_config`): named as config errors, not film errors;
* the delivery pixel format against the coded frame size (`check_frame_size`): 4:2:0 needs even
  widths and heights, 4:2:2 an even width. dubflow does NOT pad or crop (that would change the
  delivered picture): it stops with the fix, ``--set encode.pix_fmt=yuv444p`` or an even-sized source;
* the free disk space a run needs (`check_free_space`): the shots' lossless intermediates, estimated
  from their frame counts and sizes (`intermediate_bytes`), plus the largest shot's chunk segments.

Non-finite audio and audio/video lengths are checked where the tracks are decoded (`tasks.media.audio`).
Pure checks raising `ConfigError` / `MediaError` (one line naming the key or file); no Prefect.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from tasks.backends import BACKENDS
from tasks.config.pipeline import PipelineConfig
from tasks.errors import ConfigError, MediaError
from tasks.picture.geometry import BUCKET_TABLES
from tasks.render.backend import check_backend_options

# chroma subsampling of common delivery formats: (horizontal, vertical) divisor the size must meet
_SUBSAMPLING = (
    (re.compile(r"^(yuvj?420|yuva420|nv12|nv21|p010|p016|p210)"), (2, 2)),
    (re.compile(r"^(yuvj?422|yuva422|nv16|yuyv422|uyvy422|p216)"), (2, 1)),
    (re.compile(r"^yuvj?411"), (4, 1)),
    (re.compile(r"^yuv410"), (4, 4)),
)


def check_config(cfg: PipelineConfig) -> None:
    """Config values that cannot work with any film (ConfigError naming the key)."""
    p = cfg.plan
    for key, value in (("plan.frame_num", p.frame_num), ("plan.motion_frames", p.motion_frames)):
        if value < 1 or (value - 1) % 4:
            near = max(1, 4 * ((value - 1) // 4) + 1)
            raise ConfigError(key, f"{value} is not of the form 4n+1 (e.g. {near} or {near + 4})")
    if p.motion_frames >= p.frame_num:
        raise ConfigError(
            "plan.motion_frames", f"{p.motion_frames} must be smaller than plan.frame_num ({p.frame_num})"
        )
    if p.model_fps <= 0:
        raise ConfigError("plan.model_fps", f"{p.model_fps} must be positive")
    if cfg.frames.bucket not in BUCKET_TABLES:
        raise ConfigError("frames.bucket", f"{cfg.frames.bucket!r} is not one of {', '.join(BUCKET_TABLES)}")
    if not 0 < cfg.checks.ffv1_ratio <= 2:
        raise ConfigError("checks.ffv1_ratio", f"{cfg.checks.ffv1_ratio} must be in (0, 2]")


def check_run_config(cfg: PipelineConfig) -> None:
    """Everything about a dub run's config that can be checked without the film, before any work:
    `check_config`, the backend's name and its own options (`check_backend_options`, nothing loaded),
    so that no value fails first on a GPU worker, after the film's preparation, with advice to re-run."""
    check_config(cfg)
    if cfg.backend.name not in BACKENDS:
        raise ConfigError(
            "backend.name", f"unknown backend {cfg.backend.name!r} (known: {', '.join(BACKENDS)})"
        )
    check_backend_options(cfg)


def check_frame_size(path: str | Path, width: int, height: int, pix_fmt: str) -> None:
    """The coded size must be encodable in the delivery `pix_fmt` (MediaError naming the film if not)."""
    for pattern, (dx, dy) in _SUBSAMPLING:
        if pattern.match(pix_fmt):
            if width % dx or height % dy:
                need = {(2, 2): "even width and height", (2, 1): "an even width"}.get(
                    (dx, dy), f"a width divisible by {dx} and a height by {dy}"
                )
                raise MediaError(
                    path,
                    f"{width}x{height} cannot be delivered as encode.pix_fmt={pix_fmt} (it needs {need}); "
                    "use --set encode.pix_fmt=yuv444p, or crop/pad the source to an even size first",
                )
            return


def intermediate_bytes(frames: int, width: int, height: int, ratio: float) -> int:
    """Estimated size of `frames` lossless FFV1 frames: raw RGB bytes x `ratio` (checks.ffv1_ratio)."""
    return int(frames * width * height * 3 * ratio)


def check_free_space(folder: str | Path, need: int, what: str) -> None:
    """At least `need` bytes must be free where `folder` is (or would be created); MediaError if not."""
    free = free_bytes(folder)
    if free < need:
        raise MediaError(
            folder,
            f"{free / 1e9:.2f} GB free, {what} need about {need / 1e9:.2f} GB "
            "(free some space, or point workspace.root / DUBFLOW_WORKSPACE at a larger disk)",
        )


def workspace_need(shot_frames: list[int], width: int, height: int, ratio: float) -> int:
    """Bytes a run still has to write: every listed (not yet done) shot, plus the largest one's chunks."""
    if not shot_frames:
        return 0
    total = sum(intermediate_bytes(n, width, height, ratio) for n in shot_frames)
    return total + intermediate_bytes(max(shot_frames), width, height, ratio)


def free_bytes(folder: str | os.PathLike[str]) -> int:
    """Free bytes on the file system holding `folder` (its nearest existing parent)."""
    probe = Path(folder).resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free
