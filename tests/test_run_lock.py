"""Run locks (tasks/run/run_lock.py) between real processes: busy, waited for, and taken over from the dead."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.run.run_lock import LockBusy, hold_lock

REPO = Path(__file__).resolve().parents[1]
_HOLDER = """
import sys, time
from tasks.run.run_lock import hold_lock
with hold_lock(sys.argv[1], "workspace w", run="first"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), str(seconds)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_holder_blocks_then_releases(tmp_path: Path):
    lock = tmp_path / "run.lock"
    proc = _holder(lock, 2.0)
    try:
        busy = rf"workspace w is in use by pid {proc.pid} on .* \(first\)"
        with pytest.raises(LockBusy, match=busy), hold_lock(lock, "workspace w"):
            pass
        t0 = time.monotonic()
        with hold_lock(lock, "workspace w", wait_s=60, poll_s=0.1) as owner:  # waits for the first run
            assert owner["run"] == "" and time.monotonic() - t0 > 0.5
            assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(LockBusy, match=r"after waiting 1 s"):
        proc = _holder(lock, 30.0)
        try:
            with hold_lock(lock, "workspace w", wait_s=1, poll_s=0.1):
                pass
        finally:
            proc.kill()
            proc.wait()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path: Path, caplog):
    lock = tmp_path / "run.lock"
    proc = _holder(lock, 60.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with hold_lock(lock, "workspace w"):
        assert str(proc.pid) not in lock.read_text()  # now ours
    assert any(f"pid {proc.pid}" in r.message and "no longer running" in r.message for r in caplog.records)
    caplog.clear()
    with hold_lock(lock, "workspace w"):  # released cleanly last time: nothing to take over
        pass
    assert not caplog.records
