"""Frame I/O: decoding source frames by index and writing lossless intermediates.

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
    """Write uint8 RGB frames to an FFV1 (lossless) Matroska file, atomically.

    Usage: `with LosslessWriter(path, (h, w), fps) as w: w.write(frames)`; the file appears at
    `path` only if the block exits normally and ffmpeg succeeded.
    """

    def __init__(self, path: str | Path, size_hw: tuple[int, int], fps: Fraction):
        self.path = Path(path)
        self.size_hw = size_hw
        self.fps = fps
        self.count = 0
        self._target: AtomicFile | None = None
        self._ctx = None
        self._pipe = None

    def __enter__(self) -> LosslessWriter:
        self._target = AtomicFile(self.path)
        h, w = self.size_hw
        args = ["-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}"]
        args += ["-framerate", str(self.fps), "-i", "-", "-c:v", "ffv1", "-level", "3", "-pix_fmt", "gbrp"]
        args += ["-f", "matroska", str(self._target.tmp)]
        self._ctx = ffmpeg.write_pipe(args, path=self.path, what="writing lossless intermediate")
        self._pipe = self._ctx.__enter__()
        return self

    def write(self, frames: np.ndarray | Iterable[np.ndarray]) -> None:
        if isinstance(frames, np.ndarray) and frames.ndim == 3:
            frames = [frames]
        for f in frames:
            if f.shape != (*self.size_hw, 3) or f.dtype != np.uint8:
                raise MediaError(
                    self.path,
                    f"frame {self.count} is {f.shape} {f.dtype}, expected {(*self.size_hw, 3)} uint8",
                )
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
