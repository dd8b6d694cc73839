"""One Ctrl-C (or SIGTERM) stops a run in seconds, keeps what finished and says how to resume.

The chunk loop honours a stop before the next chunk's model work (the chunk in flight is written), a second
signal or the end of the grace period stops at once, but never on a line where raising is unsafe (Prefect's
engine bookkeeping: `flows.prefect_signals`), and a last resort ends a stop that cannot be raised; and `dubflow dub` in its default mode (Prefect, with
its own temporary server) gets one SIGINT from the terminal's process group, exits within 10 s with the
resume line and leaves no server behind; the same command then says it is resuming, reuses the finished
shots, and one SIGTERM stops it the same way. The sample film with the tiny model on the CPU (TINY RANDOM
WEIGHTS: a pipeline check). A signal at an early instant (imports, the server's start, the film steps) ends
the command the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.prefect_signals import outside_prefect_engine
from tasks.errors import Interrupted
from tasks.render.interrupts import stop_on_signals, stop_requested
from tasks.render.overlap import run_chunks

REPO = Path(__file__).resolve().parents[1]
FILM, DUB = REPO / "data" / "sample_film.mp4", REPO / "data" / "sample_dub.wav"


@pytest.fixture(autouse=True)
def _interruptible() -> Iterator[None]:
    """Ctrl-C as a terminal delivers it: a suite started as a shell's background job (`make test &`)
    inherits SIGINT ignored, and so would every command these tests start (an ignored signal stays ignored
    across exec). Python's own handler for the test, the inherited disposition back after it."""
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


def _run(
    signals_in_chunk: int, grace_s: float, overlap: bool, sleep_s: float = 0.0
) -> tuple[list[int], float]:
    """Five chunks; chunk 1's model work receives `signals_in_chunk` SIGINTs (then works `sleep_s`):
    the chunks written and the seconds from the first signal to the stop."""
    written: list[int] = []
    sent: list[float] = []

    def generate(item: int, got: int) -> int:
        if item == 1:
            for _ in range(signals_in_chunk):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(sleep_s)
        return got

    with stop_on_signals(grace_s) as handler, pytest.raises(Interrupted) as ei:
        run_chunks(list(range(5)), lambda i: i, generate, lambda i, p: written.append(p), overlap=overlap)
    assert handler.requested == ei.value.signal_name == "SIGINT"
    assert stop_requested() is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    return written, time.monotonic() - sent[0]


@pytest.mark.parametrize("overlap", [True, False])
def test_one_signal_finishes_the_chunk_in_flight_then_stops(overlap: bool):
    written, _ = _run(1, grace_s=60.0, overlap=overlap)
    assert written == [0, 1]  # chunk 1 was in flight: written; chunk 2 never started


@pytest.mark.parametrize("overlap", [True, False])
def test_a_second_signal_or_the_grace_period_stops_at_once(overlap: bool):
    written, _ = _run(2, grace_s=60.0, overlap=overlap)
    assert written == [0]  # stopped inside chunk 1's model work; chunk 0 (generated before) is kept
    written, waited = _run(1, grace_s=0.3, overlap=overlap, sleep_s=30.0)  # a chunk longer than the grace
    assert written == [0] and waited < 5.0


def test_a_stop_due_on_an_unsafe_line_is_raised_on_the_next_safe_one():
    unsafe = True
    stopped_at: list[bool] = []
    with stop_on_signals(60.0, safe_to_raise=lambda frame: not unsafe) as handler:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(
                os.getpid(), signal.SIGINT
            )  # the second: stop now, but the main thread is on unsafe lines
            t_end = time.monotonic() + 0.5
            while time.monotonic() < t_end:
                time.sleep(0.01)  # unsafe work: the stop is retried, never raised here
            unsafe = False
            while True:
                time.sleep(0.01)
        except Interrupted as ex:
            stopped_at.append(unsafe)
            assert ex.signal_name == "SIGINT"
    assert stopped_at == [False] and handler.deferred >= 3


def test_the_last_resort_ends_a_stop_that_cannot_be_raised():
    called: list[tuple[str, float]] = []
    with stop_on_signals(0.2, safe_to_raise=lambda frame: False, last_resort=lambda name: called.append(
        (name, time.monotonic())), last_resort_s=0.5) as handler:  # fmt: skip
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        while not called and time.monotonic() < t0 + 5:
            time.sleep(0.01)  # never a line where the stop may be raised
    assert [name for name, _ in called] == ["SIGTERM"] and 0.6 < called[0][1] - t0 < 2.0, called
    assert handler.deferred >= 3


def test_prefect_engine_lines_are_unsafe_and_our_code_inside_a_run_is_safe(tmp_path: Path):
    """Real frames of code compiled under a stand-in Prefect directory: the engine, its call into a flow's
    or task's own function, its other modules (logging, an import)."""
    root = str(tmp_path / "prefect") + os.sep
    here: dict[str, object] = {}

    def frame_of(*chain: str) -> object:
        """The frame of our innermost function, called through `chain` (Prefect files, outermost first)."""

        def ours() -> object:
            return sys._getframe()

        fn = ours
        for path in reversed(chain):
            name = "call_with_parameters" if path.endswith("callables.py") else "engine_step"
            code = f"def {name}(fn):\n    return fn()\n"
            exec(compile(code, root + path, "exec"), here)
            fn = (lambda f, inner: lambda: f(inner))(here[name], fn)
        return fn()

    assert outside_prefect_engine(frame_of(), root)  # no run at all
    assert outside_prefect_engine(frame_of("flows.py", "callables.py"), root)  # Prefect, not in an engine
    assert outside_prefect_engine(frame_of("task_engine.py", "callables.py"), root)  # a task's own code
    assert not outside_prefect_engine(frame_of("task_engine.py"), root)  # called from engine bookkeeping
    # a task's code inside a flow's code, then inside Prefect's logging: unsafe; our code again: safe
    assert not outside_prefect_engine(frame_of("flow_engine.py", "callables.py", "logging.py"), root)
    assert outside_prefect_engine(
        frame_of("flow_engine.py", "callables.py", "task_engine.py", "callables.py"), root
    )


# ------------------------------------------------------------------------------------- the command


def _servers(prefect_home: Path) -> list[int]:
    """Pids of live processes whose environment names `prefect_home` and that run a uvicorn server."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes()
        except (OSError, ValueError):
            continue
        if b"uvicorn" in cmd and f"PREFECT_HOME={prefect_home}".encode() in env:
            pids.append(int(proc.name))
    return pids


class Command:
    """`dubflow dub ...` in a session of its own (its process group is what a terminal signals)."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hit = next((line for line in self.lines if text in line), None)
            if hit is not None:
                return hit
            assert self.proc.poll() is None, "\n".join(self.lines[-40:])
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout_s} s:\n" + "\n".join(self.lines[-40:]))

    def stop(self, sig: signal.Signals) -> tuple[int, float]:
        """`sig` to the whole process group, as a terminal sends Ctrl-C: (exit status, seconds to exit)."""
        t0 = time.monotonic()
        os.killpg(self.proc.pid, sig)
        try:
            rc = self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._pump.join(timeout=5)
        return rc, time.monotonic() - t0


def _dub_command(tmp_path: Path) -> tuple[Path, Path, list[str], dict[str, str]]:
    """The sample film's `dubflow dub` in the default mode under `tmp_path`: its Prefect home, workspace,
    arguments and environment (no PREFECT_ setting of the caller's)."""
    home, ws = tmp_path / "prefect", tmp_path / "ws"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(home), "DUBFLOW_WORKSPACE_ROOTS": str(tmp_path), "PYTHONPATH": str(REPO)}
    args = ["dub", str(FILM), "--audio", str(DUB), "--out", str(tmp_path / "out" / "film.mp4"),
            "--set", f"workspace.root={ws}"]  # fmt: skip
    return home, ws, args, env


def test_one_sigint_stops_the_default_mode_in_seconds_and_the_same_command_resumes(tmp_path: Path):
    home, ws, args, env = _dub_command(tmp_path)

    first = Command(args, env)
    first.wait_for("shot 0000 done", timeout_s=900)  # shots 1-2 copy, then shot 3's chunk (tens of seconds)
    rc, seconds = first.stop(signal.SIGINT)
    assert rc == 130 and seconds < 10, (rc, seconds, first.lines[-20:])
    last = first.lines[-1]
    assert last.startswith("dubflow: stopped by SIGINT;") and "to resume, run again: dubflow dub" in last
    assert not any("Traceback" in line or "ConnectError" in line for line in first.lines), first.lines
    assert _servers(home) == []  # the temporary server was stopped with the command
    assert len(list(ws.glob("*/shots/0000-*/done.json"))) == 1  # the finished shot is kept

    second = Command(args, env)
    line = second.wait_for("resuming sample_film.mp4:", timeout_s=600)
    reused = int(line.split("resuming sample_film.mp4: ")[1].split(" of ")[0])
    assert reused >= 1 and "reused" in line, line
    rc, seconds = second.stop(signal.SIGTERM)
    assert rc == 130 and seconds < 10, (rc, seconds, second.lines[-20:])
    assert second.lines[-1].startswith("dubflow: stopped by SIGTERM;"), second.lines[-5:]
    assert _servers(home) == []


@pytest.mark.parametrize(
    "sig, when",
    [(signal.SIGINT, 0.3), (signal.SIGINT, 0.6), (signal.SIGTERM, 1.5), (signal.SIGINT, 3.0),
     (signal.SIGTERM, "5 shot(s): cuts at")],
)  # fmt: skip
def test_a_signal_at_an_early_instant_stops_the_command_the_same_way(
    tmp_path: Path, sig: signal.Signals, when: float | str
):
    """Imports, the temporary server's start, Prefect's import, the flow's first steps: exit 130 within 10 s
    with the resume line, no traceback, no server left, no output."""
    home, ws, args, env = _dub_command(tmp_path)
    run = Command(args, env)
    if isinstance(when, str):
        run.wait_for(when, timeout_s=300)
    else:
        time.sleep(when)
    rc, seconds = run.stop(sig)
    assert rc == 130 and seconds < 10, (rc, seconds, run.lines[-20:])
    assert run.lines[-1].startswith(f"dubflow: stopped by {sig.name};"), run.lines[-5:]
    assert not any("Traceback" in line or "Error" in line for line in run.lines), run.lines
    assert _servers(home) == []
    assert not (tmp_path / "out" / "film.mp4").exists()
