"""Fault run: a film through the real local stack while the Prefect server restarts twice and a GPU
worker is SIGKILLed once; the film must complete, every shot be rendered exactly once, and the output's
frames equal a clean run's.

The soak film (`benchmarks/soak.py`: `--shots` flat textured shots, a cut every `--shot-s` seconds)
is dubbed with the passthrough backend (a dry run: orchestration only) by `prefect deployment run
dub-film/default` on the project's stack (server, pools, deployments, one cpu worker, `--workers` gpu
workers on the CPU, tests/stack.py), with heartbeats every 30 s and the heartbeat watch at
`--lost-run-s`. While it renders: at `--restart-at` seconds (after the first shot is done) the
server is stopped (SIGTERM) and started again after `--outage-s`, twice; at `--kill-at` one gpu
worker's process group (the worker and the group run it started: a lost host) gets SIGKILL. Then:
  * the film run's exit code (0 expected);
  * attempts.jsonl: each shot's number of "done" attempts (exactly 1 expected) and "failed" ones (0);
  * the output's per-frame MD5s against a clean, fault-free run of the same film (`dub_film_inline`,
    its own workspace): equal expected.
JSON on stdout / `--json`; exit status 0 only when all three hold.

    python benchmarks/fault_run.py --shots 200 --json /tmp/fault200.json       # the full fault run
    python benchmarks/fault_run.py --shots 40 --shot-s 2                        # a small one
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from benchmarks.soak import make_dub, make_film  # noqa: E402
from tasks.media.ffmpeg import ffmpeg_exe  # noqa: E402
from tests.stack import Stack, running_stack  # noqa: E402

CONFIG = {"backend": {"name": "passthrough"}, "qc": {"enabled": False},
          "encode": {"preset": "ultrafast"}, "shots": {"detect_width": 64}}  # fmt: skip


def frame_md5s(path: Path) -> list[str]:
    """Per-frame MD5 of the decoded picture (ffmpeg's framemd5 muxer), streamed."""
    out = subprocess.run([ffmpeg_exe(), "-nostdin", "-v", "error", "-i", str(path), "-map", "0:v:0",
                          "-f", "framemd5", "-"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [line.rsplit(",", 1)[1].strip() for line in out.splitlines() if line and not line.startswith("#")]


def attempts(ws_root: Path) -> dict[str, dict[int, int]]:
    """{status: {shot: count}} over every workspace's attempts.jsonl under `ws_root`."""
    counts: dict[str, dict[int, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
    for path in ws_root.glob("*/attempts.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                counts[record["status"]][record["shot"]] += 1
    return counts


def film_shots(ws_root: Path) -> int | None:
    """The number of shots the film run detected (its workspace's `shots-*.json`): the soak film's
    flat shots can detect as fewer than `--shots` when two neighbouring textures are alike."""
    for path in ws_root.glob("*/shots-*.json"):
        data = json.loads(path.read_text())
        return len(data.get("body", data)["shots"])  # bound to its film since issue 47 (`body`)
    return None


def run_and_wait(stack: Stack, params: dict[str, Any], timeout_s: float) -> str:
    """Start a dub-film/default run (no `--watch`: its event stream does not survive a server restart)
    and poll its state through the API, riding out the restarts; its final state type and message."""
    args = ["deployment", "run", "dub-film/default"]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    proc = stack.prefect(*args)
    match = re.search(r"UUID: ([0-9a-f-]{36})", proc.stdout + proc.stderr)
    if not match:
        raise RuntimeError(f"no flow run id in: {proc.stdout + proc.stderr}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with stack.client() as client:
                state = client.read_flow_run(match.group(1)).state
            if state is not None and state.is_final():
                return f"{state.type.name}: {state.message or ''}"
        except Exception:  # the server is restarting
            pass
        time.sleep(3)
    return "TIMEOUT"


def _started(ws_root: Path, timeout_s: float = 1800) -> float:
    """Wait until the first shot is done (the film is rendering); the monotonic time then."""
    deadline = time.monotonic() + timeout_s
    while not attempts(ws_root).get("done") and time.monotonic() < deadline:
        time.sleep(0.5)
    return time.monotonic()


def _restart_server(stack: Stack, outage_s: float, log: list[dict[str, Any]]) -> None:
    """SIGTERM the server, keep it down `outage_s`, start it again with the same command line (its
    pid file updated, so the stack's teardown stops the new one)."""
    (pid_file,) = stack.home.glob("run/*/server.pid")
    pid = int(pid_file.read_text())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while _alive(pid) and time.monotonic() - t0 < 60:
        time.sleep(0.2)
    time.sleep(max(0.0, outage_s - (time.monotonic() - t0)))
    (log_file,) = stack.home.glob("logs/*/server.log")
    with log_file.open("ab") as sink:
        proc = subprocess.Popen([a.decode() for a in argv], cwd=stack.project, env=stack.env, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    pid_file.write_text(f"{proc.pid}\n")
    health = stack.api_url.rstrip("/") + "/health"
    while time.monotonic() - t0 < 600:
        try:
            with urllib.request.urlopen(health, timeout=3) as answer:
                if answer.read().strip() == b"true":
                    break
        except OSError:
            time.sleep(0.5)
    log.append({"event": "server restarted", "down_s": round(time.monotonic() - t0, 1)})


def _kill_worker(stack: Stack, log: list[dict[str, Any]]) -> None:
    gpu = sorted(name for name in stack.pid_files() if name.startswith("gpu"))
    pid = stack.pid_files()[gpu[0]]
    os.killpg(os.getpgid(pid), signal.SIGKILL)  # the worker and the flow run it started: a lost host
    log.append({"event": f"worker {gpu[0]} SIGKILLed", "pid": pid})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def faults(stack: Stack, args: argparse.Namespace, log: list[dict[str, Any]]) -> None:
    """The fault schedule, relative to the first finished shot."""
    t0 = _started(stack.workspace)
    plan = sorted([(args.restart_at, "restart"), (args.restart_at + args.restart_gap, "restart"),
                   (args.kill_at, "kill")])  # fmt: skip
    for at, what in plan:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        try:
            _restart_server(stack, args.outage_s, log) if what == "restart" else _kill_worker(stack, log)
        except Exception as exc:  # reported, the run goes on
            log.append({"event": f"{what} failed", "error": repr(exc)})


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="dubflow-fault-", dir=args.base))
    film, dub, out = base / "film.mp4", base / "film-dub.wav", base / "out" / "film.dubbed.mp4"
    frames = make_film(film, args.shots, args.shot_s, tuple(int(v) for v in args.size.split("x")))
    make_dub(dub, frames)
    result: dict[str, Any] = {
        "shots": args.shots,
        "frames": frames,
        "size": args.size,
        "workers": args.workers,
    }
    env = {"DUBFLOW_OUTPUT_ROOTS": str(base), "DUBFLOW_SERVER_TIMEOUT_S": "600",
           "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30", "DUBFLOW_LOST_RUN_S": str(args.lost_run_s)}  # fmt: skip
    events: list[dict[str, Any]] = []
    with running_stack(base, n_gpu_workers=args.workers, env=env, start_timeout=900) as stack:
        injector = threading.Thread(target=faults, args=(stack, args, events), daemon=True)
        injector.start()
        params = {"source": str(film), "audio": str(dub), "out": str(out), "config": CONFIG}
        t0 = time.monotonic()
        state = run_and_wait(stack, params, args.timeout)
        injector.join(timeout=1)
        result["film_run"] = {"state": state, "wall_s": round(time.monotonic() - t0, 1)}
        counts = attempts(stack.workspace)
        n_shots = film_shots(stack.workspace) or args.shots
    result["faults"] = events
    done, failed = counts.get("done", {}), counts.get("failed", {})
    result["renders"] = {
        "shots_detected": n_shots,
        "shots_done_once": sum(1 for i in range(n_shots) if done.get(i) == 1),
        "shots_done_more_than_once": sorted(i for i, n in done.items() if n > 1),
        "shots_never_done": sorted(set(range(n_shots)) - set(done)),
        "failed_attempts": sum(failed.values()),
    }
    if state.startswith("COMPLETED"):
        from flows.dub_film import dub_film_inline

        os.environ["DUBFLOW_OUTPUT_ROOTS"] = str(base)
        clean = dub_film_inline(str(film), str(dub), str(base / "clean.mp4"),
                                config={**CONFIG, "workspace": {"root": str(base / "clean-ws")}})  # fmt: skip
        a, b = frame_md5s(out), frame_md5s(Path(clean))
        result["frames_equal_clean_run"] = a == b and len(a) == frames
    result["ok"] = (state.startswith("COMPLETED") and result["renders"]["shots_done_once"] == n_shots
                    and not result["renders"]["failed_attempts"] and result.get("frames_equal_clean_run", False))  # fmt: skip
    if not args.keep:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shots", type=int, default=200)
    parser.add_argument("--shot-s", type=float, default=4.0, help="seconds per shot")
    parser.add_argument("--size", default="64x36", help="frame size WxH (even)")
    parser.add_argument("--workers", type=int, default=2, help="gpu-pool workers (on the CPU)")
    parser.add_argument("--restart-at", type=float, default=20.0, help="s after the first shot: 1st restart")
    parser.add_argument("--restart-gap", type=float, default=60.0, help="s between the two restarts")
    parser.add_argument("--outage-s", type=float, default=15.0, help="how long the server stays down")
    parser.add_argument(
        "--kill-at", type=float, default=45.0, help="s after the first shot: SIGKILL a worker"
    )
    parser.add_argument(
        "--lost-run-s", type=int, default=120, help="heartbeat watch window (> outage + 30 s)"
    )
    parser.add_argument("--timeout", type=float, default=7200, help="seconds for the film run")
    parser.add_argument("--base", default=None, help="folder for the temporary film, stack and workspace")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
