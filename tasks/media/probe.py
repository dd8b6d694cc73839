"""Probe a video with the bundled ffmpeg only: header facts from `ffmpeg -i`, timing from packets.

`ffmpeg -i FILE` prints the container, streams, sizes, SAR/DAR, languages and the display matrix;
`ffmpeg -i FILE -map 0:V -c copy -f framecrc -` lists every video packet with its pts and
duration in the stream time base, which gives an exact frame count (or, with
`probe.frame_count: decode`, every frame is decoded and counted), the exact frame rate as a
rational (24000/1001, not 23.98) and VFR detection. Both parsers are pure functions of the text.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from tasks.errors import DecodeError, MediaNotFound, NotAMediaFile, NoVideoStream, TruncatedMedia
from tasks.media import ffmpeg

# Frame rates a timestamp estimate snaps to when it is within the measurement's precision.
STANDARD_RATES = tuple(
    Fraction(r)
    for r in (
        "24000/1001", "24", "25", "30000/1001", "30", "48", "50", "60000/1001", "60",
        "12", "15", "100", "120000/1001", "120", "144", "240",
    )
)  # fmt: skip

_CHANNELS = {
    "mono": 1, "stereo": 2, "2.1": 3, "3.0": 3, "3.0(back)": 3, "quad": 4, "quad(side)": 4, "4.0": 4,
    "3.1": 4, "4.1": 5, "5.0": 5, "5.0(side)": 5, "5.1": 6, "5.1(side)": 6, "6.0": 6, "6.0(front)": 6,
    "hexagonal": 6, "6.1": 7, "6.1(back)": 7, "6.1(front)": 7, "7.0": 7, "7.0(front)": 7, "7.1": 8,
    "7.1(wide)": 8, "7.1(wide-side)": 8, "octagonal": 8, "downmix": 2,
}  # fmt: skip


def _frac(text: str | Fraction) -> Fraction:
    return text if isinstance(text, Fraction) else Fraction(str(text))


@dataclass(frozen=True)
class AudioStreamInfo:
    """One audio stream of a container."""

    index: int  # stream index in the container
    codec: str
    sample_rate: int
    channels: int
    layout: str
    language: str | None


@dataclass(frozen=True)
class StreamHeader:
    """Facts about the chosen video stream printed by `ffmpeg -i` (before packet timing)."""

    index: int
    codec: str
    pix_fmt: str
    color_range: str | None
    color_space: str | None
    width: int
    height: int
    sar: Fraction
    rotation: int  # display = np.rot90(coded, rotation // 90); counter-clockwise, one of 0/90/180/270
    header_fps: float | None
    language: str | None
    tag_duration_s: float | None = None  # the stream's own DURATION tag (Matroska), if any
    start_s: float | None = None  # the stream's own start time when it differs from the container's


@dataclass(frozen=True)
class ContainerHeader:
    container: str
    duration_s: float | None
    start_s: float | None
    video: tuple[StreamHeader, ...]
    audio: tuple[AudioStreamInfo, ...]
    n_streams: int
    timecode: str | None = None  # the first start timecode tag (HH:MM:SS:FF, ';' drop-frame) of input #0


@dataclass(frozen=True)
class VideoInfo:
    """Everything dubflow needs to know about the source video. Serialisable with to_dict/from_dict."""

    path: str
    container: str
    duration_s: float | None  # container duration (all streams)
    start_s: float  # start time of the video stream, seconds (container clock)
    stream_index: int
    codec: str
    pix_fmt: str
    color_range: str | None
    color_space: str | None
    width: int  # coded (stored) size
    height: int
    sar: Fraction  # sample (pixel) aspect ratio
    rotation: int  # counter-clockwise degrees from the display matrix: 0, 90, 180 or 270
    fps: Fraction  # exact (average for VFR)
    time_base: Fraction
    frame_count: int
    vfr: bool
    audio: tuple[AudioStreamInfo, ...] = field(default=())
    container_start_s: float = 0.0  # the container's start time (what `ffmpeg -ss` is relative to)
    max_keyframe_interval_s: float = 10.0  # longest GOP: how far before a frame a seek must land
    timecode: str | None = None  # the film's start timecode (frame 0), HH:MM:SS:FF; None when untagged

    @property
    def seek_offset_s(self) -> float:
        """Where the first video frame is on ffmpeg's input `-ss` axis (> 0 when audio starts first)."""
        return self.start_s - self.container_start_s

    @property
    def frame_duration_s(self) -> float:
        return float(1 / self.fps)

    @property
    def video_duration_s(self) -> float:
        """frame_count / fps: the picture's duration (what the dub must match)."""
        return float(self.frame_count / self.fps)

    @property
    def display_size(self) -> tuple[int, int]:
        """(width, height) as displayed: square pixels, rotation applied."""
        w = round(self.width * self.sar) if self.sar > 0 else self.width
        h = self.height
        return (h, w) if self.rotation in (90, 270) else (w, h)

    @property
    def dar(self) -> Fraction:
        """Display aspect ratio (width / height) of the coded picture, before rotation."""
        return Fraction(self.width, self.height) * (self.sar if self.sar > 0 else 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("sar", "fps", "time_base"):
            d[k] = str(d[k])
        d["audio"] = [asdict(a) for a in self.audio]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VideoInfo:
        d = dict(d)
        for k in ("sar", "fps", "time_base"):
            d[k] = _frac(d[k])
        d["audio"] = tuple(AudioStreamInfo(**a) for a in d.get("audio", ()))
        return cls(**d)


# ----------------------------------------------------------------------------------------- parsing


def split_top_level(text: str) -> list[str]:
    """Split an ffmpeg stream description on commas that are not inside () or []."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur).strip())
    return parts


_STREAM_RE = re.compile(
    r"^\s*Stream #0:(?P<idx>\d+)(?:\[0x[0-9a-fA-F]+\])?(?:\((?P<lang>[^)]*)\))?: (?P<kind>\w+): (?P<rest>.*)$"
)
_DURATION_RE = re.compile(r"^\s*Duration: (?P<dur>[\d:.]+|N/A)(?:, start: (?P<start>-?[\d.]+))?")
_ROTATION_RE = re.compile(r"(?:display ?matrix): rotation of (?P<deg>-?[\d.]+) degrees", re.IGNORECASE)
_SIZE_RE = re.compile(r"^(?P<w>\d+)x(?P<h>\d+)")
_SAR_RE = re.compile(r"SAR (?P<sn>\d+):(?P<sd>\d+) DAR (?P<dn>\d+):(?P<dd>\d+)")
_FPS_RE = re.compile(r"^(?P<v>[\d.]+)(?P<k>k?) fps$")


def _seconds(hms: str) -> float:
    h, m, s = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def normalise_rotation(deg: float) -> int:
    """Display-matrix rotation in degrees (any sign) -> counter-clockwise 0/90/180/270."""
    return int(round(deg / 90.0)) % 4 * 90


_FIELD_ORDERS = ("progressive", "top first", "bottom first", "top coded first (swapped)")


def _parse_video(idx: int, lang: str | None, rest: str) -> StreamHeader:
    parts = split_top_level(rest)
    codec = parts[0].split()[0] if parts else "unknown"
    pix_fmt, crange, cspace = "unknown", None, None
    width = height = 0
    sar = Fraction(1)
    fps = None
    start = None
    for p in parts[1:]:
        m = _SIZE_RE.match(p)
        if m and not width:
            width, height = int(m["w"]), int(m["h"])
        elif not width and re.match(r"^[a-z0-9_]+(\(.*\))?$", p):
            pix_fmt = p.split("(")[0]
            if "(" in p:
                opts = [o.strip() for o in p[p.index("(") + 1 : -1].split(",")]
                for o in opts:
                    if o in ("tv", "pc"):
                        crange = o
                    elif o not in _FIELD_ORDERS and not o.startswith(
                        ("unknown", "left", "topleft", "center")
                    ):
                        cspace = o.split("/")[0]
        sm = _SAR_RE.search(p)
        if sm and int(sm["sd"]) > 0:
            sar = Fraction(int(sm["sn"]), int(sm["sd"])) if int(sm["sn"]) > 0 else Fraction(1)
        fm = _FPS_RE.match(p)
        if fm:
            fps = float(fm["v"]) * (1000 if fm["k"] else 1)
        st = re.match(r"^start (-?[\d.]+)$", p)
        if st:
            start = float(st[1])
    return StreamHeader(
        index=idx, codec=codec, pix_fmt=pix_fmt, color_range=crange, color_space=cspace,
        width=width, height=height, sar=sar, rotation=0, header_fps=fps, language=lang, start_s=start,
    )  # fmt: skip


def _parse_audio(idx: int, lang: str | None, rest: str) -> AudioStreamInfo:
    parts = split_top_level(rest)
    codec = parts[0].split()[0] if parts else "unknown"
    rate, layout, channels = 0, "unknown", 0
    for i, p in enumerate(parts[1:], start=1):
        m = re.match(r"^(\d+) Hz$", p)
        if m:
            rate = int(m[1])
            if i + 1 < len(parts):
                layout = parts[i + 1]
            break
    m = re.match(r"^(\d+) channels", layout)
    channels = int(m[1]) if m else _CHANNELS.get(layout, _CHANNELS.get(layout.split("(")[0], 0))
    return AudioStreamInfo(
        index=idx, codec=codec, sample_rate=rate, channels=channels, layout=layout,
        language=None if lang in (None, "und") else lang,
    )  # fmt: skip


def parse_ffmpeg_info(text: str, path: str | Path = "<input>") -> ContainerHeader:
    """Parse the stderr of `ffmpeg -hide_banner -i FILE` (input #0 only). Pure.

    Raises MediaNotFound / NotAMediaFile for the messages ffmpeg prints when it cannot open a file.
    """
    if "No such file or directory" in text:
        raise MediaNotFound(path, "no such file")
    container = None
    duration = start = None
    videos: list[StreamHeader] = []
    audios: list[AudioStreamInfo] = []
    n_streams = 0
    timecode = None
    last_kind = None
    in_input0 = False
    for line in text.splitlines():
        m = re.match(r"^Input #(\d+), (.+), from '", line)
        if m:
            in_input0 = m[1] == "0"
            container = m[2] if in_input0 else container
            continue
        if re.match(r"^(Output|Stream mapping)", line):
            in_input0 = False
        if not in_input0:
            continue
        m = _DURATION_RE.match(line)
        if m:
            duration = None if m["dur"] == "N/A" else _seconds(m["dur"])
            start = float(m["start"]) if m["start"] else None
            continue
        m = _STREAM_RE.match(line)
        if m:
            n_streams += 1
            idx, lang, kind, rest = int(m["idx"]), m["lang"], m["kind"], m["rest"]
            last_kind = kind
            if kind == "Video" and "(attached pic)" not in rest:
                videos.append(_parse_video(idx, lang, rest))
            elif kind == "Audio":
                audios.append(_parse_audio(idx, lang, rest))
            else:
                last_kind = None
            continue
        m = re.match(r"^\s+timecode\s*: (\d\d:\d\d:\d\d[:;.]\d\d)\s*$", line)
        if m:
            timecode = timecode or m[1]
            continue
        m = re.match(r"^\s+DURATION\s*: (\d+:\d+:[\d.]+)", line)
        if m and last_kind == "Video" and videos:
            videos[-1] = StreamHeader(**{**videos[-1].__dict__, "tag_duration_s": _seconds(m[1])})
            continue
        m = _ROTATION_RE.search(line)
        if m and last_kind == "Video" and videos:
            v = videos[-1]
            videos[-1] = StreamHeader(**{**v.__dict__, "rotation": normalise_rotation(float(m["deg"]))})
    if container is None:
        reason = "not a media file ffmpeg can read"
        for ln in text.splitlines():
            if "moov atom not found" in ln:
                reason = "truncated or not a media file (moov atom not found)"
                break
            if "Invalid data found" in ln:
                reason = "not a media file ffmpeg can read (invalid data)"
        raise NotAMediaFile(path, reason)
    return ContainerHeader(container, duration, start, tuple(videos), tuple(audios), n_streams, timecode)


def parse_framecrc(lines: Iterable[str]) -> tuple[Fraction, list[int], list[int], list[bool]]:
    """Parse a `-f framecrc` listing of one stream: (time_base, pts, durations, keyframe flags). Pure.

    framecrc prints `F=0x..` only when a packet's flags differ from "keyframe".
    """
    tb = None
    pts: list[int] = []
    durs: list[int] = []
    keys: list[bool] = []
    for line in lines:
        if line.startswith("#tb 0:"):
            tb = Fraction(line.split(":", 1)[1].strip())
            continue
        if not line or line.startswith("#"):
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 5 or cols[0] != "0":
            continue
        pts.append(int(cols[2]))
        durs.append(int(cols[3]))
        flags = next((c[2:] for c in cols[5:] if c.startswith("F=")), None)
        keys.append(flags is None or bool(int(flags, 16) & 1))
    if tb is None:
        raise ValueError("framecrc listing has no '#tb 0:' line")
    return tb, pts, durs, keys


def max_keyframe_interval(pts: list[int], keys: list[bool], time_base: Fraction) -> float:
    """Longest stretch (seconds) a decoder may need to reach the next keyframe, end of stream included. Pure."""
    if not pts:
        return 0.0
    kpts = sorted(p for p, k in zip(pts, keys, strict=True) if k)
    edges = [min(pts), *kpts, max(pts)]
    return (
        float(max(b - a for a, b in zip(edges, edges[1:], strict=False)) * time_base)
        if len(edges) > 1
        else 0.0
    )


def frame_rate_from_pts(
    pts: list[int], durations: list[int], time_base: Fraction, header_fps: float | None = None
) -> tuple[Fraction, bool]:
    """Exact frame rate (average for VFR) and whether the stream is VFR. Pure.

    The rate is (n - 1) / (last_pts - first_pts) over the sorted presentation times, snapped to
    a standard rate (24000/1001, 25, 30000/1001, ...) when that is within the timestamps'
    precision (one time-base tick over the span), else reduced with `limit_denominator(1001)`
    unless it is exact already. VFR = some frame interval differs from the median interval by
    more than max(1 tick, 0.5 %) (mkv's 1 ms ticks make 23.976 fps alternate 41/42 ms: CFR).
    Packets sharing a timestamp (VFR muxed into mkv) are all frames of the picture: the rate is then
    every packet over the real duration (span + the median interval, the last frame's display time),
    so that frame_count / fps is the stream's duration, and the stream is VFR.
    """
    ts = sorted(set(pts))
    n = len(ts)
    if n >= 2 and ts[-1] > ts[0]:
        span = (ts[-1] - ts[0]) * time_base
        raw = Fraction(n - 1) / span
        rel_precision = float(time_base / span) * 1.5 + 1e-9
        diffs = [b - a for a, b in zip(ts, ts[1:], strict=False)]
        med = statistics.median(diffs)
        tol = max(1.0, 0.005 * med)
        vfr = any(abs(d - med) > tol for d in diffs)
        if len(pts) > n:  # duplicate timestamps: every frame counts, over the stream's real duration
            raw = Fraction(len(pts)) / ((ts[-1] - ts[0] + Fraction(med)) * time_base)
            rel_precision, vfr = float(time_base / span) * 1.5 + 1e-9, True
    else:
        d0 = durations[0] if durations and durations[0] > 0 else 0
        if d0:
            raw = 1 / (d0 * time_base)
            rel_precision = 1.0 / d0 + 1e-9
        elif header_fps:
            raw = Fraction(header_fps).limit_denominator(1001)
            rel_precision = 0.005
        else:
            raise ValueError("cannot determine the frame rate of a single frame without duration")
        vfr = False
    best = min(STANDARD_RATES, key=lambda c: abs(float(raw - c)) / float(c))
    if abs(float(raw - best)) / float(best) <= rel_precision:
        return best, vfr
    if rel_precision < 1e-6:
        return raw, vfr
    return raw.limit_denominator(1001), vfr


def parse_progress_frames(text: str) -> int:
    """Last `frame=N` of an ffmpeg `-progress` stream. Pure."""
    frames = re.findall(r"^frame=\s*(\d+)\s*$", text, flags=re.MULTILINE)
    if not frames:
        raise ValueError("no frame= line in ffmpeg progress output")
    return int(frames[-1])


# -------------------------------------------------------------------------------------------- I/O


def read_header(path: str | Path) -> ContainerHeader:
    """Run `ffmpeg -i` on `path` and parse it."""
    p = Path(path)
    if not p.exists():
        raise MediaNotFound(p, "no such file")
    if not p.is_file():
        raise MediaNotFound(p, "not a regular file")
    _, err = ffmpeg.run(["-i", str(p)], path=p, check=False)
    return parse_ffmpeg_info(err, p)


def _count_decoded(path: Path, stream_index: int) -> int:
    rc, err = ffmpeg.run(
        ["-v", "error", "-nostats", "-progress", "pipe:2", "-i", str(path), "-map", f"0:{stream_index}",
         "-fps_mode", "passthrough", "-f", "null", "-"],
        path=path, what="decoding", check=False,
    )  # fmt: skip
    if rc != 0:
        raise DecodeError(path, f"decoding failed: {ffmpeg.last_error_line(err)}")
    return parse_progress_frames(err)


def probe(path: str | Path, *, frame_count: str = "packets") -> VideoInfo:
    """Probe `path`: container header + exact video timing. Raises a MediaError naming the file."""
    p = Path(path)
    head = read_header(p)
    if not head.video:
        raise NoVideoStream(p, f"no video stream ({head.container}, {head.n_streams} stream(s))")
    v = head.video[0]
    stderr: list[str] = []
    try:
        lines = list(
            ffmpeg.read_lines(
                ["-v", "error", "-i", str(p), "-map", f"0:{v.index}", "-c", "copy", "-f", "framecrc", "-"],
                path=p,
                what="reading packets",
                stderr_sink=stderr,
            )
        )
    except DecodeError as ex:
        if "partial file" in ex.problem:
            raise TruncatedMedia(p, "file is truncated (ffmpeg: partial file)") from ex
        raise
    if any("partial file" in s for s in stderr):
        raise TruncatedMedia(p, "file is truncated (ffmpeg: partial file)")
    tb, pts, durs, keys = parse_framecrc(lines)
    if not pts:
        raise NoVideoStream(p, "the video stream has no frames")
    fps, vfr = frame_rate_from_pts(pts, durs, tb, v.header_fps)
    count = len(pts)
    if frame_count == "decode":
        count = _count_decoded(p, v.index)
    info = VideoInfo(
        path=str(p), container=head.container, duration_s=head.duration_s,
        start_s=v.start_s if v.start_s is not None else (head.start_s or 0.0), stream_index=v.index, codec=v.codec, pix_fmt=v.pix_fmt,
        color_range=v.color_range, color_space=v.color_space, width=v.width, height=v.height,
        sar=v.sar, rotation=v.rotation, fps=fps, time_base=tb, frame_count=count, vfr=vfr,
        audio=head.audio, container_start_s=head.start_s or 0.0,
        max_keyframe_interval_s=max_keyframe_interval(pts, keys, tb), timecode=head.timecode,
    )  # fmt: skip
    _check_truncation(p, info, v.tag_duration_s)
    return info


def _check_truncation(path: Path, info: VideoInfo, stream_duration_s: float | None) -> None:
    """Readable frames falling short of what the header promises by > 2 frames means truncation.

    Uses the video stream's own duration tag when there is one; otherwise the container duration,
    but only when there is no audio stream (audio may legitimately outlast the picture).
    """
    promised = stream_duration_s
    if promised is None and not info.audio:
        promised = info.duration_s
    if promised is None:
        return
    readable = info.seek_offset_s + info.video_duration_s
    if promised - readable > 2 * info.frame_duration_s + 0.01:
        raise TruncatedMedia(
            path, f"header says {promised:.3f} s but only {readable:.3f} s of video is readable"
        )
