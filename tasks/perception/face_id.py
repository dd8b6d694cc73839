"""Face identity embeddings: dlib's ResNet face model on faces aligned by dlib's 5-point landmark model.

Holds the model file lookup (both `.dat` files come in the `face-recognition-models` sdist, CC0; its
68-point model is non-commercial and never loaded; the package imports `pkg_resources`, which current
setuptools lacks, so it is located with `importlib.util.find_spec` and never imported), the one
per-process model holder (`_MODELS`, the documented holder: the models are read-only after loading),
`embed` (128-D descriptors of face boxes in one RGB frame), `track_embeddings` (a shot decoded once at
analysis size, a few detections of each moving track embedded) and `still_embeddings` (a reference
still: its largest face, or a one-line error naming the file).
Must not link tracks into characters (`tasks.decision.characters`) nor decide anything.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path

import cv2
import numpy as np

from tasks.errors import MediaError
from tasks.media.probe import VideoInfo
from tasks.perception.face_analysis import ShotFaces, display_frames
from tasks.perception.faces import FaceDetector

log = logging.getLogger(__name__)

RESNET = "dlib_face_recognition_resnet_model_v1.dat"
ALIGNER = "shape_predictor_5_face_landmarks.dat"  # never the 68-point model (iBUG 300-W: non-commercial)
MIN_SIDE = 32  # faces smaller than this (pixels of the frame embedded) are not embedded: too few pixels
MODEL_ID = f"dlib-resnet-v1+5pt@{MIN_SIDE}"  # names the embeddings in cache keys

_MODELS: dict[str, object] = {}  # {"aligner": dlib.shape_predictor, "net": dlib.face_recognition_model_v1}
_LOCK = threading.Lock()


def model_file(name: str) -> Path:
    """`name` inside the installed face-recognition-models package (found without importing it)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("face-recognition-models is not installed: pip install face-recognition-models")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / name
    if not path.is_file():
        raise RuntimeError(f"{path}: model file missing from the face-recognition-models package")
    return path


def _models() -> tuple[object, object]:
    with _LOCK:
        if not _MODELS:
            import dlib

            _MODELS["aligner"] = dlib.shape_predictor(str(model_file(ALIGNER)))
            _MODELS["net"] = dlib.face_recognition_model_v1(str(model_file(RESNET)))
        return _MODELS["aligner"], _MODELS["net"]


def embed(frame: np.ndarray, boxes: list[tuple[float, float, float, float]]) -> np.ndarray:
    """(len(boxes), 128) descriptors of the faces at ``boxes`` (x0, y0, x1, y1) in RGB uint8 ``frame``."""
    import dlib

    aligner, net = _models()
    img = np.ascontiguousarray(frame, dtype=np.uint8)
    out = np.zeros((len(boxes), 128))
    for k, (x0, y0, x1, y1) in enumerate(boxes):
        shape = aligner(img, dlib.rectangle(int(x0), int(y0), int(x1), int(y1)))
        out[k] = np.asarray(net.compute_face_descriptor(img, shape))
    return out


def _picks(frames: tuple[int, ...], n: int) -> list[int]:
    """Indices of up to ``n`` detections spread evenly over a track."""
    if len(frames) <= n:
        return list(range(len(frames)))
    return sorted({round(i) for i in np.linspace(0, len(frames) - 1, n)})


def track_embeddings(
    info: VideoInfo, start: int, end: int, faces: ShotFaces, n: int
) -> dict[int, np.ndarray]:
    """{track id: (k, 128)} for the moving tracks of film frames [start, end), ``n`` faces each at most
    (k < n where faces are smaller than `MIN_SIDE` analysis pixels; still pictures are not embedded)."""
    hw = faces.analysis_hw
    sy, sx = hw[0] / faces.display_hw[0], hw[1] / faces.display_hw[1]
    wanted: dict[int, list[tuple[int, tuple[float, ...]]]] = {}  # frame -> [(track, analysis box)]
    for tr in faces.tracks:
        if tr.still:
            continue
        for i in _picks(tr.frames, n):
            x0, y0, x1, y1 = tr.boxes[i]
            box = (x0 * sx, y0 * sy, x1 * sx, y1 * sy)
            if min(box[2] - box[0], box[3] - box[1]) >= MIN_SIDE:
                wanted.setdefault(tr.frames[i], []).append((tr.id, box))
    out: dict[int, list[np.ndarray]] = {tr.id: [] for tr in faces.tracks if not tr.still}
    if wanted:
        last = max(wanted)
        for t, frame in enumerate(display_frames(info, start, start + last + 1, hw)):
            if t in wanted:
                ids = [k for k, _ in wanted[t]]
                for k, e in zip(ids, embed(frame, [b for _, b in wanted[t]]), strict=True):
                    out[k].append(e)
    return {k: np.array(v).reshape(-1, 128) for k, v in out.items()}


def still_embeddings(path: str | Path) -> np.ndarray:
    """(1, 128): the largest face of a reference still (any image ffmpeg or OpenCV reads)."""

    p = Path(path)
    if not p.is_file():
        raise MediaError(p, "cast still not found")
    bgr = cv2.imread(str(p), cv2.IMREAD_COLOR)
    if bgr is None:
        raise MediaError(p, "cannot read the cast still as an image")
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    scale = min(1.0, 960 / max(rgb.shape[:2]))  # the detector takes <= 960 px
    if scale < 1.0:
        rgb = cv2.resize(rgb, (round(rgb.shape[1] * scale), round(rgb.shape[0] * scale)), cv2.INTER_AREA)
    found = FaceDetector(0.6, MIN_SIDE)(rgb)
    if not found:
        raise MediaError(p, f"no face found in the cast still (faces need >= {MIN_SIDE} px)")
    face = max(found, key=lambda f: f.width * f.height)
    return embed(rgb, [face.box])


__all__ = ["MODEL_ID", "embed", "model_file", "still_embeddings", "track_embeddings"]
