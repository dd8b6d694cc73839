"""Tiny mode's labels: the banner every log line and shot reason carries, the label burnt into every
dubbed frame, and the tiny model size (1/16 of the bucket).

Tiny mode (`infinitetalk.weights: null`) runs tiny random weights as a pipeline check, not a dubbing
result, and says so everywhere. This file holds only those labels and sizes; the tiny weights root itself
is written by `cache.ensure_tiny_root` (it needs the file lock), the model by `model.weights.tiny`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tasks.picture.region import Box

TINY_BANNER = "tiny random weights: pipeline check, not a dubbing result"
TINY_LABEL = "TINY RANDOM WEIGHTS - NOT A DUB"
TINY_SCALE = 16  # tiny mode generates at 1/16 of the bucket (sides rounded to multiples of 16)


def tiny_hw(bucket: tuple[int, int]) -> tuple[int, int]:
    """Tiny-mode model size for a bucket: 1/TINY_SCALE of each side, a multiple of 16 (>= 16)."""
    return tuple(max(16, 16 * round(side / (16 * TINY_SCALE))) for side in bucket)  # type: ignore[return-value]


class TinyLog(logging.LoggerAdapter):
    """Prefixes every message with the tiny-weights banner."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{TINY_BANNER}] {msg}", kwargs


def label_tiny(frame: np.ndarray, box: Box) -> np.ndarray:
    """Write TINY_LABEL inside `box` of a copy of `frame` (nothing outside the box changes)."""
    import cv2

    x0, y0, x1, y1 = box
    out = frame.copy()
    patch = np.ascontiguousarray(out[y0:y1, x0:x1])
    font = cv2.FONT_HERSHEY_SIMPLEX
    (tw, th), _ = cv2.getTextSize(TINY_LABEL, font, 1.0, 1)
    scale = max(0.15, min(1.0, (x1 - x0 - 4) / tw))  # fit the box width
    org = (2, 2 + max(1, round(th * scale)))
    cv2.putText(patch, TINY_LABEL, org, font, scale, (0, 0, 0), 2, cv2.LINE_AA)
    cv2.putText(patch, TINY_LABEL, org, font, scale, (255, 255, 0), 1, cv2.LINE_AA)
    out[y0:y1, x0:x1] = patch
    return out
