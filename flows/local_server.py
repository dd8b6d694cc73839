"""The local command's temporary Prefect server (`dubflow dub` without `PREFECT_API_URL`).

Prefect would start its own ephemeral server when the flow first talks to the API, in the terminal's
process group: a Ctrl-C reached it too, the flow then could not record its state and the command hung on
connection retries. Started here instead, the same server (Prefect's API app under uvicorn, no UI, on a
free loopback port, the database of `PREFECT_HOME`) runs in a session of its own, its output goes to a log
file beside the run's log (the 'database is locked' tracebacks and telemetry lookups never reach the
console; telemetry is off), it starts while the inputs are checked, and the command stops it (SIGTERM to its
process group, SIGKILL after a few seconds) however the run ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tasks.render.interrupts import check_stop

log = logging.getLogger(__name__)

SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def drain_prefect(timeout_s: float = 2.0) -> None:
    """Send what Prefect's background log and event workers still hold (each waits at most `timeout_s`)."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout_s)
        except Exception as exc:  # a drain that fails loses UI log lines, never the run
            log.debug("draining %s: %s", worker.__name__, exc)


class TemporaryServer:
    """A Prefect API server subprocess in its own session (see the module docstring)."""

    def __init__(self, log_file: Path | None = None, port: int | None = None) -> None:
        """`log_file`: where the server's output goes (default: a temporary file, moved beside the run's
        log by `stop` when it holds anything: a bad input then leaves nothing in the workspace root)."""
        if log_file is None:
            fd, name = tempfile.mkstemp(prefix="dubflow-server-", suffix=".log")
            os.close(fd)
            log_file = Path(name)
        self.log_file = log_file
        self.keep_log_as: Path | None = None  # set by the caller once the run's log folder exists
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._started_proc: subprocess.Popen[bytes] | None = None  # kept after `stop` for `kill`
        self.started = 0.0
        self.ready = False  # its API answered (only then can anything have been sent to it)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        """The server process, in a session of its own, its output to `log_file` (not waited for)."""
        spec = importlib.util.find_spec("prefect")  # located, not imported (the server imports it)
        assert spec is not None and spec.origin is not None, "prefect is not installed"
        cmd = [
            sys.executable, "-m", "uvicorn", "--app-dir", str(Path(spec.origin).parent.parent),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", "error", "--lifespan", "on",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | SERVER_ENV
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        self._started_proc = self.proc
        self.started = time.monotonic()

    def wait_ready(self, timeout_s: float) -> float:
        """Block until the API answers its health check; the seconds since `start`. A server that exits
        or does not answer in `timeout_s` is an error naming its log file; a Ctrl-C / SIGTERM
        (`tasks.render.interrupts`) stops the wait at once."""
        assert self.proc is not None, "start() first"
        deadline = self.started + timeout_s
        while True:
            check_stop()
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the temporary Prefect server exited ({self.proc.returncode}); see {self.log_file}"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready = True
                        return time.monotonic() - self.started
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the temporary Prefect server did not answer within {timeout_s:.0f} s; see {self.log_file}"
                )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL to the server's process group now, from any thread and whatever `stop` is doing (the
        last resort of a stop: `flows/cli.py`); nothing is waited for."""
        proc = self._started_proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def stop(self, timeout_s: float = 5.0, drain: bool = True) -> None:
        """Prefect's log and event senders drained (they would retry against a stopped server; not with
        `drain=False`), then SIGTERM to the server's process group, SIGKILL when
        it outlives `timeout_s` (1 s at most before it was ready); reaped. Safe before `start` and twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            if drain and self.ready:
                drain_prefect()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:  # one still starting up may sit on SIGTERM until its start-up ends (seconds): not waited for
                proc.wait(timeout=timeout_s if self.ready else min(timeout_s, 1.0))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._file_log()

    def _file_log(self) -> None:
        """The server's output moved to `keep_log_as` when it holds anything, else removed."""
        with contextlib.suppress(OSError):
            keep = self.keep_log_as
            if self.log_file.stat().st_size and keep is not None and keep.parent.is_dir():
                shutil.move(self.log_file, self.keep_log_as)
            else:
                self.log_file.unlink()
