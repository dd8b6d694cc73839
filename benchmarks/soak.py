"""Film-scale soak: a synthetic film with a cut every few seconds, dubbed through the real local stack.

A 23.976 fps film of `--shots` shots (`--shot-s` seconds each; the full soak is 1,800 shots x 4 s =
2 hours) at a small size is synthesised (one flat textured colour per shot, a keyframe at every cut)
with a dialogue track of the same length. The project's stack (`scripts/stack.sh` via tests/stack.py:
Prefect server, cpu-pool + gpu-pool, deployments, one cpu worker, `--workers` gpu workers on the CPU)
runs `prefect deployment run dub-film/default --watch` on it with the passthrough backend (no model,
no QC), so what is measured is orchestration: wall time, overhead per shot (a shot task run's wall
time minus the renderer's own seconds from attempts.jsonl), the Prefect server's peak memory, the
SQLite database size, and how long the film run's page data takes to load (the API calls the UI
makes for it: no Chromium on the measuring host).
A second run of the same film (everything cached) is timed too. Results: JSON on stdout / `--json`.
`--postgres`: the server runs on PostgreSQL instead (`scripts/stack.sh team`: a private cluster started
and stopped by the run; the gpu workers by `stack.sh workers`); the database size is then PostgreSQL's.

    python benchmarks/soak.py --shots 200 --json /tmp/soak200.json
    python benchmarks/soak.py --shots 1800 --shot-s 4 --timeout 14400     # the 2-hour film
    python benchmarks/soak.py --shots 200 --postgres --json /tmp/soak200-pg.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from tasks.media.ffmpeg import ffmpeg_exe  # noqa: E402
from tests.media import _PALETTE  # noqa: E402 (distinct colours: every cut is a hard cut)
from tests.stack import Stack, free_port, running_stack  # noqa: E402

FPS = Fraction(24000, 1001)


def make_film(path: Path, shots: int, shot_s: float, size: tuple[int, int], seed: int = 0) -> int:
    """Encode the synthetic film (streamed to ffmpeg shot by shot); returns its frame count."""
    w, h = size
    per_shot = round(shot_s * FPS)
    rng = np.random.default_rng(seed)
    cmd = [ffmpeg_exe(), "-nostdin", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-s", f"{w}x{h}", "-framerate", str(FPS), "-i", "-", "-c:v", "libx264", "-preset", "ultrafast",
           "-crf", "23", "-g", str(per_shot), "-pix_fmt", "yuv420p", str(path)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
    try:
        for i in range(shots):
            base = np.array(_PALETTE[i % len(_PALETTE)]) + rng.integers(
                -15, 15, 3
            )  # neighbours differ: a hard cut
            tex = rng.integers(-20, 20, (h, w, 1))
            frame = np.clip(base + tex, 0, 255).astype(np.uint8)
            proc.stdin.write(frame.tobytes() * per_shot)
        proc.stdin.close()
        if proc.wait() != 0:
            raise RuntimeError("ffmpeg failed to encode the soak film")
    finally:
        proc.kill()
    return shots * per_shot


def make_dub(path: Path, frames: int) -> None:
    seconds = float(frames / FPS)
    subprocess.run(
        [ffmpeg_exe(), "-nostdin", "-v", "error", "-y", "-f", "lavfi", "-i",
         f"sine=frequency=220:sample_rate=16000:duration={seconds:.6f}", "-ac", "1", str(path)],
        check=True,
    )  # fmt: skip


class RssSampler(threading.Thread):
    """Peak resident memory (MiB) of a process and its children, sampled every `every_s`."""

    def __init__(self, pid: int, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.peak_mib, self._halt = pid, every_s, 0.0, threading.Event()

    def _tree(self) -> list[int]:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.pid)], capture_output=True, text=True)
        return [self.pid, *(int(p) for p in out.stdout.split())]

    def run(self) -> None:
        while not self._halt.is_set():
            total = 0
            for pid in self._tree():
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
                except OSError:
                    pass
            self.peak_mib = max(self.peak_mib, total / 1024)
            self._halt.wait(self.every_s)

    def stop(self) -> float:
        self._halt.set()
        self.join()
        return round(self.peak_mib, 1)


def shot_overheads(stack: Stack, ws_root: Path, film_run_id: str) -> dict[str, Any]:
    """Per shot task run: wall time minus the renderer's own seconds (attempts.jsonl)."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterName,
    )

    render_s: dict[int, float] = {}
    for attempts in ws_root.glob("*/attempts.jsonl"):
        for line in attempts.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("status") == "done":
                render_s[int(rec["shot"])] = float(rec["seconds"])
    with stack.client() as client:
        runs, offset = [], 0
        while True:
            page = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="shot-")),
                                         limit=200, offset=offset)  # fmt: skip
            runs += page
            offset += len(page)
            if len(page) < 200:
                break
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[film_run_id]))
        )
    overhead = [
        (r.end_time - r.start_time).total_seconds() - render_s[int(r.name[5:9])]
        for r in runs
        if r.end_time and r.start_time and r.name[5:9].isdigit() and int(r.name[5:9]) in render_s
    ]
    if not overhead:
        return {"shot_task_runs": len(runs)}
    return {
        "shot_task_runs": len(runs),
        "group_child_runs": len(children),
        "render_s_sum": round(sum(render_s.values()), 1),
        "overhead_per_shot_s": {
            "median": round(statistics.median(overhead), 3),
            "p95": round(sorted(overhead)[int(0.95 * (len(overhead) - 1))], 3),
            "max": round(max(overhead), 3),
        },
    }


def page_load(stack: Stack, film_run_id: str) -> dict[str, float]:
    """Seconds of the API calls the UI's flow-run page makes for the film run (run, graph, children, logs)."""
    import httpx

    api = stack.api_url.rstrip("/")
    calls = {
        "flow_run": ("GET", f"/flow_runs/{film_run_id}", None),
        "graph_v2": ("GET", f"/flow_runs/{film_run_id}/graph-v2", None),
        "task_runs": ("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [film_run_id]}}, "limit": 200}),
        "child_runs": ("POST", "/flow_runs/filter",
                       {"flow_runs": {"parent_flow_run_id": {"any_": [film_run_id]}}, "limit": 200}),
        "logs": ("POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [film_run_id]}}, "limit": 200}),
        "artifacts": ("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [film_run_id]}}}),
    }  # fmt: skip
    out = {}
    with httpx.Client(timeout=120) as client:
        for name, (method, path, body) in calls.items():
            t0 = time.perf_counter()
            client.request(method, api + path, json=body).raise_for_status()
            out[name] = round(time.perf_counter() - t0, 3)
    out["total"] = round(sum(out.values()), 3)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="dubflow-soak-", dir=args.base))
    film, dub, out = base / "soak.mp4", base / "soak-dub.wav", base / "out" / "soak.dubbed.mp4"
    t0 = time.monotonic()
    frames = make_film(film, args.shots, args.shot_s, tuple(int(v) for v in args.size.split("x")))
    make_dub(dub, frames)
    result: dict[str, Any] = {
        "shots": args.shots, "frames": frames, "film_s": round(float(frames / FPS), 1), "size": args.size,
        "workers": args.workers, "synthesis_s": round(time.monotonic() - t0, 1),
    }  # fmt: skip
    env = {"DUBFLOW_OUTPUT_ROOTS": str(base), "DUBFLOW_SERVER_TIMEOUT_S": "600"}  # a loaded box starts slowly
    pg_dir = None
    if args.postgres:  # the cluster's owner (`postgres` when run as root) must reach its folder
        pg_dir = Path(tempfile.mkdtemp(prefix="dubflow-soak-pg-"))
        pg_dir.chmod(0o755)
        env |= {"DUBFLOW_PG_DIR": str(pg_dir), "DUBFLOW_PG_PORT": str(free_port())}
    command = "team" if args.postgres else "start"
    try:
        with running_stack(
            base, n_gpu_workers=args.workers, env=env, command=command, start_timeout=900
        ) as stack:
            if args.postgres:
                stack.sh("workers")
            _soak(stack, args, result, film, dub, out, pg_dir)
    finally:
        if pg_dir is not None:
            shutil.rmtree(pg_dir, ignore_errors=True)
    if not args.keep:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return result


def database_mib(stack: Stack, pg_dir: Path | None) -> dict[str, float]:
    """The Prefect database's size: the SQLite files, or PostgreSQL's `pg_database_size`."""
    if pg_dir is None:
        db = list(stack.home.glob("prefect.db*"))
        return {"sqlite_mib": round(sum(p.stat().st_size for p in db) / 2**20, 1)}
    env = {**os.environ, "PGPASSWORD": (pg_dir / "password").read_text().strip()}
    query = "select pg_database_size('prefect')"
    size = subprocess.run(["psql", "-X", "-tA", "-h", "127.0.0.1", "-p", stack.env["DUBFLOW_PG_PORT"],
                           "-U", "prefect", "-d", "prefect", "-c", query],
                          env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {"postgres_mib": round(int(size) / 2**20, 1)}


def _soak(stack: Stack, args: argparse.Namespace, result: dict[str, Any], film: Path, dub: Path, out: Path,
          pg_dir: Path | None) -> None:  # fmt: skip
    """The measured part: two deployment runs of the film on a running stack; fills `result`."""
    config = {"backend": {"name": "passthrough"}, "qc": {"enabled": False},
              "encode": {"preset": "ultrafast"}, "shots": {"detect_width": 64}}  # fmt: skip
    server = stack.pid_files().get("server")
    sampler = RssSampler(server) if server else None
    if sampler:
        sampler.start()
    params = {"source": str(film), "audio": str(dub), "out": str(out), "config": config}
    first = stack.run_deployment("dub-film/default", params, timeout=args.timeout)
    result["first_run"] = {"rc": first.rc, "wall_s": round(first.wall_s, 1)}
    if first.rc != 0:
        result["first_run"]["tail"] = first.output[-3000:]
        return
    result |= shot_overheads(stack, stack.workspace, first.flow_run_id)
    result["per_shot_wall_s"] = round(first.wall_s / max(1, result.get("shot_task_runs", 0)), 3)
    again = stack.run_deployment("dub-film/default", params, timeout=args.timeout)
    result["cached_rerun"] = {"rc": again.rc, "wall_s": round(again.wall_s, 1)}
    if again.rc != 0:
        result["cached_rerun"]["tail"] = again.output[-3000:]
    result["server_peak_rss_mib"] = sampler.stop() if sampler else None
    result |= database_mib(stack, pg_dir)
    result["film_run_page_api_s"] = page_load(stack, first.flow_run_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shots", type=int, default=200)
    parser.add_argument("--shot-s", type=float, default=4.0, help="seconds per shot (a cut every ~4 s)")
    parser.add_argument("--size", default="64x36", help="frame size WxH (even)")
    parser.add_argument("--workers", type=int, default=2, help="gpu-pool workers (on the CPU)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per deployment run")
    parser.add_argument("--base", default=None, help="folder for the temporary film, stack and workspace")
    parser.add_argument("--keep", action="store_true", help="keep the film, workspace and Prefect home")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--postgres", action="store_true", help="the server on PostgreSQL (stack.sh team)")
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if result.get("first_run", {}).get("rc") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
