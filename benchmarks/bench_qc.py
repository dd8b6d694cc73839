"""A dubbed shot's QC artefacts (`tasks.render.shot_qc.write_shot_qc`: the side-by-side preview with the dub
audio and the contact sheet), which the GPU worker writes after the shot's last chunk while the GPU waits.
The 1080p real talking head of `benchmarks/smoke_real.py` (7 s at 23.976 fps, as the film run's shots) and
its lossless FFV1 intermediate stand for the source and the rendered shot. Prints the wall and the
process's Python CPU seconds, the median of `--repeats`.

    PYTHONPATH=. python benchmarks/bench_qc.py [--seconds 7] [--repeats 3]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from smoke_real import make_real_shot

from tasks.config.pipeline import load_config
from tasks.media import ffmpeg
from tasks.media.probe import probe
from tasks.render.shot_qc import write_shot_qc
from tasks.timeline.plan import plan_shot
from tasks.timeline.shots import Shot

log = logging.getLogger("bench_qc")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=7.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = make_real_shot(work / "shot.mp4", args.seconds)
        info = probe(src)
        rendered = work / "rendered.mkv"
        ffmpeg.run(["-v", "error", "-y", "-i", str(src), "-c:v", "ffv1", "-level", "3", "-f", "matroska",
                    str(rendered)], path=rendered)  # fmt: skip
        plan = plan_shot(Shot(0, 0, info.frame_count), info.fps, load_config().plan)
        audio = np.zeros((round(info.video_duration_s * 16000) + 16000, 1), np.float32)
        walls, cpus = [], []
        for r in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            write_shot_qc(info, plan, rendered, work / f"qc{r}", audio, 16000, load_config().qc.height)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
        log.info("%dx%d, %d frames: QC wall %.2f s (runs %s), Python CPU %.2f s (median of %d)", info.width,
                 info.height, info.frame_count, statistics.median(walls), [round(w, 2) for w in walls],
                 statistics.median(cpus), args.repeats)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
