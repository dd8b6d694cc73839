"""Face detection on film frames: YuNet (libfacedetection, BSD-3) compiled into the `yuface` wheel.

Holds `Face` (a box, a confidence and five landmarks, in the pixels of the image it was found in) and
`FaceDetector`, which runs YuNet on one RGB frame.  YuNet finds frontal to profile faces down to about
12 px; it needs BGR input of at most 960 px a side, so callers pass analysis-size frames (see
`tasks.shot_faces`).  The wheel bundles its own OpenMP runtime, which by default spins one thread per core:
the detector pins it to one thread (several thread pools on a small machine slow everything down).
Must not decode media, track or decide anything.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAX_SIDE = 960  # YuNet's documented input limit in the yuface wheel


@dataclass(frozen=True)
class Face:
    """One detected face: box (x0, y0, x1, y1) and landmarks in the detection image's pixels."""

    box: tuple[float, float, float, float]
    score: float  # 0..1
    landmarks: np.ndarray  # (5, 2): right eye, left eye, nose tip, right mouth corner, left mouth corner

    @property
    def width(self) -> float:
        return self.box[2] - self.box[0]

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]


class _OneOmpThread:
    """Run a block with every loaded OpenMP runtime at one thread, restoring each one's setting after.

    YuNet's parallel regions go to whichever libgomp was loaded first process-wide (torch's own when torch
    is imported before `yuface`), so all loaded copies are pinned; the setting is per calling thread.
    """

    def __init__(self, module_file: str) -> None:
        paths = {
            str(p) for p in (Path(module_file).resolve().parents[1] / "yuface.libs").glob("libgomp*.so*")
        }
        try:
            with open("/proc/self/maps") as fh:
                paths |= {line.split()[-1] for line in fh if "libgomp" in line and "/" in line}
        except OSError:  # not Linux: the bundled runtime only
            pass
        self._libs = []
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
                self._libs.append((lib.omp_get_max_threads, lib.omp_set_num_threads))
            except (OSError, AttributeError) as ex:
                log.debug("cannot set the thread count of %s: %s", path, ex)
        self._saved: list[int] = []

    def __enter__(self) -> None:
        self._saved = [get() for get, _ in self._libs]
        for _, set_n in self._libs:
            set_n(1)

    def __exit__(self, *exc: object) -> None:
        for (_, set_n), n in zip(self._libs, self._saved, strict=True):
            set_n(n)


class FaceDetector:
    """YuNet on RGB uint8 frames; boxes below ``min_side`` pixels (short side) or ``threshold`` are dropped."""

    def __init__(self, threshold: float, min_side: float) -> None:
        import yuface  # noqa: PLC0415

        self._one_thread = _OneOmpThread(yuface.__file__)
        self._detect = yuface.c_detect  # raw (N, 15) int rows: conf%, x, y, w, h, 5 x (x, y), unused
        self.threshold = threshold
        self.min_side = min_side

    def __call__(self, frame: np.ndarray) -> list[Face]:
        """Faces in one (H, W, 3) uint8 RGB frame, best first."""
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(
                f"face detection needs an (H, W, 3) uint8 frame, got {frame.shape} {frame.dtype}"
            )
        if max(frame.shape[:2]) > MAX_SIDE:
            raise ValueError(
                f"face detection frames must be at most {MAX_SIDE} px a side, got {frame.shape[:2]}"
            )
        with self._one_thread:
            rows = np.asarray(self._detect(np.ascontiguousarray(frame[..., ::-1])), dtype=np.float64)  # BGR
        faces = []
        for r in rows.reshape(-1, rows.shape[-1] if rows.size else 15):
            score = r[0] / 100.0
            x, y, w, h = r[1:5]
            if score < self.threshold or min(w, h) < self.min_side:
                continue
            faces.append(Face((x, y, x + w, y + h), float(score), r[5:15].reshape(5, 2).astype(np.float32)))
        return sorted(faces, key=lambda f: -f.score)


__all__ = ["MAX_SIDE", "Face", "FaceDetector"]
