"""The stack's lifecycle (scripts/stack.sh) on the session's real stack: start is idempotent, status
reports every process, stop leaves nothing behind. Runs after tests/test_flow_e2e.py (file order), which
drives films through the same stack; the stop test runs last."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.stack import STACK_SH, Stack, stack_processes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_deployments_and_pools_are_the_projects(dub_stack: Stack):
    from prefect.client.schemas.filters import DeploymentFilter

    with dub_stack.client() as client:
        deployments = client.read_deployments(deployment_filter=DeploymentFilter())
        pools = {d.name: d.work_pool_name for d in deployments}
        flows = {client.read_flow(d.flow_id).name: d for d in deployments}
    assert pools == {"default": "cpu-pool", "gpu": "gpu-pool"}
    assert set(flows) == {"dub-film", "dub-group"}
    assert flows["dub-film"].parameters == {"fanout": "deployments"}
    assert flows["dub-group"].entrypoint == "flows/dub_film.py:dub_group"


def test_start_twice_keeps_processes_and_status_reports_them(dub_stack: Stack):
    before = dub_stack.pid_files()
    assert set(before) == {"server", "cpu", "gpu-0", "gpu-1"}
    again = dub_stack.sh("start")
    assert "already running" in again.stderr
    assert dub_stack.pid_files() == before
    status = dub_stack.sh("status")
    assert status.stderr.count("running (pid") == 4


def test_usage_error():
    proc = subprocess.run(["bash", str(STACK_SH), "restart"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "usage:" in proc.stderr


@pytest.mark.parametrize(
    ("command", "env", "refusal"),
    [
        ("start", {"DUBFLOW_HOST": "0.0.0.0"}, "DUBFLOW_HOST=0.0.0.0 binds the API beyond loopback"),
        ("team", {"DUBFLOW_HOST": "10.1.2.3"}, "DUBFLOW_HOST=10.1.2.3 binds the API beyond loopback"),
        ("workers", {"PREFECT_API_URL": "http://head-host:4200/api"}, "PREFECT_API_AUTH_STRING is unset"),
    ],
)
def test_no_auth_beyond_loopback_is_refused_before_anything_starts(tmp_path, command, env, refusal):
    """Without Prefect's basic auth string the stack neither serves nor joins an API beyond loopback."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DUBFLOW_"))}
    clean |= {"DUBFLOW_PREFECT_HOME": str(tmp_path / "home"), **env}
    proc = subprocess.run(
        ["bash", str(STACK_SH), command], env=clean, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and refusal in proc.stderr, proc.stderr
    assert not (tmp_path / "home").exists()  # no pid file, no log, no database: nothing was started


def test_stop_ends_every_process(dub_stack: Stack):
    """Runs last (file order): stop the session's stack and check nothing of it is left."""
    assert stack_processes(dub_stack.home)
    dub_stack.sh("stop", timeout=90)
    assert stack_processes(dub_stack.home) == []
    assert dub_stack.pid_files() == {}
    assert dub_stack.sh("status", check=False).returncode != 0
