"""Mouth activity of a face track, frame by frame: how much the lips move, with head motion taken out.

Holds `MouthMeter`, fed one analysis frame at a time with the tracks' interpolated landmarks.  For each
face it cuts a small grey patch around the mouth (placed by the two mouth-corner landmarks, sized by the
face) and one around the eyes and nose, normalises them, and measures how much each differs from the
patch `lag` frames back after the best shift of up to two patch pixels, relative to the patch's edge
strength (so a head that moves, a crop that jitters or a photo under a camera move does not count as lip
motion).  The comparison spans `lag` frames (`speaker.mouth_lag_s`, 0.16 s): over two frames (80 ms)
the lips of a low-motion talker change about as little as the jitter of the interpolated RetinaFace
landmarks moves the patch; over 0.12-0.24 s their motion adds up.  Mouth activity = mouth change minus
the upper-face change (blinks, lighting, compression noise and residual head motion move both).  The frame-to-frame mouth
change (`motion_rows`) is kept too: its rhythm is what `tasks.perception.av_sync` compares with the speech.
A face whose patches never change at all is a still picture (a poster, a photo, a paused screen).
Must not decode media nor decide who speaks.
"""

from __future__ import annotations

import cv2
import numpy as np

PATCH = (20, 32)  # (h, w) of the normalised mouth and upper-face patches
SHIFT = 2  # the alignment search covers +-SHIFT patch pixels in x and y


def _patch(gray: np.ndarray, cx: float, cy: float, w: float, h: float) -> np.ndarray | None:
    """Grey patch of size (w, h) around (cx, cy) (moved inside the frame where it sticks out), resized to
    PATCH plus a SHIFT margin; None when the frame is smaller than the patch."""
    ph, pw = PATCH
    sx, sy = w / pw, h / ph  # source pixels per patch pixel
    x0, x1 = cx - w / 2 - SHIFT * sx, cx + w / 2 + SHIFT * sx
    y0, y1 = cy - h / 2 - SHIFT * sy, cy + h / 2 + SHIFT * sy
    H, W = gray.shape
    if x1 - x0 > W or y1 - y0 > H or w < 4 or h < 3:
        return None
    dx = max(0.0, -x0) - max(0.0, x1 - W)  # a patch that sticks out of the frame is moved inside it
    dy = max(0.0, -y0) - max(0.0, y1 - H)
    x0, x1, y0, y1 = x0 + dx, x1 + dx, y0 + dy, y1 + dy
    crop = gray[int(y0) : min(H, int(np.ceil(y1))), int(x0) : min(W, int(np.ceil(x1)))]
    out = cv2.resize(crop, (pw + 2 * SHIFT, ph + 2 * SHIFT), interpolation=cv2.INTER_AREA).astype(np.float32)
    return (out - out.mean()) / (out.std() + 4.0)


def _change(prev: np.ndarray, cur: np.ndarray) -> float:
    """How much cur's centre differs from prev after the best shift of up to SHIFT pixels, in units of the
    patch's own edge strength: a sub-pixel shift changes a patch in proportion to its gradients (so a
    moving photo, sharp or soft, reads about the same everywhere), lips that open and close do not."""
    ph, pw = PATCH
    c = cur[SHIFT : SHIFT + ph, SHIFT : SHIFT + pw]
    best = np.inf
    for dy in range(2 * SHIFT + 1):
        for dx in range(2 * SHIFT + 1):
            best = min(best, float(np.mean(np.abs(prev[dy : dy + ph, dx : dx + pw] - c))))
    edges = 0.5 * (float(np.mean(np.abs(np.diff(c, axis=0)))) + float(np.mean(np.abs(np.diff(c, axis=1)))))
    return best / (edges + 0.05)


def face_geometry(landmarks: np.ndarray, box: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mouth patch centre x, y, w, h), (upper-face patch centre x, y, w, h) from 5 landmarks and a box."""
    fw = max(4.0, float(box[2] - box[0]))
    mouth = (landmarks[3] + landmarks[4]) / 2
    eyes = (landmarks[0] + landmarks[1]) / 2
    nose = landmarks[2]
    m = (float(mouth[0]), float(mouth[1] + 0.04 * fw), 0.62 * fw, 0.38 * fw)
    u = (float((eyes[0] + nose[0]) / 2), float((eyes[1] + nose[1]) / 2), 0.7 * fw, 0.35 * fw)
    return m, u


class MouthMeter:
    """Per-frame mouth and upper-face change of every track (NaN where a track is absent)."""

    def __init__(self, n_frames: int, lag: int) -> None:
        self.n_frames = n_frames
        self.lag = max(1, lag)  # compare with the patch this many frames back
        self._mouth: dict[int, np.ndarray] = {}  # track id -> (n_frames,)
        self._upper: dict[int, np.ndarray] = {}
        self._motion: dict[int, np.ndarray] = {}  # frame-to-frame mouth change (audio-visual agreement)
        self._prev: list[dict[int, tuple[np.ndarray, np.ndarray]]] = []  # the last `lag` frames' patches

    def feed(self, t: int, frame: np.ndarray, faces: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Frame ``t`` (RGB analysis frame) with ``{track: (landmarks (5, 2), box (4,))}`` of the tracks in it."""
        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k, (lm, box) in faces.items():
            m, u = face_geometry(lm, box)
            pm, pu = _patch(gray, *m), _patch(gray, *u)
            if pm is None or pu is None:
                continue
            seen[k] = (pm, pu)
            last = self._prev[-1] if self._prev else {}
            if k in last:
                if k not in self._motion:
                    self._motion[k] = np.full(self.n_frames, np.nan, np.float32)
                self._motion[k][t] = _change(last[k][0], pm)
            old = self._prev[0] if len(self._prev) == self.lag else {}
            if k in old:
                if k not in self._mouth:
                    self._mouth[k] = np.full(self.n_frames, np.nan, np.float32)
                    self._upper[k] = np.full(self.n_frames, np.nan, np.float32)
                self._mouth[k][t] = _change(old[k][0], pm)
                self._upper[k][t] = _change(old[k][1], pu)
        self._prev = [*self._prev, seen][-self.lag :]

    def rows(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(mouth change, upper-face change), each (len(ids), n_frames), NaN where a track was not measured."""
        empty = np.full(self.n_frames, np.nan, np.float32)
        mouth = np.array([self._mouth.get(k, empty) for k in ids]).reshape(len(ids), self.n_frames)
        upper = np.array([self._upper.get(k, empty) for k in ids]).reshape(len(ids), self.n_frames)
        return mouth, upper

    def motion_rows(self, ids: list[int]) -> np.ndarray:
        """(len(ids), n_frames) frame-to-frame mouth change, NaN where a track was not measured."""
        empty = np.full(self.n_frames, np.nan, np.float32)
        return np.array([self._motion.get(k, empty) for k in ids]).reshape(len(ids), self.n_frames)


def mouth_activity(mouth: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Mouth activity: mouth change minus upper-face change, >= 0 (NaN where absent)."""
    return np.maximum(0.0, mouth - upper)


__all__ = ["PATCH", "MouthMeter", "face_geometry", "mouth_activity"]
