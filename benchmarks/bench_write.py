"""The render's writer stage on the CPU: one chunk of rendered frames into a shot intermediate, as the
writer thread does it behind the model (`tasks.media.frames.write_rendered`: the source decoded in its own
format, the changed pixels pasted in (`tasks.media.native.paste_changed`), FFV1, then the segment's check
`record_written`). On the H200 this stage must keep up with the model (a fast-preset chunk of 72 new frames
takes ~11 s there): the smoke of 2026-12-02 spent 24.6 s (720p full frame) and 34.7 s (1080p face) of it
per 10 s shot and left the writer 1-2 chunks behind at the end of the shot.

Cases: the 720p moving test pattern with every pixel changed (the smoke's full-frame run) and the 1080p
real talking head (`benchmarks/smoke_real.py`'s shot) with a face-sized box changed (region mode). The
"rendered" frames are the source's RGB with the box's values moved by one (what the backend returns is
not what is measured here). Prints ms per frame, the median of `--repeats`. `--busy`: a pure-Python loop
spins in another thread meanwhile, as the model loop does on the GPU host (compiled-graph launches and the
sampler's Python hold the GIL), so what the writer does in Python rather than inside numpy shows.

    PYTHONPATH=. python benchmarks/bench_write.py [--frames 72] [--repeats 3] [--busy]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_shot import make_shot
from smoke_real import make_real_shot

from tasks.media.frames import NativeFrames, iter_frames, write_rendered
from tasks.media.intermediates import record_written
from tasks.media.probe import probe

log = logging.getLogger("bench_write")


def one_chunk(src: Path, box: tuple[int, int, int, int] | None, frames: int, seg: Path) -> float:
    """Seconds to write `frames` rendered frames of `src` (`box` (y0, y1, x0, x1) changed, else all)."""
    info = probe(src)
    rgb = np.stack(list(iter_frames(info, 0, frames)))  # (T, H, W, 3)
    rendered = rgb ^ 1 if box is None else rgb.copy()
    if box is not None:
        y0, y1, x0, x1 = box
        rendered[:, y0:y1, x0:x1] ^= 1
    src_frames = NativeFrames(info, frames)
    t0 = time.perf_counter()
    write_rendered(seg, info, rendered, rgb, src_frames, 0)
    record_written(seg, frames)
    dt = time.perf_counter() - t0
    src_frames.close()
    seg.unlink()
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=72, help="frames per chunk (a middle chunk's new frames)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", action="store_true", help="a GIL-holding Python thread runs beside")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    seconds = args.frames / 24 + 0.5
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_shot(work / "pattern.mp4", seconds, (1280, 720), 24)
        make_real_shot(work / "real.mp4", seconds, (1920, 1080))
        cases = [
            ("720p test pattern, full frame", work / "pattern.mp4", None),
            ("1080p talking head, face box 520x400", work / "real.mp4", (300, 820, 760, 1160)),
        ]
        stop = threading.Event()
        if args.busy:
            threading.Thread(target=_spin, args=(stop,), daemon=True).start()
        for name, src, box in cases:
            runs = [one_chunk(src, box, args.frames, work / "seg.mkv") for _ in range(args.repeats)]
            med = statistics.median(runs)
            log.info("%s: %.1f ms/frame (%d frames in %.2f s, median of %d)", name, med / args.frames * 1e3,
                     args.frames, med, args.repeats)  # fmt: skip
        stop.set()
    return 0


def _spin(stop: threading.Event) -> None:
    """Pure-Python work that holds the GIL between its bytecodes (switch interval 5 ms)."""
    n = 0
    while not stop.is_set():
        for i in range(10_000):
            n += i


if __name__ == "__main__":
    sys.exit(main())
