"""Face tracks through a shot: detections on every k-th frame linked by overlap and appearance.

Holds `Track` (one face's detections in a shot, with boxes and landmarks interpolated for the frames in
between) and `link_tracks`, a greedy frame-to-frame matcher: a detection joins the live track it overlaps
most (IoU), or, when the face moved fast or the detector missed it for a few samples, the nearby track it
looks like (a colour histogram of the face); a track that is not seen for `max_miss` samples ends.
Coordinates are analysis pixels (the frames the detector saw).  Must not decode media nor judge who speaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

from tasks.perception.faces import Face


def appearance(frame: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    """Colour signature of a face: a normalised 16x4 hue/saturation histogram of its inner box (64,)."""
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    h_img, w_img = frame.shape[:2]
    a0, a1 = int(max(0, x0 + 0.2 * w)), int(min(w_img, x1 - 0.2 * w))
    b0, b1 = int(max(0, y0 + 0.15 * h)), int(min(h_img, y1 - 0.1 * h))
    if a1 - a0 < 2 or b1 - b0 < 2:
        return np.full(64, 1 / 64, np.float32)
    hsv = cv2.cvtColor(np.ascontiguousarray(frame[b0:b1, a0:a1]), cv2.COLOR_RGB2HSV)
    hist = cv2.calcHist([hsv], [0, 1], None, [16, 4], [0, 180, 0, 256]).ravel()
    return (hist / max(1.0, float(hist.sum()))).astype(np.float32)


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Bhattacharyya coefficient of two normalised histograms: 1 identical .. 0 disjoint."""
    return float(np.sum(np.sqrt(a * b)))


def iou(a: np.ndarray | tuple, b: np.ndarray | tuple) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


@dataclass
class Track:
    """One face through a shot: its detections (frames ascending) and their boxes/landmarks."""

    id: int
    frames: list[int] = field(default_factory=list)
    boxes: list[np.ndarray] = field(default_factory=list)  # (4,) x0, y0, x1, y1
    landmarks: list[np.ndarray] = field(default_factory=list)  # (5, 2)
    scores: list[float] = field(default_factory=list)
    look: np.ndarray | None = None  # running appearance (64,)
    last_sample: int = 0

    @property
    def start(self) -> int:
        return self.frames[0]

    @property
    def end(self) -> int:
        """Exclusive end frame (the last detection's frame + 1)."""
        return self.frames[-1] + 1

    def side(self) -> float:
        """Median face size (mean of width and height) in analysis pixels."""
        b = np.asarray(self.boxes)
        return float(np.median(((b[:, 2] - b[:, 0]) + (b[:, 3] - b[:, 1])) / 2))

    def add(self, t: int, face: Face, look: np.ndarray, sample: int) -> None:
        self.frames.append(t)
        self.boxes.append(np.asarray(face.box, np.float64))
        self.landmarks.append(np.asarray(face.landmarks, np.float64))
        self.scores.append(face.score)
        self.look = look if self.look is None else 0.8 * self.look + 0.2 * look
        self.last_sample = sample

    def boxes_at(self, frames: np.ndarray) -> np.ndarray:
        """Boxes (len(frames), 4) linearly interpolated between detections (held at the ends)."""
        b = np.asarray(self.boxes)
        return np.stack([np.interp(frames, self.frames, b[:, k]) for k in range(4)], axis=1)

    def landmarks_at(self, frames: np.ndarray) -> np.ndarray:
        """Landmarks (len(frames), 5, 2) linearly interpolated between detections."""
        lm = np.asarray(self.landmarks).reshape(len(self.frames), 10)
        out = np.stack([np.interp(frames, self.frames, lm[:, k]) for k in range(10)], axis=1)
        return out.reshape(len(frames), 5, 2)


class Tracker:
    """Greedy frame-to-frame linking of detections into tracks, one detection frame at a time.

    A face joins the live track with the best overlap (>= ``min_iou``), else a live track whose last box
    centre is within 1.5 face widths and whose appearance is similar (>= ``min_look``); otherwise it starts
    a new track.  A track missing for more than ``max_miss`` samples ends.
    """

    def __init__(self, max_miss: int, min_iou: float = 0.2, min_look: float = 0.75) -> None:
        self.max_miss = max_miss
        self.min_iou = min_iou
        self.min_look = min_look
        self.tracks: list[Track] = []
        self.live: list[Track] = []
        self._sample = -1

    def update(self, t: int, faces: list[Face], looks: list[np.ndarray]) -> None:
        """Add the detections of frame ``t`` (frames ascending)."""
        self._sample += 1
        si = self._sample
        self.live = [tr for tr in self.live if si - tr.last_sample <= self.max_miss + 1]
        pairs = []
        for fi, (face, look) in enumerate(zip(faces, looks, strict=True)):
            for tr in self.live:
                last = tr.boxes[-1]
                overlap = iou(last, face.box)
                sim = similarity(tr.look, look) if tr.look is not None else 0.0
                if overlap >= self.min_iou:
                    pairs.append((1.0 + overlap + 0.5 * sim, fi, tr))
                else:
                    w = max(1.0, last[2] - last[0])
                    c0 = np.array([(last[0] + last[2]) / 2, (last[1] + last[3]) / 2])
                    c1 = np.array([(face.box[0] + face.box[2]) / 2, (face.box[1] + face.box[3]) / 2])
                    if np.linalg.norm(c1 - c0) <= 1.5 * w and sim >= self.min_look:
                        pairs.append((sim, fi, tr))
        used_f: set[int] = set()
        used_t: set[int] = set()
        for _, fi, tr in sorted(pairs, key=lambda p: -p[0]):
            if fi in used_f or tr.id in used_t:
                continue
            tr.add(t, faces[fi], looks[fi], si)
            used_f.add(fi)
            used_t.add(tr.id)
        for fi, face in enumerate(faces):
            if fi not in used_f:
                tr = Track(len(self.tracks))
                tr.add(t, face, looks[fi], si)
                self.tracks.append(tr)
                self.live.append(tr)

    def finish(self, min_detections: int = 2) -> list[Track]:
        """The tracks with at least ``min_detections`` detections (flickering false positives dropped)."""
        return [tr for tr in self.tracks if len(tr.frames) >= min_detections]


def link_tracks(
    detections: list[tuple[int, list[Face], list[np.ndarray]]], *, max_miss: int, min_detections: int = 2
) -> list[Track]:
    """All detections ``[(frame, faces, their appearance)]`` of a shot through one `Tracker`."""
    tracker = Tracker(max_miss)
    for t, faces, looks in detections:
        tracker.update(t, faces, looks)
    return tracker.finish(min_detections)


__all__ = ["Track", "Tracker", "appearance", "iou", "link_tracks", "similarity"]
