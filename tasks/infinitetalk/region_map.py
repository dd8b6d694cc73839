"""Coded source frames <-> model frames for one shot: display boxes mapped back to coded pixels
(rotation, non-square pixels), the shot's region crop or the official full-frame resize + centre crop at
the model's size, the feathered paste back, and the uint8 <-> [-1, 1] tensor conversions.

Pure pixel geometry on arrays; planning the region (face tracks) is `tasks.picture.region`'s, decoding frames
the backend's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from tasks.picture.geometry import CropGeometry, ModelGeometry
from tasks.picture.region import Box, RegionPlan, composite, crop_to_bucket

if TYPE_CHECKING:
    import torch


def display_box_to_coded(box: Box, geometry: ModelGeometry) -> Box:
    """A box in display pixels (rotated, square pixels) -> the same region in coded source pixels."""
    x0, y0, x1, y1 = box
    k = (geometry.rotation // 90) % 4
    hd, wd = geometry.display_hw
    # undo np.rot90(pre, k): rows/cols of the display box in the un-rotated (square-pixel) frame
    if k == 0:
        r0, r1, c0, c1 = y0, y1, x0, x1
        hp, wp = hd, wd
    elif k == 1:  # display[i, j] = pre[j, W - 1 - i]
        hp, wp = wd, hd
        r0, r1, c0, c1 = x0, x1, wp - y1, wp - y0
    elif k == 2:
        hp, wp = hd, wd
        r0, r1, c0, c1 = hp - y1, hp - y0, wp - x1, wp - x0
    else:  # display[i, j] = pre[H - 1 - j, i]
        hp, wp = wd, hd
        r0, r1, c0, c1 = hp - x1, hp - x0, y0, y1
    sy, sx = geometry.coded_hw[0] / hp, geometry.coded_hw[1] / wp
    return (round(c0 * sx), round(r0 * sy), round(c1 * sx), round(r1 * sy))


class ShotRegion:
    """Coded source frames <-> model frames for one shot: a region crop, or the official full frame."""

    def __init__(
        self,
        geometry: ModelGeometry,
        plan: RegionPlan | None,
        model_hw: tuple[int, int],
        feather_px: int,
        weights: tuple[float, ...] | None = None,
    ):
        self.geometry = geometry
        self.weights = weights  # per shot frame: paste strength 0..1 (None: 1 everywhere); 0 = the source
        self.model_hw = model_hw
        self.feather_px = feather_px
        self.full = plan is None or plan.mode == "full"
        self.plan = plan
        if self.full:  # the official resize-to-cover + centre crop, at model_hw
            self.full_geometry = dataclasses.replace(
                geometry, crop=CropGeometry.cover(geometry.display_hw, model_hw)
            )
            self._full_box = self._window_box(self.full_geometry.coded_window())
        else:
            assert plan is not None
            self._boxes: dict[Box, Box] = {}

    @staticmethod
    def _window_box(window: tuple[int, int, int, int]) -> Box:
        y0, y1, x0, x1 = window
        return (x0, y0, x1, y1)

    def coded_box(self, j: int) -> Box:
        """The box of shot frame j in coded pixels (what changes in that frame)."""
        if self.full:
            return self._full_box
        box = self.plan.box_at(j)
        if box not in self._boxes:
            self._boxes[box] = display_box_to_coded(box, self.geometry)
        return self._boxes[box]

    def to_model(self, frame: np.ndarray, j: int) -> np.ndarray:
        """uint8 coded (H, W, 3) frame j -> uint8 model input (mh, mw, 3)."""
        if self.full:
            return self.full_geometry.to_model(frame)

        x0, y0, x1, y1 = self.coded_box(j)
        crop = np.ascontiguousarray(np.rot90(frame[y0:y1, x0:x1], self.geometry.rotation // 90))
        return crop_to_bucket(crop, (0, 0, crop.shape[1], crop.shape[0]), self.model_hw)

    def weight(self, j: int) -> float:
        """Paste strength of shot frame j: 0 outside every speaker region, ramps at a speaker switch."""
        return 1.0 if self.weights is None else self.weights[min(j, len(self.weights) - 1)]

    def dubbed(self, j: int) -> bool:
        """Whether shot frame j is dubbed (frames outside every speaker region stay the source)."""
        return self.weight(j) > 0

    def paste(self, generated: np.ndarray, source: np.ndarray, j: int) -> np.ndarray:
        """Blend a generated model frame into coded source frame j (only its box changes)."""
        w = self.weight(j)
        if w <= 0:
            return source.copy()
        if self.full:
            out = self.full_geometry.from_model(generated, source)
            if w >= 1:
                return out
            mixed = source.astype(np.float32) + w * (out.astype(np.float32) - source)
            return np.clip(np.rint(mixed), 0, 255).astype(np.uint8)

        patch = np.ascontiguousarray(np.rot90(generated, -(self.geometry.rotation // 90)))
        return composite(source, patch, self.coded_box(j), self.feather_px, w)


def paste_frames(
    region: ShotRegion,
    kept: np.ndarray,
    indices: Sequence[int],
    sources: np.ndarray,
    first_j: int,
    finish: Callable[[np.ndarray, int], np.ndarray] | None = None,
    pool: Executor | None = None,
) -> np.ndarray:
    """A chunk's output: generated model frame `kept[indices[t]]` (kept: (n, mh, mw, 3) uint8) pasted into
    coded source frame `sources[t]` (shot frame `first_j + t`), then `finish(frame, j)` if given; (T, H, W, 3)
    uint8. Frames are independent, so `pool` (threads: OpenCV and NumPy release the GIL) maps them in
    parallel and the result is the same bytes as the loop without one."""

    def one(t: int) -> np.ndarray:
        frame = region.paste(kept[indices[t]], sources[t], first_j + t)
        return frame if finish is None else finish(frame, first_j + t)

    ts = range(len(indices))
    return np.stack(list(pool.map(one, ts)) if pool is not None else [one(t) for t in ts])


def to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 (T, H, W, 3) -> float32 (3, T, H, W) in [-1, 1]."""
    import torch

    return torch.from_numpy(np.array(frames)).permute(3, 0, 1, 2).float() / 127.5 - 1.0  # a writable copy


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """float (3, T, H, W) in [-1, 1] -> uint8 (T, H, W, 3) on the host."""
    return ((video.float() + 1.0) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 3, 0).cpu().numpy()
