"""Join the shots' lossless intermediates into the deliverable, mux the dubbed audio — atomically.

The shot intermediates (FFV1, coded orientation and size, the source's own pixel format where it is
planar Y'CbCr) are re-timed to `n / fps` (the output has the source's frame count and CFR
timestamps) and encoded with the delivery profile (`tasks.media.profiles`: web, mezzanine or
lossless; lossless passes the samples through unconverted), tagged with the source's display matrix
(rotation), sample aspect ratio and colour. By default (`encode.per_shot`) each shot is its own
closed-GOP segment, encoded only when its pixels or the encode changed (`tasks.media.segments`), and
the film is their join by stream copy; `encode.per_shot: false` encodes the film in one pass. The
final mix (or the dialogue track) is muxed with a language tag and cut (or padded, when the length
policy allows) to the picture's duration. The output is written to a temp file in the destination
directory and moved into place (`tasks.files.atomic_path`: fsynced, then `os.replace`; in a film run
staged privately and delivered with a record, `tasks.media.deliver`); the source is never opened for writing. Each shot
intermediate is checked against its done record (size and SHA-256) before it is used, so a corrupted
or truncated shot is never delivered.

VFR sources come out CFR at their average rate with the same frame count (documented limit).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from tasks.config.media import EncodeConfig
from tasks.errors import DecodeError, OutputError
from tasks.files import atomic_path
from tasks.media import ffmpeg
from tasks.media.deliver import Destination, deliver, staging
from tasks.media.intermediates import IntermediateError, count_packets, verify
from tasks.media.probe import VideoInfo, probe
from tasks.media.profiles import check_container, check_size, delivery
from tasks.media.segments import SEGMENT_DIR, color_tags, encode_segment, prune, video_filters

log = logging.getLogger(__name__)

_MUXERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm"}


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


def ffconcat_listing(paths: list[str], frames: list[int] | None = None, fps: Fraction | None = None) -> str:
    """The concat demuxer's listing of `paths` (pure). With each file's frame count and the film's `fps`,
    every file gets a `duration`, so that file k starts at exactly (frames before it) / fps whatever its
    container says: ffmpeg 7.0's mov muxer records a segment's duration one frame short (last - first
    timestamp), which joined ten shots 9 frames short in time (24.12 fps instead of 23.976). Durations
    are differences of the boundaries rounded to the demuxer's microseconds, so no rounding accumulates."""
    lines = ["ffconcat version 1.0"]
    ends = None
    if frames is not None and fps is not None:
        total, ends = 0, []
        for n in frames:
            total += n
            ends.append(round(Fraction(total) / fps * 1_000_000))
    prev = 0
    for k, p in enumerate(paths):
        lines.append("file '" + str(Path(p).resolve()).replace("'", "'\\''") + "'")
        if ends is not None:
            us, prev = ends[k] - prev, ends[k]
            lines.append(f"duration {us // 1_000_000}.{us % 1_000_000:06d}")
    return "\n".join(lines) + "\n"


def _audio_args(info: VideoInfo, audio: AudioSource | None, cfg: EncodeConfig) -> list[str]:
    """The output's audio: the dub (cut or padded to the picture's duration, to the sample) + kept tracks."""
    dur = info.video_duration_s
    args: list[str] = []
    if audio is not None:
        af = [f"apad=whole_dur={dur:.6f}"] if audio.pad else []
        af.append(f"atrim=end={dur:.6f}")
        args += ["-filter:a:0", ",".join(af), *delivery(cfg, info.pix_fmt).audio]
        args += ["-metadata:s:a:0", f"language={cfg.audio_language}", "-disposition:a:0", "default"]
        if cfg.keep_source_audio and info.audio:
            for i in range(1, 1 + len(info.audio)):
                args += [f"-c:a:{i}", "copy", f"-disposition:a:{i}", "0"]
    elif cfg.keep_source_audio and info.audio:
        args += ["-c:a", "copy"]
    return args


def _inputs(info: VideoInfo, listing: Path, audio: AudioSource | None, cfg: EncodeConfig) -> list[str]:
    """The picture (an ffconcat listing), the dub and the source's audio, mapped."""
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
    return args


def _container(muxer: str, stamp: str | None, out_tmp: Path, timecode: str | None = None) -> list[str]:
    args = ["-movflags", "+faststart"] if muxer in ("mp4", "mov") else []
    if timecode:  # the source's start timecode: a conform finds each shot at the same timecode in both
        args += ["-timecode", timecode]
    if stamp:
        args += ["-metadata", f"comment={stamp}"]
    return [*args, "-f", muxer, str(out_tmp)]


def build_encode_args(
    info: VideoInfo,
    listing: Path,
    audio: AudioSource | None,
    cfg: EncodeConfig,
    out_tmp: Path,
    muxer: str,
    stamp: str | None = None,
) -> list[str]:
    """The ffmpeg argument list of a one-pass encode of the whole film (pure; `encode.per_shot: false`).
    `stamp`: the container's `comment` tag (`tasks.run.outputs.output_comment`: the `dubflow:<key>` stamp
    first, then e.g. the preview label)."""
    fps = info.fps
    d = delivery(cfg, info.pix_fmt)
    args = _inputs(info, listing, audio, cfg)
    args += ["-vf", ",".join(video_filters(info, d.pix_fmt)), "-r", f"{fps.numerator}/{fps.denominator}"]
    args += [*d.video, *color_tags(info), *_audio_args(info, audio, cfg)]
    return [*args, *_container(muxer, stamp, out_tmp, info.timecode)]


def build_join_args(
    info: VideoInfo,
    listing: Path,
    audio: AudioSource | None,
    cfg: EncodeConfig,
    out_tmp: Path,
    muxer: str,
    stamp: str | None = None,
) -> list[str]:
    """The ffmpeg argument list joining per-shot segments (`listing`) by stream copy and muxing the
    audio (pure): the picture's bytes are the segments', its timestamps `n / fps` exactly."""
    args = [*_inputs(info, listing, audio, cfg), "-c:v", "copy"]
    if muxer in ("mp4", "mov"):
        args += ["-video_track_timescale", str(info.fps.numerator)]
    return [*args, *_audio_args(info, audio, cfg), *_container(muxer, stamp, out_tmp, info.timecode)]


def verify_shots(shot_paths: list[str], records: list[dict | None]) -> None:
    """Each shot intermediate must be the file its done record describes (size + SHA-256)."""
    for path, record in zip(shot_paths, records, strict=True):
        problem = verify(path, record)
        if problem is not None:
            raise IntermediateError(path, f"shot intermediate does not match its done record: {problem}")


def _encode(info: VideoInfo, args: list[str], tmp: Path, o: Path) -> None:
    """The final encode (ffmpeg `args`, writing `tmp`), verified (frame count, frame rate) before
    anything is moved."""
    _, err = ffmpeg.run(args, path=o, what="final encode")
    if "Impossible to open" in err:  # the concat demuxer skips unreadable files with exit code 0
        raise DecodeError(o, f"final encode failed: {ffmpeg.last_error_line(err)}")
    got = probe(tmp)
    if got.frame_count != info.frame_count:
        raise DecodeError(o, f"encoded {got.frame_count} frames, expected {info.frame_count}")
    if not info.vfr and got.fps != info.fps:
        raise DecodeError(o, f"encoded at {got.fps} fps, expected {info.fps}")


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
    dest: Destination | None = None,
    key: str = "",
    check: Callable[[], None] | None = None,
) -> str:
    """Encode the film from its shot intermediates and mux `audio`; return the output path.

    `records`: the shots' done records (`tasks.media.intermediates`), each verified before use. `stamp`:
    the container's `comment` tag (see `build_encode_args`). The output is verified (frame count, frame
    rate) before it is moved into place; its mode follows the umask. `dest`: where it goes, as checked
    when the run began (`tasks.media.deliver`: staged privately, delivered with a record for `key`).
    `check`: called after the encode, before anything is moved into place (the run's inputs re-verified
    once they have been read: raises to deliver nothing).
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
    segments: list[Path] = []
    if cfg.per_shot:  # each shot encoded once (or reused), joined by stream copy
        frames = [r.get("frames") if r else None for r in (records or [None] * len(shot_paths))]
        digests = [r.get("sha256") if r else None for r in (records or [None] * len(shot_paths))]
        counts: list[int] = []
        encoded = 0
        for p, n, digest in zip(shot_paths, frames, digests, strict=True):
            counts.append(n if n is not None else count_packets(p))
            seg, fresh = encode_segment(info, cfg, p, counts[-1], work / SEGMENT_DIR, digest, out=o)
            segments.append(seg)
            encoded += fresh
        log.info(
            "%d of %d shot segment(s) encoded, %d reused", encoded, len(segments), len(segments) - encoded
        )
        listing.write_text(ffconcat_listing([str(s) for s in segments], counts, info.fps))
        build = build_join_args
    else:
        listing.write_text(ffconcat_listing(shot_paths))
        build = build_encode_args
    if dest is not None:  # a private staging folder, then the checked rename (tasks/media/deliver.py)
        with staging(dest, o.name) as folder:
            _encode(info, build(info, listing, audio, cfg, folder / o.name, muxer, stamp), folder / o.name, o)
            if check is not None:
                check()
            deliver(dest, folder / o.name, o.name, key)
    else:
        with atomic_path(o) as tmp:
            _encode(info, build(info, listing, audio, cfg, tmp, muxer, stamp), tmp, o)
            if check is not None:
                check()
    if segments:
        prune(work / SEGMENT_DIR, segments)  # what no version of this film uses any more
    log.info("wrote %s (%d frames at %s fps)", o, info.frame_count, info.fps)
    return str(o)
