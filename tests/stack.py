"""End-to-end harness: the real dubflow stack (``scripts/stack.sh``) in a temporary Prefect home.

``running_stack(...)`` starts a Prefect server on a free port, ``cpu-pool`` + ``gpu-pool``, the
deployments of a prefect.yaml, one cpu worker and N gpu workers, all as subprocesses driven by
``scripts/stack.sh`` with an environment free of the caller's ``PREFECT_*``/``DUBFLOW_*`` variables.
On exit it runs ``stack.sh stop`` and then kills, process group by process group, anything that still
carries this stack's Prefect home in its environment (so nothing outlives the test, whatever failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
STACK_SH = PROJECT_DIR / "scripts" / "stack.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class DeploymentRun:
    """Outcome of ``prefect deployment run --watch``: exit code, flow run id, console output."""

    rc: int
    flow_run_id: str
    output: str
    wall_s: float


@dataclass(frozen=True)
class Stack:
    home: Path
    env: dict[str, str]  # the environment scripts/env.sh produces for this stack
    project: Path = (
        PROJECT_DIR  # the checkout whose scripts/stack.sh drives it (a second clone for a 2nd host)
    )

    @property
    def api_url(self) -> str:
        return self.env["PREFECT_API_URL"]

    @property
    def workspace(self) -> Path:
        return Path(self.env["DUBFLOW_WORKSPACE"])

    def sh(self, command: str, *, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``scripts/stack.sh <command>`` against this stack."""
        proc = subprocess.run(
            ["bash", str(self.project / "scripts" / "stack.sh"), command],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"stack.sh {command} exited {proc.returncode}:\n{proc.stderr}\n{self.logs()}")
        return proc

    def prefect(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the ``prefect`` CLI against this stack."""
        return subprocess.run(
            ["prefect", *args],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run_deployment(self, name: str, params: Mapping[str, Any], *, timeout: float = 300) -> DeploymentRun:
        """``prefect deployment run NAME --param k=<json> ... --watch``; returns when the run is final."""
        args = ["deployment", "run", name, "--watch", "--watch-timeout", str(int(timeout))]
        for key, value in params.items():
            args += ["--param", f"{key}={json.dumps(value)}"]
        t0 = time.monotonic()
        proc = self.prefect(*args, timeout=timeout + 30)
        output = proc.stdout + proc.stderr
        match = re.search(r"UUID: ([0-9a-f-]{36})", output)
        if not match:
            raise RuntimeError(f"no flow run id in `prefect {' '.join(args)}` output:\n{output}")
        return DeploymentRun(proc.returncode, match.group(1), output, time.monotonic() - t0)

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """A synchronous Prefect client of this stack (settings scoped to the block)."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        settings = {
            PREFECT_API_URL: self.api_url,
            PREFECT_API_AUTH_STRING: self.env.get("PREFECT_API_AUTH_STRING"),
        }
        with temporary_settings(settings), get_client(sync_client=True) as client:
            yield client

    def pid_files(self) -> dict[str, int]:
        """Process name -> pid, from stack.sh's pid files."""
        return {p.stem: int(p.read_text().strip()) for p in self.home.glob("run/*/*.pid")}

    def logs(self, lines: int = 40) -> str:
        """Tails of every log, for failure messages."""
        parts = []
        for path in sorted(self.home.glob("logs/*/*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def stack_processes(home: Path) -> list[int]:
    """Pids of live processes whose environment names ``home`` as their Prefect home (Linux /proc)."""
    marker = f"DUBFLOW_PREFECT_HOME={home}".encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if marker in (proc / "environ").read_bytes().split(b"\0") and int(proc.name) != os.getpid():
                pids.append(int(proc.name))
    return pids


def _kill_leftovers(home: Path, grace_s: float = 10.0) -> list[int]:
    """SIGTERM each leftover process group of this stack, then SIGKILL what survives ``grace_s``."""
    found = stack_processes(home)
    groups = {os.getpgid(pid) for pid in found if _exists(pid)} - {os.getpgid(0)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_exists(pid) for pid in stack_processes(home)):
            time.sleep(0.2)
    return found


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _resolved_env(overrides: Mapping[str, str], project: Path = PROJECT_DIR) -> dict[str, str]:
    """The caller's environment minus PREFECT_*/DUBFLOW_*, plus overrides, passed through env.sh."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DUBFLOW_"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(overrides)
    dump = subprocess.run(
        ["bash", "-c", ". scripts/env.sh && env -0"],
        cwd=project,
        env=env,
        capture_output=True,
        check=True,
    ).stdout
    return dict(item.split("=", 1) for item in dump.decode().split("\0") if "=" in item)


@contextlib.contextmanager
def running_stack(
    base: Path,
    *,
    prefect_file: str = "prefect.yaml",
    n_gpu_workers: int = 2,
    ui: bool = False,
    start_timeout: float = 300,
    env: Mapping[str, str] | None = None,
    command: str = "start",
    project: Path = PROJECT_DIR,
) -> Iterator[Stack]:
    """Start the stack under ``base`` (Prefect home, workspace) and tear it down on exit.

    ``env`` adds variables for every stack process (workers pass them on to their flow runs);
    ``command`` is the stack.sh command (``team``: PostgreSQL + server side; ``workers``: a GPU host of
    the server at ``env["PREFECT_API_URL"]``), ``project`` the checkout it runs from.
    """
    home = base / "prefect"
    stack = Stack(
        home=home,
        project=project,
        env=_resolved_env(
            {
                "DUBFLOW_PREFECT_HOME": str(home),
                "DUBFLOW_PORT": str(free_port()),
                "DUBFLOW_WORKSPACE": str(base / "workspace"),
                "DUBFLOW_OUT_DIR": str(base / "out"),
                "DUBFLOW_PREFECT_FILE": prefect_file,
                "DUBFLOW_NO_UI": "0" if ui else "1",
                "N_GPUS": str(n_gpu_workers),
                "PREFECT_WORKER_QUERY_SECONDS": "1",
                **(env or {}),
            },
            project,
        ),
    )
    try:
        stack.sh(command, timeout=start_timeout)
        yield stack
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            stack.sh("stop", timeout=90, check=False)
        _kill_leftovers(home)
