"""Region dubbing geometry: a steady bucket-aspect crop around the speaker's face track, crop and composite back.

InfiniteTalk generates video at a fixed set of bucket sizes.  Dubbing a whole film frame at 480p/720p loses
detail and re-renders pixels that do not need to change, so the default is to dub only a head-and-shoulders
crop around the speaker (whose face track `tasks.perception.face_analysis` finds and `tasks.decision.gate` picks): the crop box is snapped to a bucket aspect (so it resizes to the bucket with no
extra cropping), held steady over the shot, and the dubbed crop is blended back with a feathered border.
Every pixel outside the box stays bit-identical to the source.

Frames are numpy uint8 RGB arrays, either one ``(T, H, W, 3)`` array or an iterable of ``(H, W, 3)`` frames.
Boxes are ``(x0, y0, x1, y1)`` half-open integer source-pixel coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import cv2
import numpy as np

from tasks.picture.geometry import BUCKET_TABLES, choose_bucket

Box = tuple[int, int, int, int]  # (x0, y0, x1, y1), half-open, source pixels


def bucket_table_name(size: str) -> str:
    """Name of the official bucket table in ``tasks.media.frames`` for "infinitetalk-480"/"480" or -720/"720"."""
    name = size.removeprefix("infinitetalk-")
    if name not in BUCKET_TABLES:
        raise ValueError(f"unknown bucket size {size!r}; expected infinitetalk-480 or infinitetalk-720")
    return name


def nearest_bucket(height: float, width: float, size: str = "infinitetalk-480") -> tuple[int, int]:
    """Bucket (h, w) whose official h/w key is closest to ``height / width`` (the official choice rule)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"bucket query needs a positive size, got {height}x{width}")
    return choose_bucket(height, width, bucket_table_name(size))[1]  # type: ignore[arg-type]


@dataclass(frozen=True)
class RegionConfig:
    """How a shot's dub region is chosen.  Sizes relative to the face are in face widths/heights."""

    mode: str = "region"  # "region": head-and-shoulders crop; "full": whole frame like the official code
    size: str = "infinitetalk-480"  # bucket table
    min_track_frac: float = 0.3  # the speaker's face must be seen in this fraction of the detection frames
    expand_w: float = 2.6  # crop width = face width * expand_w (before bucket snapping)
    expand_h: float = 3.0  # crop height = face height * expand_h
    shift_down: float = 0.35  # crop centre sits this many face heights below the face centre
    min_crop_frac: float = 0.3  # crop height is at least this fraction of the frame height
    motion: str = "auto"  # "static": one box per shot; "follow": the box pans with the face; "auto": pick
    static_motion_frac: float = 0.08  # auto: static when the centre moves less than this fraction of the crop
    smooth_window: int = 5  # median window over the sampled face boxes
    ema_alpha: float = 0.2  # zero-phase EMA factor of the per-frame crop centre in follow mode
    feather_px: int = 12  # width of the alpha ramp at the crop border when compositing

    def __post_init__(self) -> None:
        if self.mode not in ("region", "full"):
            raise ValueError(f"RegionConfig.mode must be 'region' or 'full', got {self.mode!r}")
        if self.motion not in ("auto", "static", "follow"):
            raise ValueError(f"RegionConfig.motion must be 'auto', 'static' or 'follow', got {self.motion!r}")
        bucket_table_name(self.size)
        if self.smooth_window < 1:
            raise ValueError("RegionConfig.smooth_window must be >= 1")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"RegionConfig.ema_alpha must be in (0, 1], got {self.ema_alpha}")
        if self.feather_px < 0:
            raise ValueError(f"RegionConfig.feather_px must be >= 0, got {self.feather_px}")


@dataclass(frozen=True)
class RegionPlan:
    """Where a shot is dubbed: a bucket-aspect box (or one per frame when following motion) and why."""

    mode: str  # "region" | "full"
    box: Box  # the shot's box; in follow mode the median of the per-frame boxes
    bucket: tuple[int, int]  # model size (h, w); box aspect equals bucket aspect within a pixel
    face_found: bool
    detections: int  # face detections on the speaker's track (0 without a face)
    reason: str
    frame_size: tuple[int, int] = (0, 0)  # source (H, W)
    num_frames: int = 0
    frame_boxes: tuple[Box, ...] | None = None  # per-frame boxes (same size) when the crop follows the face
    face_box: Box | None = None  # median face box of the speaker's track

    def box_at(self, t: int) -> Box:
        """Crop box of frame ``t``."""
        if self.frame_boxes is None:
            return self.box
        return self.frame_boxes[min(t, len(self.frame_boxes) - 1)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples become lists)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RegionPlan:
        """Inverse of :meth:`to_dict`."""
        fb = d.get("frame_boxes")
        face = d.get("face_box")
        return cls(
            mode=d["mode"],
            box=_as_box(d["box"]),
            bucket=(int(d["bucket"][0]), int(d["bucket"][1])),
            face_found=bool(d["face_found"]),
            detections=int(d["detections"]),
            reason=str(d["reason"]),
            frame_size=(int(d.get("frame_size", (0, 0))[0]), int(d.get("frame_size", (0, 0))[1])),
            num_frames=int(d.get("num_frames", 0)),
            frame_boxes=None if fb is None else tuple(_as_box(b) for b in fb),
            face_box=None if face is None else _as_box(face),
        )


def _as_box(b: Sequence[Any]) -> Box:
    return (int(b[0]), int(b[1]), int(b[2]), int(b[3]))


def _to_frames(frames: np.ndarray | Iterable[np.ndarray]) -> Iterable[np.ndarray]:
    if isinstance(frames, np.ndarray) and (frames.ndim != 4 or frames.shape[-1] != 3):
        raise ValueError(f"frames array must be (T, H, W, 3), got shape {frames.shape}")
    return frames


# --------------------------------------------------------------------------------------------------------------
# Box geometry


def snap_box_size(
    crop_h: float, crop_w: float, frame_hw: tuple[int, int], size: str
) -> tuple[tuple[int, int], tuple[int, int]]:
    """Grow (h, w) to the nearest bucket aspect, shrink only if it does not fit the frame.

    Returns ``((box_h, box_w), bucket)``; the dimension derived from the other is within 0.5 px of the exact
    bucket aspect.
    """
    fh, fw = frame_hw
    bh, bw = nearest_bucket(crop_h, crop_w, size)
    r = bh / bw
    if crop_h / crop_w < r:
        crop_h = crop_w * r
    else:
        crop_w = crop_h / r
    fit = min(1.0, fw / crop_w, fh / crop_h)
    w = math.ceil(crop_w * fit - 1e-6)  # grow to whole pixels, the height follows the bucket aspect
    h = round(w * r)
    if w > fw or h > fh:  # the frame limits the box: take its full height (or width) and derive the other
        h = fh
        w = round(h / r)
        if w > fw:
            w = fw
            h = round(w * r)
    return (h, w), (bh, bw)


def _place(cx: float, cy: float, hw: tuple[int, int], frame_hw: tuple[int, int]) -> Box:
    """Box of size ``hw`` centred at (cx, cy), shifted (never shrunk) to lie inside the frame."""
    h, w = hw
    fh, fw = frame_hw
    x0 = min(max(round(cx - w / 2), 0), fw - w)
    y0 = min(max(round(cy - h / 2), 0), fh - h)
    return (x0, y0, x0 + w, y0 + h)


def full_frame_box(frame_hw: tuple[int, int], size: str) -> tuple[Box, tuple[int, int]]:
    """The part of the frame the official resize-and-centre-crop keeps: the largest centred bucket-aspect box.

    Matches ``tasks.picture.geometry.CropGeometry.source_window`` to a pixel or two, but keeps the exact bucket aspect.
    """
    fh, fw = frame_hw
    hw, bucket = snap_box_size(float(fh), float(fw), frame_hw, size)
    return _place(fw / 2, fh / 2, hw, frame_hw), bucket


def plan_from_box(box: Box, frame_hw: tuple[int, int], num_frames: int, size: str, reason: str) -> RegionPlan:
    """A static plan that dubs (at least) ``box``, an editor's crop: grown to the nearest bucket aspect
    around its centre and shifted inside the frame."""
    x0, y0, x1, y1 = box
    hw, bucket = snap_box_size(float(y1 - y0), float(x1 - x0), frame_hw, size)
    placed = _place((x0 + x1) / 2, (y0 + y1) / 2, hw, frame_hw)
    return RegionPlan("region", placed, bucket, False, 0, reason, frame_hw, num_frames)


def _median_filter(x: np.ndarray, window: int) -> np.ndarray:
    """Running median whose window shrinks symmetrically at the ends (keeps linear motion intact)."""
    half = window // 2
    n = len(x)
    return np.array(
        [np.median(x[i - min(half, i, n - 1 - i) : i + min(half, i, n - 1 - i) + 1]) for i in range(n)]
    )


def _zero_phase_ema(x: np.ndarray, alpha: float) -> np.ndarray:
    """Forward-backward exponential smoothing (no lag); odd reflection at both ends keeps trends there."""
    if len(x) < 2:
        return x.astype(np.float64)
    pad = math.ceil(4 / alpha)
    y = np.pad(x.astype(np.float64), pad, mode="reflect", reflect_type="odd")
    for i in range(1, len(y)):
        y[i] = alpha * y[i] + (1 - alpha) * y[i - 1]
    for i in range(len(y) - 2, -1, -1):
        y[i] = alpha * y[i] + (1 - alpha) * y[i + 1]
    return y[pad : pad + len(x)]


def plan_from_track(
    track: list[tuple[int, Box]] | None,
    frame_hw: tuple[int, int],
    num_frames: int,
    num_samples: int,
    cfg: RegionConfig,
) -> RegionPlan:
    """Turn the main face track into a steady bucket-aspect crop plan (pure geometry, no images)."""
    fh, fw = frame_hw
    full_box, full_bucket = full_frame_box(frame_hw, cfg.size)
    seen = len(track) if track else 0
    face_ok = track is not None and seen >= max(1, math.ceil(cfg.min_track_frac * num_samples))
    common = {"frame_size": (fh, fw), "num_frames": num_frames}
    if not face_ok:
        why = "no face found" if seen == 0 else f"face in only {seen}/{num_samples} sampled frames"
        return RegionPlan(
            mode=cfg.mode,
            box=full_box,
            bucket=full_bucket,
            face_found=False,
            detections=seen,
            reason=f"{why}; full-frame box",
            **common,
        )
    assert track is not None
    t = np.array([ti for ti, _ in track], dtype=np.float64)
    b = np.array([bx for _, bx in track], dtype=np.float64)  # (N, 4)
    cx = _median_filter((b[:, 0] + b[:, 2]) / 2, cfg.smooth_window)
    cy = _median_filter((b[:, 1] + b[:, 3]) / 2, cfg.smooth_window)
    face_w = float(np.median(b[:, 2] - b[:, 0]))
    face_h = float(np.median(b[:, 3] - b[:, 1]))
    face_box = _as_box(np.round(np.median(b, axis=0)))
    if cfg.mode == "full":
        return RegionPlan(
            mode="full",
            box=full_box,
            bucket=full_bucket,
            face_found=True,
            detections=seen,
            reason=f"full frame; face in {seen}/{num_samples} sampled frames",
            face_box=face_box,
            **common,
        )
    crop_h = max(face_h * cfg.expand_h, cfg.min_crop_frac * fh)
    crop_w = face_w * cfg.expand_w
    hw, bucket = snap_box_size(crop_h, crop_w, frame_hw, cfg.size)
    ccx, ccy = cx, cy + cfg.shift_down * face_h  # crop centres at the samples
    spread_x = float(ccx.max() - ccx.min())
    spread_y = float(ccy.max() - ccy.min())
    small = spread_x <= cfg.static_motion_frac * hw[1] and spread_y <= cfg.static_motion_frac * hw[0]
    if cfg.motion == "static" or (cfg.motion == "auto" and small):
        box = _place(float(np.median(ccx)), float(np.median(ccy)), hw, frame_hw)
        return RegionPlan(
            mode="region",
            box=box,
            bucket=bucket,
            face_found=True,
            detections=seen,
            reason=f"face in {seen}/{num_samples} sampled frames; static crop",
            face_box=face_box,
            **common,
        )
    frames_t = np.arange(num_frames, dtype=np.float64)
    px = _zero_phase_ema(np.interp(frames_t, t, ccx), cfg.ema_alpha)
    py = _zero_phase_ema(np.interp(frames_t, t, ccy), cfg.ema_alpha)
    boxes = tuple(_place(float(x), float(y), hw, frame_hw) for x, y in zip(px, py, strict=True))
    med = _place(float(np.median(px)), float(np.median(py)), hw, frame_hw)
    return RegionPlan(
        mode="region",
        box=med,
        bucket=bucket,
        face_found=True,
        detections=seen,
        reason=f"face in {seen}/{num_samples} sampled frames; crop follows the face",
        frame_boxes=boxes,
        face_box=face_box,
        **common,
    )


def switch_weights(
    parts: Sequence[tuple[int, int, Any]], num_frames: int, blend_frames: int
) -> tuple[float, ...]:
    """Per shot frame, how strongly the dub is pasted (0: the source, 1: the generated crop): each part's
    frames, faded in over its first ``blend_frames`` frames where it starts inside the shot and out over its
    last ones where it ends inside it, so at a speaker switch the outgoing face goes back to the source
    before the incoming one is dubbed, and no frame has both at full strength."""
    out = [0.0] * num_frames
    ramp = max(0, blend_frames)
    for a, b, _ in parts:
        for t in range(max(0, a), min(num_frames, b)):
            w = 1.0
            if ramp and a > 0:
                w = min(w, (t - a + 0.5) / ramp)
            if ramp and b < num_frames:
                w = min(w, (b - t - 0.5) / ramp)
            out[t] = max(out[t], round(float(np.clip(w, 0.0, 1.0)), 4))
    return tuple(out)


def combine_regions(
    parts: Sequence[tuple[int, int, RegionPlan]], num_frames: int, blend_frames: int = 0
) -> tuple[RegionPlan, tuple[float, ...] | None]:
    """One plan for a shot dubbed in several regions (one per speaker turn, frames [start, end) each).

    Returns the plan (per-frame boxes, all of the largest part's size and bucket, each centred where its
    part's box is; frames outside every part keep the nearest part's box) and the per-frame paste weights
    (`switch_weights`: 0 outside every part, ramps of ``blend_frames`` at the switches; None: every frame
    fully, a single part covering the shot is returned unchanged).
    """
    if not parts:
        raise ValueError("combine_regions needs at least one region")
    if len(parts) == 1 and parts[0][0] == 0 and parts[0][1] >= num_frames:
        return parts[0][2], None
    weights = switch_weights(parts, num_frames, blend_frames)
    if any(p.mode == "full" for _, _, p in parts):  # full frame: one box anyway, only the weights differ
        return parts[0][2], weights
    big = max((p for _, _, p in parts), key=lambda p: (p.box[2] - p.box[0]) * (p.box[3] - p.box[1]))
    hw = (big.box[3] - big.box[1], big.box[2] - big.box[0])
    boxes: list[Box] = []
    for t in range(num_frames):
        inside = [(a, b, p) for a, b, p in parts if a <= t < b]
        a, _, p = inside[0] if inside else min(parts, key=lambda q: min(abs(t - q[0]), abs(t - (q[1] - 1))))
        x0, y0, x1, y1 = p.box_at(min(max(t - a, 0), max(p.num_frames - 1, 0)))
        boxes.append(_place((x0 + x1) / 2, (y0 + y1) / 2, hw, big.frame_size))
    n_det = sum(p.detections for _, _, p in parts)
    plan = RegionPlan(
        mode="region", box=big.box, bucket=big.bucket, face_found=True, detections=n_det,
        reason=f"{len(parts)} speaker regions", frame_size=big.frame_size, num_frames=num_frames,
        frame_boxes=tuple(boxes), face_box=big.face_box,
    )  # fmt: skip
    return plan, weights


# --------------------------------------------------------------------------------------------------------------
# Pixels: crop, resize, composite


def _resize(img: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    h, w = hw
    if img.shape[:2] == (h, w):
        return img.copy()
    shrink = h * w < img.shape[0] * img.shape[1]
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)


def crop_to_bucket(frame: np.ndarray, box: Box, bucket: tuple[int, int]) -> np.ndarray:
    """Cut ``box`` out of ``frame`` and resize it to the bucket: ``(bh, bw, 3)`` uint8."""
    x0, y0, x1, y1 = box
    return _resize(frame[y0:y1, x0:x1], bucket)


def crop_frames(frames: np.ndarray | Iterable[np.ndarray], plan: RegionPlan) -> Iterator[np.ndarray]:
    """Model inputs for a shot: each frame's crop box resized to the plan's bucket."""
    for t, frame in enumerate(_to_frames(frames)):
        yield crop_to_bucket(frame, plan.box_at(t), plan.bucket)


def feather_mask(
    hw: tuple[int, int], feather_px: int, sides: tuple[bool, bool, bool, bool] = (True, True, True, True)
) -> np.ndarray:
    """Alpha ``(h, w)`` float32: 1 inside, a smoothstep ramp of ``feather_px`` pixels on the enabled sides.

    ``sides`` = (left, top, right, bottom); a side that lies on the frame border needs no ramp.
    """
    h, w = hw

    def ramp(n: int, lo: bool, hi: bool) -> np.ndarray:
        a = np.ones(n, dtype=np.float32)
        if feather_px <= 0:
            return a
        d = np.arange(n, dtype=np.float32) + 0.5  # distance of each pixel centre from the low edge
        s = np.clip(d / feather_px, 0.0, 1.0)
        if lo:
            a = np.minimum(a, s * s * (3 - 2 * s))
        s = np.clip(d[::-1] / feather_px, 0.0, 1.0)
        if hi:
            a = np.minimum(a, s * s * (3 - 2 * s))
        return a

    left, top, right, bottom = sides
    return np.minimum(ramp(h, top, bottom)[:, None], ramp(w, left, right)[None, :])


def composite(
    source: np.ndarray, patch: np.ndarray, box: Box, feather_px: int, strength: float = 1.0
) -> np.ndarray:
    """Blend ``patch`` (box-sized, or any size: it is resized to the box) into a copy of ``source``.

    Pixels outside ``box`` are copied unchanged; inside, ``src + alpha * (patch - src)`` rounded to uint8,
    alpha the feather mask times ``strength`` (a fade at a speaker switch).
    """
    x0, y0, x1, y1 = box
    fh, fw = source.shape[:2]
    if not (0 <= x0 < x1 <= fw and 0 <= y0 < y1 <= fh):
        raise ValueError(f"box {box} is not inside the {fw}x{fh} frame")
    patch = _resize(patch, (y1 - y0, x1 - x0))
    out = source.copy()
    sides = (x0 > 0, y0 > 0, x1 < fw, y1 < fh)
    alpha = feather_mask((y1 - y0, x1 - x0), feather_px, sides)[..., None] * np.float32(strength)  # (h, w, 1)
    src = source[y0:y1, x0:x1].astype(np.float32)
    blend = src + alpha * (patch.astype(np.float32) - src)
    out[y0:y1, x0:x1] = np.clip(np.rint(blend), 0, 255).astype(np.uint8)
    return out


def composite_frames(
    source_frames: np.ndarray | Iterable[np.ndarray],
    dubbed_frames: np.ndarray | Iterable[np.ndarray],
    plan: RegionPlan,
    feather_px: int | None = None,
) -> Iterator[np.ndarray]:
    """Put the model's bucket-size frames back into the source frames (one output per source frame)."""
    feather = RegionConfig().feather_px if feather_px is None else feather_px
    pairs = zip(_to_frames(source_frames), _to_frames(dubbed_frames), strict=True)
    for t, (src, dub) in enumerate(pairs):
        yield composite(src, dub, plan.box_at(t), feather)


__all__ = [
    "Box",
    "RegionConfig",
    "RegionPlan",
    "bucket_table_name",
    "combine_regions",
    "composite",
    "composite_frames",
    "crop_frames",
    "crop_to_bucket",
    "feather_mask",
    "full_frame_box",
    "nearest_bucket",
    "plan_from_track",
    "snap_box_size",
    "switch_weights",
]
