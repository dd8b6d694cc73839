"""The team recipe end to end: PostgreSQL, an authenticated server, GPU workers from a second clone.

What docs/gpu_pool.md's "A team, several GPU hosts" section says, run on one machine as two "hosts":
the head runs `scripts/stack.sh team` (a private PostgreSQL cluster on a free port, the Prefect server
on it bound to 0.0.0.0 with basic auth, pools, deployments, heartbeat watch, the cpu worker); a
second `git clone` of this checkout in another folder runs `scripts/stack.sh workers` (two gpu
workers, its own PYTHONPATH and Prefect home, the shared virtual environment), reaching the server by
host name with `PREFECT_API_AUTH_STRING`. The workspace and result storage are one folder both see.
A film runs through `prefect deployment run`; the worker of one group is SIGKILLed (with its flow
run) mid-group, as if its host died; the heartbeat watch marks that group run Crashed, the film run
finds its process gone and retries the group once on the surviving worker, which renders only the
lost shots: the film completes with every shot rendered exactly once, a re-run renders nothing, and
the output has every source frame in place. Unauthenticated clients are refused throughout.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tasks.files import WorkspaceError, read_json
from tasks.media.probe import probe
from tasks.run.workspace import Workspace, read_attempts
from tests.media import decode_all, make_audio, make_clip
from tests.stack import PROJECT_DIR, DeploymentRun, Stack, free_port, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.team, pytest.mark.timeout(900)]

FILM = "dub-film/default"
CONFIG = {
    "backend": {"name": "passthrough"},
    "plan": {"frame_num": 5, "motion_frames": 1},  # several chunks per shot: a group takes a few seconds
    "encode": {"preset": "veryfast"},
    "cost": {"max_load_share": 0.0001},  # no grouping meets it: one group per gpu worker (2 x 3 shots)
}
HEARTBEAT_S = 30  # Prefect's minimum; a run silent for LOST_RUN_S is marked Crashed
LOST_RUN_S = 65


def _api_host() -> str:
    """How the second host names the head: its host name when that resolves, else its address."""
    name = socket.gethostname()
    with contextlib.suppress(OSError):
        socket.getaddrinfo(name, None)
        return name
    return "127.0.0.1"


@pytest.fixture
def pg_dir() -> Path:
    """Where the test's PostgreSQL cluster lives: not under pytest's 0700 temp folder, which the
    `postgres` system user (the cluster's owner when the test runs as root) cannot enter."""
    path = Path(tempfile.mkdtemp(prefix="dubflow-pg-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _psql(pg_dir: Path, port: str, query: str) -> str:
    """One value from the cluster's `prefect` database, as the `prefect` role (scripts/postgres.sh)."""
    env = {**os.environ, "PGPASSWORD": (pg_dir / "password").read_text().strip()}
    cmd = ["psql", "-X", "-tA", "-h", "127.0.0.1", "-p", port, "-U", "prefect", "-d", "prefect", "-c", query]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _clone(dest: Path) -> Path:
    """A second checkout of this project, as another host would have it (`git clone`; a copy of the
    files when this checkout is no git repository)."""
    if not (PROJECT_DIR / ".git").exists():
        ignore = shutil.ignore_patterns(".venv", ".prefect", "workspace", "out", "__pycache__")
        return Path(shutil.copytree(PROJECT_DIR, dest, ignore=ignore))
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(PROJECT_DIR), str(dest)], check=True)
    head = subprocess.run(
        ["git", "-C", str(PROJECT_DIR), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    clone = subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert clone.stdout == head.stdout
    return dest


def _workspace(root: Path, stem: str) -> Workspace:
    (path,) = root.glob(f"{stem}-*")
    manifest = read_json(path / "workspace.json")
    return Workspace(root=str(root), key=manifest["key"], incarnation=manifest["incarnation"])


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    kids = [int(p) for p in out.split()]
    return kids + [d for k in kids for d in _descendants(k)]


def _kill_host_worker(host: Stack, attempt: dict) -> list[int]:
    """SIGKILL the gpu worker that runs ``attempt``'s group, with its flow run and that run's children."""
    tag = attempt["worker"].rsplit("-", 1)[1]
    worker = host.pid_files()[f"gpu-{tag}"]
    group_pid = attempt["pid"]
    assert group_pid in _descendants(worker), (group_pid, worker)
    # The group run runs in the clone: the pull step's working directory is the clone's checkout.
    assert Path(f"/proc/{group_pid}/cwd").resolve() == host.project.resolve()
    victims = [worker, *_descendants(worker)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return victims


def _run_in_background(stack: Stack, params: dict) -> tuple[threading.Thread, list[DeploymentRun]]:
    result: list[DeploymentRun] = []
    thread = threading.Thread(target=lambda: result.append(stack.run_deployment(FILM, params, timeout=420)))
    thread.start()
    return thread, result


def test_team_stack_on_postgres_with_workers_from_a_second_clone(tmp_path: Path, pg_dir: Path):
    shared = tmp_path / "shared"  # the "shared mount": workspace + result storage, seen by both hosts
    port = free_port()
    api_url = f"http://{_api_host()}:{port}/api"
    auth = f"dubflow:{secrets.token_hex(12)}"
    common = {
        "DUBFLOW_WORKSPACE": str(shared / "workspace"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(shared / "results"),
        "PREFECT_API_URL": api_url,
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
    }
    head_env = {
        **common,
        "DUBFLOW_HOST": "0.0.0.0",
        "DUBFLOW_PORT": str(port),
        "PREFECT_SERVER_API_AUTH_STRING": auth,
        "DUBFLOW_PG_DIR": str(pg_dir),
        "DUBFLOW_PG_PORT": str(free_port()),
        "DUBFLOW_LOST_RUN_S": str(LOST_RUN_S),
        "PYTHONPATH": str(PROJECT_DIR),
    }
    clone = _clone(tmp_path / "host2" / "dubflow")
    host2_env = {**common, "PREFECT_API_AUTH_STRING": auth, "PYTHONPATH": str(clone)}

    # No auth string beyond loopback: the stack refuses to start the server (before any process starts).
    refused = running_stack(
        tmp_path / "noauth", command="team", env={**head_env, "PREFECT_SERVER_API_AUTH_STRING": ""}
    )
    with pytest.raises(RuntimeError, match="beyond loopback without authentication"), refused:
        pass

    t0 = time.monotonic()
    with running_stack(tmp_path / "head", command="team", env=head_env, start_timeout=420) as head:
        team_s = time.monotonic() - t0

        # Auth: the API refuses a client without the string (the health probe stays open), takes one with it.
        unauth = {k: v for k, v in head.env.items() if k != "PREFECT_API_AUTH_STRING"}
        bare = subprocess.run(
            ["prefect", "work-pool", "ls"], env=unauth, capture_output=True, text=True, timeout=120
        )
        assert bare.returncode != 0 and "401" in bare.stdout + bare.stderr, bare.stdout + bare.stderr
        listed = head.prefect("work-pool", "ls")
        assert listed.returncode == 0 and "gpu-pool" in listed.stdout, listed.stdout + listed.stderr
        no_key = running_stack(tmp_path / "nokey", command="workers", project=clone,
                               env={**host2_env, "PREFECT_API_AUTH_STRING": ""})  # fmt: skip
        with pytest.raises(RuntimeError, match="PREFECT_API_AUTH_STRING is unset"), no_key:
            pass

        with running_stack(tmp_path / "host2", command="workers", project=clone, env=host2_env) as host2:
            assert len([n for n in host2.pid_files() if n.startswith("gpu-")]) == 2
            clip = make_clip(tmp_path / "Team Film.mp4", (24,) * 6, audio_channels=None)
            info = probe(clip)
            dub = make_audio(tmp_path / "dub.wav", info.video_duration_s)
            out = tmp_path / "out" / "team-film.dubbed.mp4"
            params = {"source": str(clip), "audio": str(dub), "out": str(out), "config": CONFIG}

            # 1. The film runs; once a group has finished its first shot, its worker dies with its run.
            thread, first = _run_in_background(head, params)
            deadline = time.monotonic() + 300
            killed, done_at_kill = None, set()
            while killed is None and time.monotonic() < deadline and thread.is_alive():
                with contextlib.suppress(ValueError, WorkspaceError):  # no workspace (manifest) yet
                    ws = _workspace(shared / "workspace", "team-film")
                    attempts = read_attempts(ws)
                    starters = [a for a in attempts if a["status"] == "done" and a["shot"] in (0, 3)]
                    if starters:
                        done_at_kill = {a["shot"] for a in attempts if a["status"] == "done"}
                        _kill_host_worker(host2, starters[0])
                        killed = starters[0]
                time.sleep(0.05)
            assert killed is not None, first[0].output if first else head.logs()
            group = range(killed["shot"], killed["shot"] + 3)
            thread.join()
            (run,) = first
            lost = sorted(set(group) - done_at_kill)
            assert lost, "the group finished before its worker was killed"
            assert run.rc == 0, run.output + head.logs()  # the lost group was retried in the same film run
            done = [a["shot"] for a in read_attempts(ws) if a["status"] == "done"]
            assert sorted(done) == list(range(6)), done  # every shot rendered exactly once
            n_first = len(read_attempts(ws))

            # 2. A re-run renders nothing (every shot is reused).
            second = head.run_deployment(FILM, params, timeout=420)
            assert second.rc == 0, second.output + head.logs() + host2.logs()
            assert not [a for a in read_attempts(ws)[n_first:] if a["status"] == "done"]

        # The server kept its state in the test's PostgreSQL cluster (and never in a SQLite file).
        runs_in_pg = _psql(pg_dir, head_env["DUBFLOW_PG_PORT"], "select count(*) from flow_run")
        assert int(runs_in_pg) >= 4 and not list(head.home.glob("prefect.db*"))  # 2 films + 3 groups

    # The output holds every source frame, in place (shots of distinct colours: a lost, doubled or
    # shifted frame at any cut would differ by far more than the encoder's error).
    o = probe(out)
    assert (o.frame_count, o.fps, o.width, o.height) == (info.frame_count, info.fps, info.width, info.height)
    got, src = decode_all(out).astype(np.int16), decode_all(clip).astype(np.int16)
    per_frame = np.abs(got - src).mean(axis=(1, 2, 3))
    assert per_frame.max() < 3.0, per_frame
    print(
        f"\nteam stack: `stack.sh team` {team_s:.1f} s; film run with a killed worker {run.wall_s:.1f} s, "
        f"lost shots {lost} re-rendered in it; re-run {second.wall_s:.1f} s"
    )
