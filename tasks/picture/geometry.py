"""Geometry between the source picture and the model's resolution bucket; pure, no ffmpeg.

`ModelGeometry` maps a coded frame to what the model sees (rotation applied, square pixels, the official
bucket's resize + centre crop) and pastes a generated frame back into the source frame. Bucket tables and
`resize_and_centercrop` follow InfiniteTalk's 480P/720P tables (closest height/width ratio, Pillow bilinear
resize to cover, torchvision-style centre crop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from tasks.media.probe import VideoInfo

if TYPE_CHECKING:
    import torch

# ratio key (height / width) -> (height, width). Dict order matters: ties keep the first key.
BUCKET_TABLES: dict[str, dict[str, tuple[int, int]]] = {
    "480": {
        "0.26": (320, 1216), "0.38": (384, 1024), "0.50": (448, 896), "0.67": (512, 768),
        "0.82": (576, 704), "1.00": (640, 640), "1.22": (704, 576), "1.50": (768, 512),
        "1.86": (832, 448), "2.00": (896, 448), "2.50": (960, 384), "2.83": (1088, 384),
        "3.60": (1152, 320), "3.80": (1216, 320), "4.00": (1280, 320),
    },
    "720": {
        "0.22": (448, 2048), "0.29": (512, 1792), "0.36": (576, 1600), "0.45": (640, 1408),
        "0.55": (704, 1280), "0.63": (768, 1216), "0.76": (832, 1088), "0.88": (896, 1024),
        "1.00": (960, 960), "1.14": (1024, 896), "1.31": (1088, 832), "1.50": (1152, 768),
        "1.58": (1216, 768), "1.82": (1280, 704), "1.91": (1344, 704), "2.20": (1408, 640),
        "2.30": (1472, 640), "2.67": (1536, 576), "2.89": (1664, 576), "3.62": (1856, 512),
        "3.75": (1920, 512),
    },
}  # fmt: skip


def choose_bucket(height: int, width: int, table: str = "480") -> tuple[str, tuple[int, int]]:
    """Closest bucket to `height / width` in the named table: (ratio key, (height, width))."""
    buckets = BUCKET_TABLES[table]
    ratio = height / width
    key = min(buckets, key=lambda k: abs(float(k) - ratio))  # min() keeps the first of equal keys
    return key, buckets[key]


@dataclass(frozen=True)
class CropGeometry:
    """Resize (h, w) by `scale` to cover (th, tw), then centre-crop at (top, left)."""

    src_hw: tuple[int, int]
    scaled_hw: tuple[int, int]
    top: int
    left: int
    target_hw: tuple[int, int]

    @classmethod
    def cover(cls, src_hw: tuple[int, int], target_hw: tuple[int, int]) -> CropGeometry:
        h, w = src_hw
        th, tw = target_hw
        scale = max(th / h, tw / w)
        nh, nw = math.ceil(scale * h), math.ceil(scale * w)
        # torchvision center_crop offsets (Python round: half to even)
        return cls((h, w), (nh, nw), int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0)), (th, tw))

    def source_window(self) -> tuple[int, int, int, int]:
        """The crop window in source pixels, rounded: (y0, y1, x0, x1)."""
        sy = self.src_hw[0] / self.scaled_hw[0]
        sx = self.src_hw[1] / self.scaled_hw[1]
        y0, x0 = round(self.top * sy), round(self.left * sx)
        y1 = min(self.src_hw[0], round((self.top + self.target_hw[0]) * sy))
        x1 = min(self.src_hw[1], round((self.left + self.target_hw[1]) * sx))
        return y0, y1, x0, x1


def resize_and_centercrop(image: np.ndarray, target_hw: tuple[int, int]) -> np.ndarray:
    """uint8 (H, W, 3) -> uint8 (th, tw, 3): Pillow bilinear resize to cover, then centre crop."""
    g = CropGeometry.cover(image.shape[:2], target_hw)
    resized = np.asarray(Image.fromarray(image).resize((g.scaled_hw[1], g.scaled_hw[0]), Image.BILINEAR))
    th, tw = target_hw
    return np.ascontiguousarray(resized[g.top : g.top + th, g.left : g.left + tw])


def resize_and_centercrop_tensor(t: torch.Tensor, target_hw: tuple[int, int]) -> torch.Tensor:
    """(C, h, w) tensor -> (C, th, tw): nearest resize to cover, centre crop (the mask path)."""
    import torch  # lazy: `dubflow shots` never needs torch

    g = CropGeometry.cover(tuple(t.shape[-2:]), target_hw)
    resized = torch.nn.functional.interpolate(t[None], size=g.scaled_hw, mode="nearest")[0]  # (C, nh, nw)
    th, tw = target_hw
    return resized[:, g.top : g.top + th, g.left : g.left + tw].contiguous()


def _resize(img: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    if img.shape[:2] == tuple(hw):
        return img
    return np.asarray(Image.fromarray(img).resize((hw[1], hw[0]), Image.BICUBIC))


@dataclass(frozen=True)
class ModelGeometry:
    """Coded source frame <-> model frame: rotation, square pixels, bucket resize + crop."""

    coded_hw: tuple[int, int]
    rotation: int  # counter-clockwise degrees applied for display
    display_hw: tuple[int, int]  # square-pixel, rotated
    bucket: str  # ratio key in the table
    crop: CropGeometry  # display_hw -> bucket size

    @classmethod
    def for_video(cls, info: VideoInfo, table: str = "480") -> ModelGeometry:
        w_disp, h_disp = info.display_size
        key, target = choose_bucket(h_disp, w_disp, table)
        return cls(
            (info.height, info.width),
            info.rotation,
            (h_disp, w_disp),
            key,
            CropGeometry.cover((h_disp, w_disp), target),
        )

    @property
    def model_hw(self) -> tuple[int, int]:
        return self.crop.target_hw

    def to_display(self, coded: np.ndarray) -> np.ndarray:
        k = self.rotation // 90
        rot_hw = self.display_hw if k % 2 == 0 else self.display_hw[::-1]
        return np.ascontiguousarray(np.rot90(_resize(coded, rot_hw), k))

    def to_coded(self, display: np.ndarray) -> np.ndarray:
        k = self.rotation // 90
        back = np.ascontiguousarray(np.rot90(display, -k))
        return _resize(back, self.coded_hw)

    def to_model(self, coded: np.ndarray) -> np.ndarray:
        """uint8 coded (H, W, 3) -> uint8 model (th, tw, 3)."""
        return resize_and_centercrop(self.to_display(coded), self.crop.target_hw)

    def coded_window(self) -> tuple[int, int, int, int]:
        """The model's crop window in coded source pixels: (y0, y1, x0, x1)."""
        y0, y1, x0, x1 = self.crop.source_window()  # display (rotated, square-pixel) coordinates
        mask = np.zeros(self.display_hw, bool)
        mask[y0:y1, x0:x1] = True
        pre = np.rot90(mask, -(self.rotation // 90))  # before rotation, still square pixels
        rows, cols = np.flatnonzero(pre.any(axis=1)), np.flatnonzero(pre.any(axis=0))
        sx = self.coded_hw[1] / pre.shape[1]  # undo the SAR stretch
        sy = self.coded_hw[0] / pre.shape[0]
        return (
            round(rows[0] * sy),
            round((rows[-1] + 1) * sy),
            round(cols[0] * sx),
            round((cols[-1] + 1) * sx),
        )

    def from_model(self, generated: np.ndarray, source_coded: np.ndarray) -> np.ndarray:
        """Paste a generated model frame back into the coded source frame.

        Only the crop window changes; every pixel outside it stays bit-identical to the source.
        """
        y0, y1, x0, x1 = self.crop.source_window()
        patch = _resize(np.ascontiguousarray(generated), (y1 - y0, x1 - x0))  # display orientation
        patch = np.ascontiguousarray(np.rot90(patch, -(self.rotation // 90)))
        cy0, cy1, cx0, cx1 = self.coded_window()
        out = source_coded.copy()
        out[cy0:cy1, cx0:cx1] = _resize(patch, (cy1 - cy0, cx1 - cx0))
        return out
