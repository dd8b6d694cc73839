"""The local command's start: seconds from `dubflow dub` (default mode: Prefect with a temporary server) to its
first line of flow work (the film's probe), and to the end, on the sample film as a dry run (passthrough).

Runs each source tree given (`--tree NAME=PATH`, e.g. a checkout of main and this one) `--repeats` times,
alternating, with a fresh workspace and a warm `PREFECT_HOME` (its database migrated by untimed runs
first), and prints the median per tree and the ratios, so both are measured on the same box in one run.

    python benchmarks/bench_local_start.py --tree main=/tmp/main-src --tree branch=. --repeats 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIRST_LINE = "288 frames at"  # the probe task's line: the flow is running


def one_run(tree: Path, home: Path, scratch: Path) -> tuple[float, float]:
    """(seconds to the first flow line, seconds to the end) of one dry run from `tree`."""
    ws, out = scratch / "ws", scratch / "out" / "film.mp4"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(home), "DUBFLOW_WORKSPACE_ROOTS": str(scratch), "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "flows.cli", "dub", str(REPO / "data" / "sample_film.mp4"),
           "--audio", str(REPO / "data" / "sample_dub.wav"), "--out", str(out), "--backend", "passthrough",
           "--set", f"workspace.root={ws}"]  # fmt: skip
    t0 = time.monotonic()
    first: list[float] = []
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if not first and FIRST_LINE in line:
                first.append(time.monotonic() - t0)

    reader = threading.Thread(target=read)
    reader.start()
    rc = proc.wait()
    reader.join()
    if rc != 0 or not first:
        raise SystemExit(f"{tree}: exit {rc}, first line {'seen' if first else 'never seen'}")
    return first[0], time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = {n: Path(p).resolve() for n, p in (t.split("=", 1) for t in args.tree)}
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in trees}
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        home = Path(tmp) / "prefect"
        # untimed: migrate the database, warm the file cache (last tree first: main's temporary server, on
        # Prefect's 20 s start timeout, may time out while a fresh database migrates on a busy box)
        for name, tree in reversed(trees.items()):
            try:
                one_run(tree, home, Path(tmp) / "warm" / name)
            except SystemExit as exc:
                print(f"warm-up of {name}: {exc}")
        for _ in range(args.repeats):
            for name, tree in trees.items():
                results[name].append(one_run(tree, home, Path(tmp) / "run" / name))
                print(
                    f"{name}: first flow line {results[name][-1][0]:.1f} s, end {results[name][-1][1]:.1f} s"
                )
    medians = {
        n: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
        for n, rs in results.items()
    }
    base = next(iter(medians))
    for name, (first, end) in medians.items():
        print(
            f"{name}: median first flow line {first:.1f} s ({first / medians[base][0]:.2f}x {base}), "
            f"median end {end:.1f} s ({end / medians[base][1]:.2f}x {base}), {args.repeats} runs"
        )


if __name__ == "__main__":
    main()
