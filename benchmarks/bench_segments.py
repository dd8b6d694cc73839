"""Per-shot segment encode vs one pass (issue 27 item 2), on the CPU: the sample film's shots as
lossless intermediates (copied through), then the deliverable assembled (default web profile) three
ways, each the median of `--repeats` runs:

* ``one pass``: `encode.per_shot: false`, the whole film encoded in one x264 pass;
* ``segments, all new``: every shot encoded as its own closed-GOP segment, then joined by stream copy;
* ``segments, one edit``: one shot's segment removed (as after a one-shot edit), the others reused.

    PYTHONPATH=. python benchmarks/bench_segments.py [--film data/sample_film.mp4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tasks.config.pipeline import load_config
from tasks.media.assemble import AudioSource, assemble
from tasks.media.intermediates import record_written
from tasks.media.probe import probe
from tasks.media.segments import SEGMENT_DIR
from tasks.render.shot import _copy_through
from tasks.timeline.plan import plan_shot
from tasks.timeline.shots import detect_shots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--film", default="data/sample_film.mp4")
    ap.add_argument("--audio", default="data/sample_dub.wav")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config()
    info = probe(args.film)
    shots = detect_shots(info, cfg.shots).shots
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        paths, records = [], []
        for s in shots:
            p = work / f"shot_{s.index:04d}.mkv"
            _copy_through(info, plan_shot(s, info.fps, cfg.plan), p)
            paths.append(str(p))
            records.append(record_written(p, s.end_frame - s.start_frame))
        audio = AudioSource(args.audio, pad=True)

        def run(per_shot: bool, drop: int | None) -> float:
            enc = load_config(overrides=[f"encode.per_shot={str(per_shot).lower()}"]).encode
            if drop is not None:
                segs = sorted((work / "w" / SEGMENT_DIR).glob("*.mov"))
                segs[drop].unlink()
            t0 = time.perf_counter()
            assemble(info, paths, work / "out.mp4", enc, audio=audio, workdir=work / "w", records=records)
            return time.perf_counter() - t0

        rows = {}
        rows["one pass"] = [run(False, None) for _ in range(args.repeats)]
        new = []
        for _ in range(args.repeats):
            shutil.rmtree(work / "w" / SEGMENT_DIR, ignore_errors=True)
            new.append(run(True, None))
        rows["segments, all new"] = new
        rows["segments, one edit"] = [run(True, len(shots) // 2) for _ in range(args.repeats)]
    print(f"{args.film}: {info.frame_count} frames {info.width}x{info.height}, {len(shots)} shots, "
          f"median of {args.repeats}")  # fmt: skip
    base = statistics.median(rows["one pass"])
    for name, times in rows.items():
        med = statistics.median(times)
        print(f"  {name:20s} {med:6.2f} s  ({med / base:4.2f}x one pass)")


if __name__ == "__main__":
    main()
