"""Frame I/O: decoding source frames by index and writing lossless intermediates.

Intermediates hold the source's own pixel format where it is planar Y'CbCr (`tasks.media.native`):
`iter_native` decodes without conversion, `write_rendered` puts a rendered chunk's changed pixels in.

Decoding: ffmpeg rawvideo rgb24 pipes in generators (`iter_frames`), frame-accurate by index —
CFR sources seek to half a frame before the wanted frame (ffmpeg decodes from the previous
keyframe and drops everything earlier), VFR sources decode from the start and `select` by index.
Frames stay in the *coded* orientation and size (`-noautorotate`, no SAR scaling) so the output
can be re-encoded with the source's display matrix and SAR (`tasks.picture.geometry` maps a coded
frame to what the model sees and back).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tasks.errors import DecodeError, MediaError
from tasks.files import AtomicFile
from tasks.media import ffmpeg
from tasks.media.native import PixelLayout, intermediate_pix_fmt, native_layout, paste_changed
from tasks.media.probe import VideoInfo

if TYPE_CHECKING:
    pass

# ------------------------------------------------------------------------------------- decoding


def _decode_args(info: VideoInfo, start: int, count: int, vf: list[str], pix_fmt: str) -> list[str]:
    """ffmpeg arguments decoding frames [start, start + count) by index.

    CFR: seek (input `-ss`, which lands on a keyframe at or before the asked time — for some
    containers, such as MPEG-TS, only approximately) to one longest-GOP plus a frame before frame
    `start`, keep the source timestamps (`-copyts`) and `select` frames from half a frame before
    frame `start`'s time. VFR: decode from the start and `select` by index.
    """
    seek: list[str] = []
    if info.vfr:
        if start > 0:
            vf = [f"select=gte(n\\,{start})", *vf]
    elif start > 0:
        t_frame = info.seek_offset_s + float((start - Fraction(1, 2)) / info.fps)  # on the -ss axis
        margin = info.max_keyframe_interval_s + 2 * info.frame_duration_s
        ss = max(0.0, t_frame - margin)
        seek = ["-ss", f"{ss:.6f}", "-copyts"] if ss > 0 else ["-copyts"]
        t_abs = info.start_s + float((start - Fraction(1, 2)) / info.fps)  # on the stream's own clock
        vf = [f"select=gte(t\\,{t_abs:.6f})", *vf]
    args = ["-v", "error", "-noautorotate"]
    args += [*seek[:2], "-i", info.path, *seek[2:], "-map", f"0:{info.stream_index}"]
    args += ["-an", "-sn", "-dn", "-fps_mode", "passthrough"]
    if vf:
        args += ["-vf", ",".join(vf)]
    return [*args, "-frames:v", str(count), "-f", "rawvideo", "-pix_fmt", pix_fmt, "-"]


def iter_frames(
    info: VideoInfo,
    start: int = 0,
    end: int | None = None,
    *,
    width: int | None = None,
    pix_fmt: str = "rgb24",
) -> Iterator[np.ndarray]:
    """Yield frames [start, end) of the video as uint8 (H, W, 3), coded orientation and size.

    `width` downscales (keeping the coded aspect, even height) e.g. for shot detection;
    `pix_fmt` is rgb24 or bgr24. Raises DecodeError if fewer frames than asked for come out.
    """
    end = info.frame_count if end is None else end
    if not 0 <= start <= end <= info.frame_count:
        raise ValueError(f"frame range [{start}, {end}) outside [0, {info.frame_count})")
    count = end - start
    if count == 0:
        return
    h, w = info.height, info.width
    vf: list[str] = []
    if width is not None and width < w:
        h = max(2, int(round(h * width / w / 2)) * 2)
        w = width
        vf.append(f"scale={w}:{h}:flags=area")
    got = 0
    for buf in ffmpeg.read_blocks(_decode_args(info, start, count, vf, pix_fmt), h * w * 3, path=info.path):
        yield np.frombuffer(buf, np.uint8).reshape(h, w, 3)
        got += 1
    if got != count:
        raise DecodeError(info.path, f"decoded {got} frames from frame {start}, expected {count}")


def iter_native(info: VideoInfo, start: int = 0, end: int | None = None) -> Iterator[np.ndarray]:
    """Yield frames [start, end) decoded in the source's own planar Y'CbCr format, each a flat array
    (`PixelLayout.planes` views it), with no conversion: the values the source decodes to."""
    layout = native_layout(info.pix_fmt, info.color_range)
    if layout is None:
        raise MediaError(info.path, f"{info.pix_fmt} is not a planar Y'CbCr format")
    end = info.frame_count if end is None else end
    if not 0 <= start <= end <= info.frame_count:
        raise ValueError(f"frame range [{start}, {end}) outside [0, {info.frame_count})")
    if end == start:
        return
    size = layout.frame_bytes(info.height, info.width)
    got = 0
    for buf in ffmpeg.read_blocks(
        _decode_args(info, start, end - start, [], info.pix_fmt), size, path=info.path
    ):
        yield np.frombuffer(buf, layout.dtype)
        got += 1
    if got != end - start:
        raise DecodeError(info.path, f"decoded {got} frames from frame {start}, expected {end - start}")


class NativeFrames:
    """The source's frames in its own format, read forward by one decoder (re-opened on a jump)."""

    def __init__(self, info: VideoInfo, end: int):
        self.info, self.end = info, end
        self._it: Iterator[np.ndarray] | None = None
        self._pos = -1

    def take(self, start: int, n: int) -> np.ndarray:
        """Frames [start, start + n): (n, samples per frame)."""
        if self._pos != start or self._it is None:
            self.close()
            self._it, self._pos = iter_native(self.info, start, self.end), start
        frames = [next(self._it) for _ in range(n)]
        self._pos += n
        return np.stack(frames)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close:
            close()
        self._it = None


def write_rendered(
    path: str | Path,
    info: VideoInfo,
    rendered: np.ndarray,
    source_rgb: np.ndarray,
    native: NativeFrames | None,
    start: int,
) -> None:
    """Write a rendered chunk (uint8 RGB (T, H, W, 3) for source frames [start, start + T)) as a shot
    intermediate: with `native` (the film is planar Y'CbCr) in the source's own format, only the pixels
    the backend changed (vs `source_rgb`, the RGB it was given) converted (`tasks.media.native`)."""
    with LosslessWriter(path, (info.height, info.width), info.fps, **intermediate_format(info)) as w:
        if native is None or w.layout is None:
            w.write(rendered)
        else:
            frames = native.take(start, rendered.shape[0])
            w.write(paste_changed(frames, rendered, source_rgb, w.layout, info.color_space))


def intermediate_format(info: VideoInfo) -> dict[str, str | None]:
    """The `LosslessWriter` format arguments of a film's intermediates (its own format when it can)."""
    return {
        "pix_fmt": intermediate_pix_fmt(info.pix_fmt),
        "color_space": info.color_space,
        "color_range": info.color_range,
    }


def read_frames(info: VideoInfo, indices: Iterable[int]) -> dict[int, np.ndarray]:
    """Decode specific frames (e.g. reference frames): {index: uint8 (H, W, 3)}."""
    out: dict[int, np.ndarray] = {}
    for j in sorted(set(indices)):
        out[j] = next(iter_frames(info, j, j + 1))
    return out


class FrameCursor:
    """Sequential access to frames [start, end) with a look-back window.

    Chunks need their own frames plus a reference frame a little before them; the cursor keeps
    the last `lookback` frames (and optionally the first frame) of one decoding pipe.
    """

    def __init__(self, info: VideoInfo, start: int, end: int, *, lookback: int, keep_first: bool = False):
        self._it = iter_frames(info, start, end)
        self._next = start
        self._start = start
        self._lookback = max(1, lookback)
        self._buf: dict[int, np.ndarray] = {}
        self._first: np.ndarray | None = None
        self._keep_first = keep_first

    def get(self, j: int) -> np.ndarray:
        if j == self._start and self._first is not None:
            return self._first
        while self._next <= j:
            frame = next(self._it)
            if self._next == self._start and self._keep_first:
                self._first = frame
            self._buf[self._next] = frame
            self._next += 1
            for old in [k for k in self._buf if k < self._next - self._lookback]:
                del self._buf[old]
        if j not in self._buf:
            raise IndexError(f"frame {j} is behind the cursor's look-back window")
        return self._buf[j]

    def range(self, a: int, b: int) -> np.ndarray:
        """Frames [a, b) stacked: uint8 (T, H, W, 3)."""
        return np.stack([self.get(j) for j in range(a, b)]) if b > a else np.empty((0, 0, 0, 3), np.uint8)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close:
            close()


# -------------------------------------------------------------------------------------- writing


class LosslessWriter:
    """Write frames to an FFV1 (lossless) Matroska file, atomically.

    Usage: `with LosslessWriter(path, (h, w), fps) as w: w.write(frames)`; the file appears at
    `path` only if the block exits normally and ffmpeg succeeded. `pix_fmt` "gbrp" (default): uint8 RGB
    (H, W, 3) frames stored as RGB; a planar Y'CbCr format: flat frames in it (`iter_native`), stored
    as they are and tagged with `color_space` / `color_range` (metadata only, no conversion).
    """

    def __init__(
        self,
        path: str | Path,
        size_hw: tuple[int, int],
        fps: Fraction,
        *,
        pix_fmt: str = "gbrp",
        color_space: str | None = None,
        color_range: str | None = None,
    ):
        self.path = Path(path)
        self.size_hw = size_hw
        self.fps = fps
        self.count = 0
        self.layout: PixelLayout | None = None if pix_fmt == "gbrp" else native_layout(pix_fmt, color_range)
        if pix_fmt != "gbrp" and self.layout is None:
            raise MediaError(self.path, f"cannot write {pix_fmt} intermediates (gbrp or planar Y'CbCr)")
        self.pix_fmt = pix_fmt
        self._tags = [f"colorspace={color_space}"] if color_space else []
        if color_range in ("tv", "pc"):
            self._tags.append(f"range={'limited' if color_range == 'tv' else 'full'}")
        self._target: AtomicFile | None = None
        self._ctx = None
        self._pipe = None

    def __enter__(self) -> LosslessWriter:
        self._target = AtomicFile(self.path)
        h, w = self.size_hw
        raw = "rgb24" if self.layout is None else self.pix_fmt
        args = ["-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", raw, "-s", f"{w}x{h}"]
        args += ["-framerate", str(self.fps), "-i", "-"]
        if self.layout is not None and self._tags:
            args += ["-vf", "setparams=" + ":".join(self._tags)]
        args += ["-c:v", "ffv1", "-level", "3", "-pix_fmt", self.pix_fmt]
        args += ["-f", "matroska", str(self._target.tmp)]
        self._ctx = ffmpeg.write_pipe(args, path=self.path, what="writing lossless intermediate")
        self._pipe = self._ctx.__enter__()
        return self

    def _check(self, f: np.ndarray) -> None:
        if self.layout is None:
            shape, dtype = (*self.size_hw, 3), np.dtype(np.uint8)
        else:
            shape, dtype = (self.layout.frame_samples(*self.size_hw),), self.layout.dtype
        if f.shape != shape or f.dtype != dtype:
            raise MediaError(
                self.path, f"frame {self.count} is {f.shape} {f.dtype}, expected {shape} {dtype}"
            )

    def write(self, frames: np.ndarray | Iterable[np.ndarray]) -> None:
        one = 3 if self.layout is None else 1  # the dimensions of one frame
        if isinstance(frames, np.ndarray) and frames.ndim == one:
            frames = [frames]
        for f in frames:
            self._check(f)
            self._pipe.write(np.ascontiguousarray(f).tobytes())
            self.count += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._ctx.__exit__(exc_type, exc, tb)
        except BaseException:
            self._target.discard()
            raise
        if exc_type is not None:
            self._target.discard()
            return
        self._target.commit()
