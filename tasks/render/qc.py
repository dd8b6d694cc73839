"""Quality-control artefacts for a dubbed shot: a side-by-side preview mp4 and a contact sheet PNG.

Both put the source (left) next to the dubbed result (right) at a reduced size, so a reviewer can judge lip
sync and seams quickly from the shot table.  Files are written atomically (`tasks.files.AtomicFile`) so a
crashed or retried task never leaves a half-written artefact under the final name.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from tasks.files import AtomicFile, atomic_write_bytes
from tasks.media import ffmpeg

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QcConfig:
    """Sizes and encoder settings of the QC artefacts."""

    height: int = 240  # preview height (each half is scaled to it)
    fps: float = 25.0
    crf: int = 26  # x264 quality of the preview
    sheet_frames: int = 6  # frame pairs on the contact sheet
    sheet_cols: int = 3
    thumb_height: int = 160  # contact sheet cell height
    label: bool = True  # frame indices on the contact sheet
    title: str | None = None  # a banner on every preview frame and on the sheet (e.g. "PREVIEW PASS")
    header: tuple[str, ...] = ()  # lines above the sheet (film, shot, timecode range, decision), wrapped
    frame_label: Callable[[int], str] | None = None  # shot frame -> its label (a timecode); None: "#<frame>"

    def __post_init__(self) -> None:
        if self.height < 16 or self.thumb_height < 16:
            raise ValueError(f"QcConfig heights must be >= 16, got {self.height}, {self.thumb_height}")
        if self.fps <= 0 or self.sheet_frames < 1 or self.sheet_cols < 1:
            raise ValueError("QcConfig.fps, sheet_frames and sheet_cols must be positive")


@dataclass(frozen=True)
class QcResult:
    """Paths of one shot's QC artefacts."""

    preview: Path
    contact_sheet: Path
    frames: int


# --------------------------------------------------------------------------------------------------------------
# Pure image helpers


def _even(x: float) -> int:
    return max(2, int(round(x / 2)) * 2)


def fit_height(frame: np.ndarray, height: int) -> np.ndarray:
    """Resize an RGB frame to ``height`` (even) keeping its aspect; the width is rounded to even."""
    h, w = frame.shape[:2]
    size = (_even(w * height / h), _even(height))
    if (size[1], size[0]) == (h, w):
        return frame
    interp = cv2.INTER_AREA if size[1] < h else cv2.INTER_LINEAR
    return cv2.resize(frame, size, interpolation=interp)


def side_by_side(source: np.ndarray, dubbed: np.ndarray, height: int) -> np.ndarray:
    """``[source | dubbed]`` at ``height`` pixels: ``(height, w_src + w_dub, 3)`` uint8."""
    return np.concatenate([fit_height(source, height), fit_height(dubbed, height)], axis=1)


def outlined_text(
    img: np.ndarray, text: str, org: tuple[int, int], colour: tuple[int, int, int], scale: float
) -> None:
    """`text` in `colour` with a black outline, readable on any picture. The outline is the same text at
    the same thickness shifted by a pixel each way: a thicker stroke advances wider in Hershey fonts, so a
    thick black copy ran past the end of the text (the ghost letters after a long legend)."""
    x, y = org
    for dx, dy in ((-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (1, 1), (-1, 1), (1, -1)):
        cv2.putText(img, text, (x + dx, y + dy), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(img, text, org, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)


def _put_label(img: np.ndarray, text: str) -> None:
    scale = max(0.35, img.shape[0] / 400)
    outlined_text(img, text, (4, int(14 * scale / 0.45)), (255, 255, 255), scale)


HEADER_SCALE = 0.45  # header text size (cv2 Hershey simplex scale): ~13 px tall letters
HEADER_LINE = 20  # pixels per header line


def wrap_text(text: str, width: int, scale: float, thickness: int = 1) -> list[str]:
    """`text` broken at spaces into lines that each fit `width` pixels in the Hershey simplex font (a word
    longer than the width gets a line of its own, cut to fit)."""
    font = cv2.FONT_HERSHEY_SIMPLEX
    fits = lambda t: cv2.getTextSize(t, font, scale, thickness)[0][0] <= width  # noqa: E731
    lines: list[str] = []
    for word in text.split():
        while not fits(word) and len(word) > 1:
            word = word[:-1]
        if lines and fits(f"{lines[-1]} {word}"):
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def header_band(lines: Sequence[str], width: int) -> np.ndarray:
    """(h, width, 3) uint8: the sheet's header, every line wrapped to the width (nothing drawn over)."""
    wrapped = [w for line in lines for w in wrap_text(line, width - 12, HEADER_SCALE)]
    band = np.full((HEADER_LINE * len(wrapped) + 10, width, 3), 16, np.uint8)
    for k, line in enumerate(wrapped):
        org = (6, 6 + HEADER_LINE * k + 14)
        cv2.putText(band, line, org, cv2.FONT_HERSHEY_SIMPLEX, HEADER_SCALE, (235, 235, 235), 1, cv2.LINE_AA)
    return band


def time_axis(width: int, num_frames: int, label: Callable[[int], str], height: int = 24) -> np.ndarray:
    """(height, width, 3) uint8: a time axis for a strip whose x spans the shot's frames [0, num_frames]
    (the speech timeline's): a tick per frame position, labelled (``label(frame)``, e.g. its timecode) at
    the first and last frame and in between wherever a label fits without touching its neighbours."""
    img = np.full((height, width, 3), 24, np.uint8)
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, 0.35
    cv2.line(img, (0, 2), (width - 1, 2), (150, 150, 150), 1)
    if num_frames <= 0:
        return img
    last = max(1, num_frames - 1)
    x_of = lambda f: round(f / last * (width - 1))  # noqa: E731
    right_edge = -1
    texts = [(0, label(0)), (last, label(last))]
    texts += [(f, label(f)) for f in np.linspace(0, last, 9)[1:-1].round().astype(int).tolist()]
    end_w = cv2.getTextSize(texts[1][1], font, scale, 1)[0][0]
    for frame, text in [texts[0], *texts[2:], texts[1]]:  # left to right, the last frame's label last
        x = x_of(frame)
        cv2.line(img, (x, 2), (x, 7), (200, 200, 200), 1)
        w = cv2.getTextSize(text, font, scale, 1)[0][0]
        left = min(max(0, x - w // 2), width - w - 1)
        end_left = width - end_w - 1
        if (right_edge >= 0 and left <= right_edge + 8) or (frame != last and left + w + 8 >= end_left):
            continue  # would touch the previous label or the last one
        cv2.putText(img, text, (left, height - 6), font, scale, (220, 220, 220), 1, cv2.LINE_AA)
        right_edge = left + w
    return img


def sheet_indices(num_frames: int, n: int) -> list[int]:
    """``n`` evenly spaced frame indices covering first to last frame (fewer for short shots)."""
    if num_frames <= 0:
        return []
    if n == 1:
        return [num_frames // 2]
    return sorted({round(i * (num_frames - 1) / (n - 1)) for i in range(n)})


def contact_sheet(
    pairs: Sequence[tuple[int, np.ndarray, np.ndarray]],
    cols: int,
    thumb_height: int,
    label: bool = True,
    frame_label: Callable[[int], str] | None = None,
) -> np.ndarray:
    """Grid of ``[source | dubbed]`` cells, ``cols`` per row, labelled with their frames (``frame_label``:
    e.g. the frame's timecode and shot frame; default ``#<shot frame>``)."""
    if not pairs:
        raise ValueError("contact sheet needs at least one frame pair")
    cells = []
    for index, src, dub in pairs:
        cell = side_by_side(src, dub, thumb_height).copy()
        if label:
            _put_label(cell, frame_label(index) if frame_label is not None else f"#{index}")
        cells.append(cell)
    cell_w = max(c.shape[1] for c in cells)
    cols = min(cols, len(cells))
    rows = -(-len(cells) // cols)
    pad = 4
    sheet = np.full((rows * (thumb_height + pad) + pad, cols * (cell_w + pad) + pad, 3), 32, np.uint8)
    for k, cell in enumerate(cells):
        r, c = divmod(k, cols)
        y, x = pad + r * (thumb_height + pad), pad + c * (cell_w + pad)
        sheet[y : y + cell.shape[0], x : x + cell.shape[1]] = cell
    return sheet


# --------------------------------------------------------------------------------------------------------------
# File output


def write_png(image: np.ndarray, out_path: str | os.PathLike[str]) -> Path:
    """Write an RGB uint8 image as PNG, atomically."""
    out = Path(out_path)
    ok, buf = cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    if not ok:
        raise RuntimeError(f"PNG encoding failed for {out}")
    return atomic_write_bytes(out, buf.tobytes())


class Mp4Writer:
    """Streams RGB frames of one size into an H.264 mp4 through the project's ffmpeg (`tasks.media.ffmpeg`).

    Use as a context manager; the file appears under its final name only after a clean finish.
    """

    def __init__(
        self,
        out_path: str | os.PathLike[str],
        fps: float,
        crf: int = 26,
        audio: str | os.PathLike[str] | None = None,
    ) -> None:
        self.out = Path(out_path)
        self.fps = fps
        self.crf = crf
        self.audio = None if audio is None else Path(audio)
        self.frames = 0
        self._size: tuple[int, int] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._target: AtomicFile | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    def __enter__(self) -> Mp4Writer:
        return self

    def _start(self, h: int, w: int) -> None:
        self._target = AtomicFile(self.out)
        cmd = [
            "-loglevel", "error", "-y",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-r", f"{self.fps}", "-i", "pipe:0",
        ]  # fmt: skip
        if self.audio is not None:
            cmd += ["-i", str(self.audio), "-map", "0:v:0", "-map", "1:a:0", "-c:a", "aac", "-b:a", "96k"]
            cmd += ["-shortest"]
        cmd += ["-c:v", "libx264", "-preset", "veryfast", "-crf", str(self.crf), "-pix_fmt", "yuv420p"]
        cmd += ["-movflags", "+faststart", "-f", "mp4", str(self._target.tmp)]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _cleanup()
        self._proc = ffmpeg.start_encoder(cmd, stderr=self._log)

    def write(self, frame: np.ndarray) -> None:
        """Append one ``(H, W, 3)`` uint8 frame (all frames must share the first frame's size)."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"preview frame must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}")
        h, w = frame.shape[:2]
        if self._size is None:
            self._size = (h, w)
            self._start(h, w)
        elif self._size != (h, w):
            raise ValueError(f"preview frame size changed: {self._size} -> {(h, w)}")
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(np.ascontiguousarray(frame).tobytes())
        except BrokenPipeError as ex:
            raise RuntimeError(f"ffmpeg stopped while writing {self.out}: {self._stderr()}") from ex
        self.frames += 1

    def _stderr(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace").strip()[-800:]

    def close(self) -> Path:
        """Finish encoding and move the file to its final name."""
        if self._proc is None:
            raise ValueError(f"no frames were written to {self.out}")
        assert self._proc.stdin is not None and self._target is not None
        self._proc.stdin.close()
        rc = self._proc.wait()
        if rc != 0:
            raise RuntimeError(f"ffmpeg failed (exit {rc}) writing {self.out}: {self._stderr()}")
        self._target.commit()
        self._target = None
        self._cleanup()
        return self.out

    def _cleanup(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._target is not None:
            self._target.discard()
            self._target = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._cleanup()


def _frames(frames: np.ndarray | Iterable[np.ndarray]) -> Iterator[np.ndarray]:
    yield from frames


def _count(frames: object, num_frames: int | None) -> int | None:
    if num_frames is not None:
        return num_frames
    return len(frames) if hasattr(frames, "__len__") else None  # type: ignore[arg-type]


def write_qc(
    source_frames: np.ndarray | Iterable[np.ndarray],
    dubbed_frames: np.ndarray | Iterable[np.ndarray],
    out_dir: str | os.PathLike[str],
    stem: str,
    cfg: QcConfig | None = None,
    num_frames: int | None = None,
    audio: str | os.PathLike[str] | None = None,
    overlay: Any | None = None,
) -> QcResult:
    """Write ``<stem>_preview.mp4`` and ``<stem>_sheet.png`` in one pass over the frame pairs.

    ``num_frames`` is needed when the frames come from a generator (to spread the sheet's samples);
    ``audio`` (e.g. the shot's dub slice as wav) is muxed into the preview when given; ``overlay`` (a
    `tasks.render.qc_overlay.SpeakerOverlay`) marks the sheet's source frames with the face tracks and the dubbed
    speaker and adds the speech timeline under the sheet.
    """
    cfg = cfg or QcConfig()
    total = _count(source_frames, num_frames)
    if total is None:
        raise ValueError("write_qc needs num_frames when the frames have no len()")
    wanted = set(sheet_indices(total, cfg.sheet_frames))
    out = Path(out_dir)
    picked: list[tuple[int, np.ndarray, np.ndarray]] = []
    with Mp4Writer(out / f"{stem}_preview.mp4", cfg.fps, cfg.crf, audio) as writer:
        pairs = zip(_frames(source_frames), _frames(dubbed_frames), strict=True)
        for t, (src, dub) in enumerate(pairs):
            frame = side_by_side(src, dub, cfg.height)
            if cfg.title:
                _put_label(frame, cfg.title)
            writer.write(frame)
            if t in wanted:
                marked = overlay.annotate(t, src) if overlay is not None else src
                picked.append((t, fit_height(marked, cfg.thumb_height), fit_height(dub, cfg.thumb_height)))
        if writer.frames != total:
            raise ValueError(f"expected {total} frame pairs for {stem}, got {writer.frames}")
        preview = writer.close()
    grid = contact_sheet(picked, cfg.sheet_cols, cfg.thumb_height, cfg.label, cfg.frame_label)
    if overlay is not None:
        grid = np.concatenate([grid, overlay.timeline(grid.shape[1])], axis=0)
    if cfg.frame_label is not None:  # the time axis under the timeline (or the grid)
        grid = np.concatenate([grid, time_axis(grid.shape[1], total, cfg.frame_label)], axis=0)
    if cfg.header:  # the title is the header's first line then, above the sheet
        grid = np.concatenate([header_band(cfg.header, grid.shape[1]), grid], axis=0)
    elif cfg.title:
        _put_label(grid, cfg.title)
    sheet = write_png(grid, out / f"{stem}_sheet.png")
    log.debug("QC for %s: %s, %s (%d frames)", stem, preview, sheet, total)
    return QcResult(preview=preview, contact_sheet=sheet, frames=total)


def write_preview(
    source_frames: np.ndarray | Iterable[np.ndarray],
    dubbed_frames: np.ndarray | Iterable[np.ndarray],
    out_path: str | os.PathLike[str],
    cfg: QcConfig | None = None,
    audio: str | os.PathLike[str] | None = None,
) -> Path:
    """Only the side-by-side preview mp4."""
    cfg = cfg or QcConfig()
    with Mp4Writer(out_path, cfg.fps, cfg.crf, audio) as writer:
        for src, dub in zip(_frames(source_frames), _frames(dubbed_frames), strict=True):
            frame = side_by_side(src, dub, cfg.height)
            if cfg.title:
                _put_label(frame, cfg.title)
            writer.write(frame)
        return writer.close()


def write_contact_sheet(
    source_frames: np.ndarray | Iterable[np.ndarray],
    dubbed_frames: np.ndarray | Iterable[np.ndarray],
    out_path: str | os.PathLike[str],
    cfg: QcConfig | None = None,
    num_frames: int | None = None,
) -> Path:
    """Only the contact sheet PNG (frames are read once; only the sampled pairs are kept)."""
    cfg = cfg or QcConfig()
    total = _count(source_frames, num_frames)
    if total is None:
        raise ValueError("write_contact_sheet needs num_frames when the frames have no len()")
    wanted = set(sheet_indices(total, cfg.sheet_frames))
    picked = [
        (t, src, dub)
        for t, (src, dub) in enumerate(zip(_frames(source_frames), _frames(dubbed_frames), strict=True))
        if t in wanted
    ]
    return write_png(contact_sheet(picked, cfg.sheet_cols, cfg.thumb_height, cfg.label), out_path)


__all__ = [
    "Mp4Writer",
    "QcConfig",
    "QcResult",
    "contact_sheet",
    "fit_height",
    "sheet_indices",
    "side_by_side",
    "write_contact_sheet",
    "write_png",
    "write_preview",
    "write_qc",
]
