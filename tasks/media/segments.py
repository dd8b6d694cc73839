"""Per-shot segment encode: each shot encoded once, closed-GOP, and kept by what it was made from.

A shot's segment is its intermediate encoded alone with the delivery profile (`tasks.media.profiles`):
it starts on a key frame and no frame refers across it (x264/x265 closed GOPs; ProRes, DNxHR and FFV1
are intra-only), its timestamps `n / fps` from 0 in a timescale of the rate's numerator (exact for
NTSC rates). Its name is a hash of the intermediate's SHA-256, the frame rate, geometry and colour
tags and the encode arguments (`segment_key`), so a later assembly after a one-shot edit encodes only
the shot whose pixels changed and joins the others' very same bytes (`tasks.media.assemble`): their
frames in the new deliverable are bit-identical to the previous one's. A segment is reused only when
the record written beside it (`tasks.files.bind_file`: its key, size and SHA-256) still holds: one
swapped for another shot's, replaced or damaged (even with the right frame count) is encoded again.
Segments no film version uses any more are removed after a join (`prune`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from tasks.config.media import EncodeConfig
from tasks.errors import DecodeError
from tasks.files import atomic_path, bind_file, bound_file_ok, discard
from tasks.media import ffmpeg
from tasks.media.intermediates import count_packets, sha256_file
from tasks.media.native import intermediate_pix_fmt
from tasks.media.probe import VideoInfo
from tasks.media.profiles import delivery

log = logging.getLogger(__name__)

SEGMENT_DIR = "segments"
_MATRICES = {"bt709": "bt709", "bt470bg": "bt601", "smpte170m": "bt601", "bt2020nc": "bt2020", "fcc": "fcc"}


def video_filters(info: VideoInfo, out_pix_fmt: str) -> list[str]:
    """Re-time to `n / fps`, the source's SAR, and the intermediates' pixels to `out_pix_fmt` with the
    film's own matrix and range (none at all when they are already in it: lossless stays bit-exact)."""
    fps = info.fps
    vf = [
        f"settb={fps.denominator}/{fps.numerator}",
        "setpts=N",
        f"setsar={info.sar.numerator}/{info.sar.denominator}",
    ]
    held = intermediate_pix_fmt(info.pix_fmt)
    matrix = _MATRICES.get(info.color_space or "")
    rng = "full" if info.color_range == "pc" else "tv"
    if held == "gbrp":  # RGB intermediates: converted with the film's own matrix and range
        if matrix:
            vf.append(f"scale=out_color_matrix={matrix}:out_range={rng}")
        vf.append(f"format={out_pix_fmt}")
    elif out_pix_fmt != held:  # the source's Y'CbCr to another Y'CbCr format: same matrix and range
        if matrix:
            vf.append(
                f"scale=in_color_matrix={matrix}:in_range={rng}:out_color_matrix={matrix}:out_range={rng}"
            )
        vf.append(f"format={out_pix_fmt}")
    return vf


def color_tags(info: VideoInfo) -> list[str]:
    """The film's colour tags on an encode (when it has a known matrix)."""
    if info.color_space not in _MATRICES:
        return []
    return [
        "-colorspace",
        str(info.color_space),
        "-color_range",
        "full" if info.color_range == "pc" else "tv",
    ]


def closed_gop(codec_args: list[str]) -> list[str]:
    """Encoder options that keep every GOP of a segment closed (long-GOP codecs only)."""
    if "libx264" in codec_args:
        return ["-x264-params", "open-gop=0"]
    if "libx265" in codec_args:
        return ["-x265-params", "open-gop=0:log-level=error"]
    return []


def segment_args(info: VideoInfo, cfg: EncodeConfig, shot: str | Path, out_tmp: Path) -> list[str]:
    """The ffmpeg arguments encoding one shot intermediate as a segment (pure)."""
    d = delivery(cfg, info.pix_fmt)
    args = ["-v", "error", "-y", "-noautorotate", "-i", str(shot), "-map", "0:v:0", "-an", "-sn", "-dn"]
    args += ["-vf", ",".join(video_filters(info, d.pix_fmt)), "-fps_mode", "passthrough", *d.video]
    args += [*closed_gop(d.video), *color_tags(info)]
    args += ["-movflags", "+write_colr"]  # the colour tags of any codec (FFV1 too) kept in the segment
    return [*args, "-video_track_timescale", str(info.fps.numerator), "-f", "mov", str(out_tmp)]


def segment_key(info: VideoInfo, cfg: EncodeConfig, shot_sha256: str) -> str:
    """What a segment is made of: the shot's pixels (their hash) and everything the encode applies."""
    blob = json.dumps(
        [shot_sha256, str(info.fps), str(info.sar), info.pix_fmt, info.color_space, info.color_range,
         segment_args(info, cfg, "IN", Path("OUT"))],
        sort_keys=True,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def encode_segment(
    info: VideoInfo,
    cfg: EncodeConfig,
    shot: str | Path,
    frames: int,
    folder: Path,
    shot_sha256: str | None,
    *,
    out: str | Path,
) -> tuple[Path, bool]:
    """The segment of one shot: (path, True) when it was encoded now, (path, False) when reused.
    A failure is a DecodeError naming the deliverable `out` (its final encode failed) and the shot."""
    digest = shot_sha256 or sha256_file(shot)
    key = segment_key(info, cfg, digest)
    path = folder / f"{key}.mov"
    made_from = {"segment": key, "frames": frames}
    if bound_file_ok(path, made_from, "shot segment"):  # swapped, damaged or unrecorded: encoded again
        return path, False
    folder.mkdir(parents=True, exist_ok=True)
    what = f"final encode failed in the segment of {Path(shot).name}:"
    with atomic_path(path) as tmp:
        code, err = ffmpeg.run(segment_args(info, cfg, shot, tmp), path=out, check=False)
        if code != 0:
            raise DecodeError(out, f"{what} {ffmpeg.last_error_line(err)}")
        got = count_packets(tmp)
        if got != frames:
            raise DecodeError(out, f"{what} {got} frames written, expected {frames}")
    bind_file(path, made_from)
    return path, True


def prune(folder: Path, keep: list[Path]) -> int:
    """Remove the segments in `folder` not in `keep` (earlier versions' shots); return how many."""
    wanted = {p.name for p in keep}
    n = 0
    for p in folder.glob("*.mov"):
        if p.name not in wanted:
            discard(p)
            discard(p.with_name(f"{p.name}.made.json"))
            n += 1
    return n
