"""Join the shots' lossless intermediates, encode once, remux the dubbed audio — atomically.

The shot intermediates (FFV1, coded orientation and size, the source's own pixel format where it is
planar Y'CbCr) are concatenated frame-exactly and re-timed to `n / fps` (so the output has the
source's frame count and CFR timestamps), encoded once with the delivery profile's codec
(`tasks.media.profiles`: web, mezzanine or lossless; lossless passes the samples through unconverted), and tagged with the source's display matrix (rotation) and
sample aspect ratio. The final mix (or the dialogue track) is muxed with a language tag and cut
(or padded, when the length policy allows) to the picture's duration. The output is written to
a temp file in the destination directory and moved into place with `os.replace`; the source is
never opened for writing. Each shot intermediate is checked against its done record (size and
SHA-256) before it is used, so a corrupted or truncated shot is never delivered.

VFR sources come out CFR at their average rate with the same frame count (documented limit).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tasks.config import EncodeConfig
from tasks.errors import DecodeError, OutputError
from tasks.media import ffmpeg
from tasks.media.intermediates import IntermediateError, verify
from tasks.media.native import intermediate_pix_fmt
from tasks.media.probe import VideoInfo, probe
from tasks.media.profiles import check_container, check_size, delivery

log = logging.getLogger(__name__)

_MUXERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm"}
_MATRICES = {"bt709": "bt709", "bt470bg": "bt601", "smpte170m": "bt601", "bt2020nc": "bt2020", "fcc": "fcc"}


@dataclass(frozen=True)
class AudioSource:
    """The audio to mux: a file, and whether it may be padded to the picture's duration."""

    path: str
    pad: bool = False


def check_output_path(out: str | Path, *inputs: str | Path) -> Path:
    """The output must have a known extension and must not be one of the inputs."""
    o = Path(out)
    if o.suffix.lower() not in _MUXERS:
        raise OutputError(
            o, f"unsupported output extension {o.suffix or '(none)'} (use {', '.join(_MUXERS)})"
        )
    for p in inputs:
        if p is not None and Path(p).exists() and o.exists() and os.path.samefile(o, p):
            raise OutputError(o, "output would overwrite an input file")
        if p is not None and o.resolve() == Path(p).resolve():
            raise OutputError(o, "output would overwrite an input file")
    if o.exists() and o.is_dir():
        raise OutputError(o, "output path is a directory")
    return o


def _ffconcat(paths: list[str]) -> str:
    lines = ["ffconcat version 1.0"]
    for p in paths:
        lines.append("file '" + str(Path(p).resolve()).replace("'", "'\\''") + "'")
    return "\n".join(lines) + "\n"


def build_encode_args(
    info: VideoInfo,
    listing: Path,
    audio: AudioSource | None,
    cfg: EncodeConfig,
    out_tmp: Path,
    muxer: str,
    stamp: str | None = None,
) -> list[str]:
    """The ffmpeg argument list of the final encode (pure). `stamp`: the container's `comment` tag
    (`flows.outputs.output_comment`: the `dubflow:<key>` stamp first, then e.g. the preview label)."""
    fps = info.fps
    dur = info.video_duration_s
    args = ["-v", "error", "-y"]
    if info.rotation:
        args += ["-display_rotation", str(info.rotation)]
    args += ["-noautorotate", "-f", "concat", "-safe", "0", "-i", str(listing)]
    if audio is not None:
        args += ["-i", audio.path]
    if cfg.keep_source_audio and info.audio:
        args += ["-vn", "-i", info.path]
    args += ["-map", "0:v:0"]
    if audio is not None:
        args += ["-map", "1:a:0"]
    if cfg.keep_source_audio and info.audio:
        args += ["-map", f"{2 if audio is not None else 1}:a"]
    vf = [
        f"settb={fps.denominator}/{fps.numerator}",
        "setpts=N",
        f"setsar={info.sar.numerator}/{info.sar.denominator}",
    ]
    out = delivery(cfg, info.pix_fmt)
    held = intermediate_pix_fmt(info.pix_fmt)  # what the shot intermediates hold
    matrix = _MATRICES.get(info.color_space or "")
    rng = "full" if info.color_range == "pc" else "tv"
    if held == "gbrp":  # RGB intermediates: converted with the film's own matrix and range
        if matrix:
            vf.append(f"scale=out_color_matrix={matrix}:out_range={rng}")
        vf.append(f"format={out.pix_fmt}")
    elif out.pix_fmt != held:  # the source's Y'CbCr to another Y'CbCr format: same matrix and range
        if matrix:
            vf.append(
                f"scale=in_color_matrix={matrix}:in_range={rng}:out_color_matrix={matrix}:out_range={rng}"
            )
        vf.append(f"format={out.pix_fmt}")
    # else: the intermediates' own samples go to the encoder unconverted (lossless: bit-exact)
    args += ["-vf", ",".join(vf), "-r", f"{fps.numerator}/{fps.denominator}", *out.video]
    if matrix:
        args += ["-colorspace", info.color_space, "-color_range", rng]
    if audio is not None:
        af = [f"apad=whole_dur={dur:.6f}"] if audio.pad else []
        af.append(f"atrim=end={dur:.6f}")
        args += ["-filter:a:0", ",".join(af), *out.audio]
        args += ["-metadata:s:a:0", f"language={cfg.audio_language}", "-disposition:a:0", "default"]
        if cfg.keep_source_audio and info.audio:
            for i in range(1, 1 + len(info.audio)):
                args += [f"-c:a:{i}", "copy", f"-disposition:a:{i}", "0"]
    elif cfg.keep_source_audio and info.audio:
        args += ["-c:a", "copy"]
    if muxer in ("mp4", "mov"):
        args += ["-movflags", "+faststart"]
    if stamp:
        args += ["-metadata", f"comment={stamp}"]
    return [*args, "-f", muxer, str(out_tmp)]


def _output_temp(final: Path) -> Path:
    """A fresh temp file next to `final` created with mode 0666 & ~umask (the output's eventual mode)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = final.with_name(f".{final.stem}.{os.urandom(4).hex()}.tmp{final.suffix}")
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise OutputError(final, "cannot create a temporary file next to the output")


def verify_shots(shot_paths: list[str], records: list[dict | None]) -> None:
    """Each shot intermediate must be the file its done record describes (size + SHA-256)."""
    for path, record in zip(shot_paths, records, strict=True):
        problem = verify(path, record)
        if problem is not None:
            raise IntermediateError(path, f"shot intermediate does not match its done record: {problem}")


def assemble(
    info: VideoInfo,
    shot_paths: list[str],
    out: str | Path,
    cfg: EncodeConfig,
    *,
    audio: AudioSource | None,
    workdir: str | Path,
    records: list[dict | None] | None = None,
    stamp: str | None = None,
) -> str:
    """Encode the film from its shot intermediates and mux `audio`; return the output path.

    `records`: the shots' done records (`tasks.media.intermediates`), each verified before use. `stamp`:
    the container's `comment` tag (see `build_encode_args`). The output is verified (frame count, frame
    rate) before it is moved into place; its mode follows the umask.
    """
    o = check_output_path(out, info.path, audio.path if audio else None)
    check_container(cfg, o)
    check_size(cfg, info.path, info.width, info.height)
    for p in shot_paths:
        if not Path(p).is_file():
            raise DecodeError(p, "shot intermediate is missing")
    if records is not None:
        verify_shots(shot_paths, records)
    muxer = _MUXERS[o.suffix.lower()]
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    listing = work / "shots.ffconcat"
    listing.write_text(_ffconcat(shot_paths))
    tmp = _output_temp(o)
    try:
        _, err = ffmpeg.run(
            build_encode_args(info, listing, audio, cfg, tmp, muxer, stamp), path=o, what="final encode"
        )
        if "Impossible to open" in err:  # the concat demuxer skips unreadable files with exit code 0
            raise DecodeError(o, f"final encode failed: {ffmpeg.last_error_line(err)}")
        got = probe(tmp)
        if got.frame_count != info.frame_count:
            raise DecodeError(o, f"encoded {got.frame_count} frames, expected {info.frame_count}")
        if not info.vfr and got.fps != info.fps:
            raise DecodeError(o, f"encoded at {got.fps} fps, expected {info.fps}")
        os.replace(tmp, o)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("wrote %s (%d frames at %s fps)", o, info.frame_count, info.fps)
    return str(o)
