"""Frames in the source's own pixel format: what intermediates hold, so untouched pixels stay the source's.

A film decodes to Y'CbCr planes (e.g. yuv420p, yuv422p10le); the model works in RGB. Intermediates keep
the decoded planes (`intermediate_pix_fmt`: the source's format when it is planar Y'CbCr, else RGB
``gbrp`` as before), and a rendered chunk goes back into them by `paste_changed`: only pixels whose RGB
the backend changed take the model's values (converted with the film's matrix and range, the ones
ffmpeg decoded it with), a chroma sample only where every pixel it covers changed, so every other
sample is the source's decoded value bit for bit (a skipped shot and every pixel outside a dubbed
crop). Pure numpy here; decoding and writing are `tasks.media.frames`'.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

_PLANAR_YUV = re.compile(r"^yuv(j?)(420|422|444)p(?:(9|10|12|14|16)le)?$")
_SUBSAMPLING = {"420": (2, 2), "422": (2, 1), "444": (1, 1)}
# Kr, Kb of the Y'CbCr matrices ffmpeg decodes with (its default for an untagged stream: BT.601)
_MATRICES = {
    "bt709": (0.2126, 0.0722),
    "bt470bg": (0.299, 0.114),
    "smpte170m": (0.299, 0.114),
    "bt2020nc": (0.2627, 0.0593),
    "fcc": (0.30, 0.11),
}
_BT601 = (0.299, 0.114)


@dataclass(frozen=True)
class PixelLayout:
    """A planar Y'CbCr format: chroma subsampling (sx, sy), bits per sample, full or limited range."""

    pix_fmt: str
    sx: int
    sy: int
    depth: int
    full_range: bool

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.depth == 8 else np.dtype("<u2")

    def chroma_hw(self, h: int, w: int) -> tuple[int, int]:
        return -(-h // self.sy), -(-w // self.sx)

    def frame_samples(self, h: int, w: int) -> int:
        ch, cw = self.chroma_hw(h, w)
        return h * w + 2 * ch * cw

    def frame_bytes(self, h: int, w: int) -> int:
        return self.frame_samples(h, w) * self.dtype.itemsize

    def planes(self, frame: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of one flat frame's Y (h, w), Cb and Cr (chroma_hw) planes."""
        ch, cw = self.chroma_hw(h, w)
        y = frame[: h * w].reshape(h, w)
        u = frame[h * w : h * w + ch * cw].reshape(ch, cw)
        v = frame[h * w + ch * cw :].reshape(ch, cw)
        return y, u, v


def native_layout(pix_fmt: str, color_range: str | None = None) -> PixelLayout | None:
    """The layout of a planar Y'CbCr `pix_fmt` (None for any other format: RGB, packed, semi-planar)."""
    m = _PLANAR_YUV.match(pix_fmt)
    if not m:
        return None
    sx, sy = _SUBSAMPLING[m.group(2)]
    full = bool(m.group(1)) or color_range == "pc"
    return PixelLayout(pix_fmt, sx, sy, int(m.group(3) or 8), full)


def intermediate_pix_fmt(pix_fmt: str) -> str:
    """What a film's FFV1 intermediates hold: its own format when planar Y'CbCr, else RGB (gbrp)."""
    return pix_fmt if native_layout(pix_fmt) is not None else "gbrp"


def rgb_to_planes(
    rgb: np.ndarray, layout: PixelLayout, color_space: str | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 (..., H, W, 3) RGB -> float Y (..., H, W), Cb, Cr (chroma_hw: block means) in `layout`'s
    code values (leading dimensions, e.g. frames, are kept)."""
    kr, kb = _MATRICES.get(color_space or "", _BT601)
    x = rgb.astype(np.float32) / 255.0
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = kr * r + (1.0 - kr - kb) * g + kb * b
    cb = (b - y) / (2.0 * (1.0 - kb))
    cr = (r - y) / (2.0 * (1.0 - kr))
    scale = float(1 << (layout.depth - 8))
    if layout.full_range:
        top = float((1 << layout.depth) - 1)
        y, cb, cr = y * top, cb * top + (1 << (layout.depth - 1)), cr * top + (1 << (layout.depth - 1))
    else:
        y, cb, cr = (16 + 219 * y) * scale, (128 + 224 * cb) * scale, (128 + 224 * cr) * scale
    return y, _block_mean(cb, layout), _block_mean(cr, layout)


def _pad_to_blocks(a: np.ndarray, layout: PixelLayout) -> np.ndarray:
    h, w = a.shape[-2:]
    ph, pw = -h % layout.sy, -w % layout.sx
    pad = [(0, 0)] * (a.ndim - 2) + [(0, ph), (0, pw)]
    return np.pad(a, pad, mode="edge") if ph or pw else a


def _block_views(a: np.ndarray, layout: PixelLayout) -> list[np.ndarray]:
    """(..., H, W) -> sy * sx strided views (..., H / sy, W / sx): the pixels each chroma sample covers,
    one view per position in the block, row by row (edges replicated). Views, not an axis of length
    sy * sx: numpy reduces a short last axis slowly (40 ms a 1080p frame for `any` over RGB)."""
    a = _pad_to_blocks(a, layout)
    return [a[..., i :: layout.sy, j :: layout.sx] for i in range(layout.sy) for j in range(layout.sx)]


def _block_mean(a: np.ndarray, layout: PixelLayout) -> np.ndarray:
    views = _block_views(a, layout)
    total = views[0].copy()
    for v in views[1:]:  # summed in block order, as a mean over the block would
        total += v
    return total / len(views)


def _code(values: np.ndarray, layout: PixelLayout) -> np.ndarray:
    return np.clip(np.rint(values), 0, (1 << layout.depth) - 1).astype(layout.dtype)


PASTE_BATCH = (
    2  # frames converted together: bounds the float temporaries (~125 MB a batch of whole 1080p frames)
)


def paste_changed(
    native: np.ndarray,
    rendered: np.ndarray,
    source_rgb: np.ndarray,
    layout: PixelLayout,
    color_space: str | None,
    *,
    workers: int | None = None,
) -> np.ndarray:
    """The source's decoded frames with the backend's changes put in (the rest untouched, bit for bit).

    native: (T, S) flat frames in `layout` (the source decoded in its own format); rendered and
    source_rgb: uint8 (T, H, W, 3), the backend's output and the RGB decode it was given. A luma sample
    takes the rendered value where that pixel's RGB differs from the source's; a chroma sample where
    every pixel it covers differs (so no sample that covers an untouched pixel changes). Batches of
    `PASTE_BATCH` frames are converted on `workers` threads (default: up to 8 CPUs; numpy releases the
    GIL), as this runs in the render's writer thread, which must keep up with the model.
    """
    t = rendered.shape[0]
    out = np.array(native, copy=True)
    batches = [slice(a, a + PASTE_BATCH) for a in range(0, t, PASTE_BATCH)]
    n = max(1, min(len(batches), workers or min(8, os.cpu_count() or 1)))

    def paste(sl: slice) -> None:
        _paste_batch(out[sl], rendered[sl], source_rgb[sl], layout, color_space)

    if n == 1:
        for sl in batches:
            paste(sl)
    else:
        with ThreadPoolExecutor(n, thread_name_prefix="paste") as pool:
            list(pool.map(paste, batches))  # re-raises the first failure
    return out


def _paste_batch(
    out: np.ndarray,
    rendered: np.ndarray,
    source_rgb: np.ndarray,
    layout: PixelLayout,
    color_space: str | None,
) -> None:
    """`paste_changed` on a few frames, in place on `out` (t, S): one conversion of the frames' common
    bounding box of changed pixels, widened to whole chroma blocks (blocks are aligned to the frame, so
    a sample's value does not depend on the box)."""
    t, h, w, _ = rendered.shape
    diff = rendered != source_rgb  # (t, H, W, 3)
    changed = diff[..., 0] | diff[..., 1] | diff[..., 2]  # (t, H, W)
    rows = np.flatnonzero(changed.any(axis=(0, 2)))
    if not rows.size:
        return
    cols = np.flatnonzero(changed.any(axis=(0, 1)))
    y0, y1 = rows[0] // layout.sy * layout.sy, min(h, -(-(rows[-1] + 1) // layout.sy) * layout.sy)
    x0, x1 = cols[0] // layout.sx * layout.sx, min(w, -(-(cols[-1] + 1) // layout.sx) * layout.sx)
    yy, uu, vv = rgb_to_planes(rendered[:, y0:y1, x0:x1], layout, color_space)
    ch, cw = layout.chroma_hw(h, w)
    py = out[:, : h * w].reshape(t, h, w)  # views into `out` (splitting one axis never copies)
    pu = out[:, h * w : h * w + ch * cw].reshape(t, ch, cw)
    pv = out[:, h * w + ch * cw :].reshape(t, ch, cw)
    mask = changed[:, y0:y1, x0:x1]
    np.copyto(py[:, y0:y1, x0:x1], _code(yy, layout), where=mask)
    views = _block_views(mask, layout)
    cmask = views[0].copy()  # (t, ch, cw) of the box: every pixel of the block changed
    for v in views[1:]:
        cmask &= v
    cy0, cx0 = y0 // layout.sy, x0 // layout.sx
    region = (slice(None), slice(cy0, cy0 + cmask.shape[1]), slice(cx0, cx0 + cmask.shape[2]))
    np.copyto(pu[region], _code(uu, layout), where=cmask)
    np.copyto(pv[region], _code(vv, layout), where=cmask)
