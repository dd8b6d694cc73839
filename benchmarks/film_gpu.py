"""A whole film through `prefect deployment run dub-film/default` on the local stack, with a GPU worker
killed mid-shot and the film resumed: the user's job end to end (issue 28).

On a GPU host without internet (the offline bundle: `scripts/device_bundle.sh`), `run`:
1. writes the real-size random weights root (`benchmarks/real_root.py`; `--tiny`: the project's TINY
   RANDOM WEIGHTS, a pipeline check on a CPU whose figures mean nothing) and the multi-shot film from the
   committed real talking heads (`benchmarks/film_make.py`: 10 shots, 64 s, 1920x1080, 23.976 fps, cuts
   between keyframes, dialogue / no-face / voice-over shots, a dub track);
2. starts the project's stack (`scripts/stack.sh` via tests/stack.py: Prefect server on SQLite, cpu-pool +
   gpu-pool, the deployments, the heartbeat watch, one cpu worker, one gpu-pool worker per GPU);
3. runs `prefect deployment run dub-film/default --watch` with the fast preset; once the kill shot's task
   run is Running and its progress artifact shows a finished chunk (a one-chunk shot: after
   `--kill-after-s`), SIGKILLs the gpu worker running it with its flow run, restarts it (`stack.sh
   workers`); the heartbeat watch marks the lost group run Crashed; the film run either runs the lost
   group again on the restarted worker (its unfinished shots only) and completes, or fails naming the
   lost shots;
4. runs the deployment again: after a failed first run only the unfinished shots render and the film is
   assembled; after a completed one nothing renders (every shot reused);
5. reads the run back through the API (film runs, group runs, the per-shot task runs, the shot table
   artifact) and the workspace (attempts.jsonl, done.json), reports the figures and runs the checks
   (`benchmarks/film_report.py`); exit 1 with a one-line reason when a check fails.

Device commands may run 10 minutes each: `start` runs `run` detached in its own process session (the
stack survives between commands while the host is held), `wait` follows it for up to `--wait-s` seconds
(exit 0 passed, 1 failed, 3 still running: call `wait` again). `report` recomputes the figures and checks
from what `run` read back (WORK/readback.json), without the stack.

    python3 benchmarks/film_gpu.py start --work /tmp/film && python3 benchmarks/film_gpu.py wait --work /tmp/film
    python benchmarks/film_gpu.py run --tiny --work /tmp/film --shots 8 --film-s 24 --size 640x360
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))
sys.path.insert(0, str(PROJECT / "benchmarks"))

from film_make import make_film  # noqa: E402
from film_report import collect, figures, render_report, run_checks, workspace_of  # noqa: E402

from tasks.run.workspace import read_attempts  # noqa: E402
from tests.stack import DeploymentRun, Stack, running_stack, stack_processes  # noqa: E402

log = logging.getLogger("film_gpu")
FILM = "dub-film/default"


def _json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def _phase(work: Path, name: str, **info: Any) -> None:
    log.info("phase: %s %s", name, info or "")
    _json(work / "status.json", {"phase": name, "time": time.time(), **info})


def film_config(args: argparse.Namespace, root: dict[str, Any]) -> dict[str, Any]:
    """The run's config over configs/default.yaml: the weights root and the fast preset, nothing else
    (`--tiny`: tiny mode on the CPU, shorter chunks so a shot has several)."""
    it: dict[str, Any] = {"weights": root["root"], "preset": "fast"}
    config: dict[str, Any] = {"infinitetalk": it}
    if args.tiny:
        it |= {"mode": "tiny", "device": "cpu"}
        config["plan"] = {"frame_num": 33, "motion_frames": 5}
    else:
        it["mode"] = "infinitetalk-480"
    return config


def gpu_count(tiny: bool) -> int:
    if tiny:
        return 1
    import torch

    return max(1, torch.cuda.device_count())


class GpuSampler(threading.Thread):
    """NVML utilisation of every GPU every `period_s` (wall-clock stamped); nothing without NVML."""

    def __init__(self, period_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.period_s, self.samples, self._halt = period_s, [], threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no GPU / no NVML: no samples
            self._nv, self._handles = None, []

    def run(self) -> None:
        while self._nv is not None and not self._halt.is_set():
            now = time.time()
            self.samples.append(
                [now, *(self._nv.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles)]
            )
            self._halt.wait(self.period_s)

    def stop(self) -> list[list[float]]:
        self._halt.set()
        if self.is_alive():
            self.join()
        return self.samples


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    return kids + [d for k in kids for d in _descendants(k)]


def _runs_flow(pid: int, flow_run_id: str) -> bool:
    with contextlib.suppress(OSError):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode() in env
    return False


def kill_worker_of(stack: Stack, group_run_id: str) -> dict[str, Any]:
    """SIGKILL the gpu worker whose descendant runs `group_run_id`, with every descendant (a lost host)."""
    for name, pid in stack.pid_files().items():
        if not name.startswith("gpu-"):
            continue
        tree = _descendants(pid)
        if any(_runs_flow(p, group_run_id) for p in tree):
            victims = [pid, *tree]
            for victim in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            return {"worker": name, "worker_pid": pid, "killed_pids": victims, "time": time.time()}
    raise RuntimeError(f"no gpu worker process runs group run {group_run_id}")


def restart_worker(stack: Stack, kill: dict[str, Any], reap_s: float = 60.0) -> str:
    """`stack.sh workers` once the killed processes are gone; the new worker's pid. A killed worker not
    yet reaped (a zombie) still answers `kill -0`: stack.sh would take it for the live worker, so its pid
    file (naming a process this script killed) is removed first."""
    deadline = time.monotonic() + reap_s
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in kill["killed_pids"]):
        time.sleep(0.2)
    for pid_file in stack.home.glob(f"run/*/{kill['worker']}.pid"):
        if pid_file.read_text().strip() == str(kill["worker_pid"]):
            pid_file.unlink()
    out = stack.sh("workers", timeout=300).stderr.strip()
    pid = stack.pid_files().get(kill["worker"])
    if pid is None or pid == kill["worker_pid"]:
        raise RuntimeError(f"{kill['worker']} was not restarted: {out}")
    return f"{kill['worker']} pid {pid}"


def _progress(client: Any, key: str) -> float | None:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return float(max(found, key=lambda a: a.created).data) if found else None


def watch_and_kill(stack: Stack, tag: str, shot: int, chunks: int, kill_after_s: float,
                   done: threading.Event) -> dict[str, Any] | None:  # fmt: skip
    """Poll the API until shot `shot`'s task run is Running mid-shot, then kill its worker."""
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    from flows.progress import artifact_key

    key = artifact_key(tag, "shot", f"{shot:04d}")
    running_since = None
    with stack.client() as client:
        while not done.is_set():
            runs = client.read_task_runs(
                task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=f"shot-{shot:04d} "))
            )
            live = [r for r in runs if r.state is not None and r.state.type.value == "RUNNING"]
            if live:
                running_since = running_since or time.monotonic()
                progress = _progress(client, key) or 0.0
                mid = (
                    0.0 < progress < 100.0 if chunks > 1 else time.monotonic() - running_since >= kill_after_s
                )
                if mid:
                    info = kill_worker_of(stack, str(live[0].flow_run_id))
                    return {**info, "shot": shot, "task_run_id": str(live[0].id),
                            "group_run_id": str(live[0].flow_run_id), "progress_pct": progress}  # fmt: skip
            time.sleep(0.3)
    return None


def _first_run_with_kill(stack: Stack, params: dict[str, Any], args: argparse.Namespace, tag: str,
                         kill_shot: int, chunks: int) -> tuple[DeploymentRun, dict[str, Any] | None]:  # fmt: skip
    result: list[DeploymentRun] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            result.append(stack.run_deployment(FILM, params, timeout=args.timeout))
        except BaseException as exc:  # reported below
            errors.append(exc)

    done = threading.Event()
    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    killer: list[dict[str, Any] | None] = []

    def watch() -> None:
        try:
            killer.append(watch_and_kill(stack, tag, kill_shot, chunks, args.kill_after_s, done))
        except BaseException as exc:  # reported below
            errors.append(exc)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    while thread.is_alive() and watcher.is_alive():
        time.sleep(0.5)
    kill = killer[0] if killer else None
    if kill is not None:
        done_lines = read_attempts(workspace_of(stack.workspace))
        kill["attempts_at_kill"] = len(done_lines)
        kill["done_at_kill"] = sorted(a["shot"] for a in done_lines if a["status"] == "done")
        log.info("killed %s (pids %s) in shot %04d at %.0f %%", kill["worker"], kill["killed_pids"],
                 kill_shot, kill["progress_pct"])  # fmt: skip
        kill["restart"] = restart_worker(stack, kill)
    thread.join()
    done.set()
    watcher.join(timeout=10)
    if errors:
        raise errors[0]
    if kill is not None:  # what the first run rendered in all (an in-run retry of the lost group too)
        kill["attempts_after_first_run"] = len(read_attempts(workspace_of(stack.workspace)))
    return result[0], kill


def fresh_stack(work: Path) -> None:
    """A run starts from an empty Prefect home, workspace and output (the weights root is kept): processes
    left by an earlier driver of this WORK are killed, their folders removed."""
    import shutil

    for pid in stack_processes(work / "stack" / "prefect"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for folder in ("stack", "out"):
        shutil.rmtree(work / folder, ignore_errors=True)


def pick_kill_shot(manifest: dict[str, Any], wanted: int | None) -> int:
    """The shot to kill in: `wanted`, else the first dialogue shot from the film's middle on that is not
    the first dialogue shot (its process has loaded the models in an earlier shot: the load is recorded)."""
    dialogue = [s["index"] for s in manifest["shots"] if s["expect"] == "dub"]
    if wanted is not None:
        return wanted
    later = [i for i in dialogue[1:] if i >= len(manifest["shots"]) // 2] or dialogue[1:]
    if not later:
        raise SystemExit("film_gpu: the film needs two dialogue shots to kill in the second")
    return later[0]


def run(args: argparse.Namespace) -> int:
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    fresh_stack(work)
    _phase(work, "weights")
    meta_path = work / "weights" / "root.json"
    if not meta_path.exists():
        from real_root import write_real_root

        meta = write_real_root(work / "weights", tiny=args.tiny)
        _json(meta_path, meta)
    root = json.loads(meta_path.read_text())
    _phase(work, "film")
    film_dir = work / "film"
    size = tuple(int(v) for v in args.size.split("x"))
    t0 = time.time()
    manifest = make_film(film_dir, size, args.shots, args.film_s)
    manifest["make_s"] = round(time.time() - t0, 1)
    _json(film_dir / "manifest.json", manifest)
    kill_shot = pick_kill_shot(manifest, args.kill_shot)
    out = work / "out" / "film.dubbed.mp4"
    params = {"source": manifest["film"], "audio": manifest["dub"], "out": str(out),
              "config": film_config(args, root)}  # fmt: skip
    n_gpus = gpu_count(args.tiny)
    env = {
        "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "DUBFLOW_OUTPUT_ROOTS": str(work),
        "DUBFLOW_SERVER_TIMEOUT_S": "600",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(args.heartbeat_s),  # Prefect's minimum is 30 s
        "DUBFLOW_LOST_RUN_S": str(args.lost_run_s),
    }
    result: dict[str, Any] = {"device": device_name(args.tiny), "tiny": args.tiny, "gpus": n_gpus,
                              "root": root, "film": manifest, "kill_shot": kill_shot}  # fmt: skip
    sampler = GpuSampler()
    _phase(work, "stack")
    t0 = time.time()
    with running_stack(work / "stack", n_gpu_workers=n_gpus, env=env, start_timeout=900, ui=args.ui) as stack:
        result["stack_start_s"] = round(time.time() - t0, 1)
        sampler.start()
        _phase(work, "first run", kill_shot=kill_shot)
        chunks = _chunks_of(args, manifest, kill_shot)
        first, kill = _first_run_with_kill(stack, params, args, manifest_tag(manifest), kill_shot, chunks)
        result["first_run"] = {
            "rc": first.rc,
            "flow_run_id": first.flow_run_id,
            "wall_s": round(first.wall_s, 1),
        }
        result["kill"] = kill
        if kill is None:
            result["failed"] = f"the first run ended (rc {first.rc}) before shot {kill_shot:04d} ran mid-shot"
        else:
            _phase(work, "resume run")
            second = stack.run_deployment(FILM, params, timeout=args.timeout)
            result["resume_run"] = {"rc": second.rc, "flow_run_id": second.flow_run_id,
                                    "wall_s": round(second.wall_s, 1)}  # fmt: skip
            if second.rc != 0:
                result["resume_run"]["tail"] = second.output[-3000:] + stack.logs(20)
        samples = sampler.stop()
        _phase(work, "read back")
        data = collect(stack, manifest, result)
    result["total_s"] = round(time.time() - t_start, 1)
    _json(work / "readback.json", {"data": data, "samples": samples, "result": result, "out": str(out)})
    return report(work, args.tiny)


def report(work: Path, tiny: bool) -> int:
    """Figures and checks from WORK/readback.json (what `run` read back): result.json, report.txt."""
    saved = json.loads((work / "readback.json").read_text())
    data, samples, result, out = saved["data"], saved["samples"], saved["result"], Path(saved["out"])
    data["done"] = {int(k): v for k, v in data["done"].items()}  # JSON object keys are strings
    data["qc"] = {int(k): v for k, v in data.get("qc", {}).items()}
    manifest = result["film"]
    result["samples"] = len(samples)
    if "failed" not in result:
        result["figures"] = figures(data, manifest, result, samples, tiny=tiny)
        failures = run_checks(data, manifest, result, out)
        result["checks"] = {"failed": failures, "warnings": data.get("warnings", [])}
        if failures:
            result["failed"] = failures[0]
    result["ok"] = "failed" not in result
    _json(work / "result.json", result)
    (work / "report.txt").write_text(render_report(result))
    print(render_report(result), flush=True)
    _phase(work, "done", ok=result["ok"])
    if not result["ok"]:
        print(f"film_gpu: FAILED: {result['failed']}", file=sys.stderr)
        return 1
    return 0


def manifest_tag(manifest: dict[str, Any]) -> str:
    from flows.film_tasks import film_tag

    return film_tag(manifest["film"])


def _chunks_of(args: argparse.Namespace, manifest: dict[str, Any], shot: int) -> int:
    """Chunks of the kill shot by the product's own plan (so a one-chunk shot is killed on time instead)."""
    from fractions import Fraction

    from tasks.config.pipeline import load_config
    from tasks.timeline.plan import plan_shot
    from tasks.timeline.shots import Shot

    cfg = load_config(updates=film_config(args, {"root": None}))
    s = manifest["shots"][shot]
    return len(plan_shot(Shot(shot, s["start_frame"], s["start_frame"] + s["frames"]), Fraction(manifest["fps"]),
                         cfg.plan).chunks)  # fmt: skip


def device_name(tiny: bool) -> str:
    if tiny:
        return "CPU (TINY RANDOM WEIGHTS: a pipeline check, not a dub)"
    import torch

    return (
        ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "no CUDA device"
    )


def start(args: argparse.Namespace, argv: list[str]) -> int:
    """`run` detached in a new process session (survives the device command), logging to WORK/film_gpu.log."""
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for stale in ("result.json", "report.txt", "status.json"):
        (work / stale).unlink(missing_ok=True)
    rest = [a for a in argv if a != "start"]
    with open(work / "film_gpu.log", "ab") as logf:
        proc = subprocess.Popen([sys.executable, "-u", __file__, "run", *rest], stdout=logf, stderr=logf,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=PROJECT)  # fmt: skip
    (work / "driver.pid").write_text(f"{proc.pid}\n")
    print(f"film_gpu: started pid {proc.pid} (log {work / 'film_gpu.log'}); follow with `wait --work {work}`")
    return 0


def wait(args: argparse.Namespace) -> int:
    """Follow a started run for up to --wait-s: 0 passed, 1 failed, 3 still running."""
    work = Path(args.work).resolve()
    logf, offset = work / "film_gpu.log", 0
    pid = int((work / "driver.pid").read_text())
    deadline = time.monotonic() + args.wait_s
    while True:
        if logf.exists():
            with open(logf, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
                offset += len(chunk)
            lines = [ln for ln in chunk.decode(errors="replace").splitlines() if "film_gpu" in ln]
            for line in lines[-20:]:
                print(line, flush=True)
        if (work / "result.json").exists():
            result = json.loads((work / "result.json").read_text())
            print((work / "report.txt").read_text())
            return 0 if result.get("ok") else 1
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            tail = logf.read_text(errors="replace").splitlines()[-30:] if logf.exists() else []
            print("\n".join(tail))
            print(f"film_gpu: FAILED: the driver (pid {pid}) exited without a result (log {logf})")
            return 1
        if time.monotonic() > deadline:
            status = json.loads((work / "status.json").read_text()) if (work / "status.json").exists() else {}
            print(f"film_gpu: still running (phase {status.get('phase', '?')}); call wait again")
            return 3
        time.sleep(5)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s film_gpu: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per API call otherwise
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "start", "wait", "report"])
    parser.add_argument("--work", default="/tmp/film", help="weights root, film, stack, workspace, result")
    parser.add_argument("--tiny", action="store_true", help="CPU pipeline check: TINY RANDOM WEIGHTS")
    parser.add_argument("--shots", type=int, default=10, help="shots of the film (8-10)")
    parser.add_argument("--film-s", type=float, default=None, help="film length (default: 64 s for 10 shots)")
    parser.add_argument("--size", default="1920x1080", help="film frame size WxH")
    parser.add_argument("--kill-shot", type=int, default=None, help="shot to kill the worker in")
    parser.add_argument("--kill-after-s", type=float, default=3.0, help="one-chunk shot: kill after this")
    parser.add_argument("--heartbeat-s", type=int, default=30)
    parser.add_argument("--lost-run-s", type=int, default=65, help="heartbeat watch: silent run -> Crashed")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per deployment run")
    parser.add_argument("--ui", action="store_true", help="serve the Prefect UI too")
    parser.add_argument("--wait-s", type=float, default=540, help="wait: follow the run this long")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.command == "start":
        return start(args, argv)
    if args.command == "wait":
        return wait(args)
    if args.command == "report":  # figures and checks again from WORK/readback.json
        return report(Path(args.work).resolve(), args.tiny)
    rc = run(args)
    if args.json:
        args.json.write_text((Path(args.work) / "result.json").read_text())
    return rc


if __name__ == "__main__":
    sys.exit(main())
