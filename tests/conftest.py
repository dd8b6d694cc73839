"""Shared pytest fixtures.

Most tests need no Prefect server; tests that run flows in-process opt in with the session fixture
``prefect_harness`` (e.g. ``pytestmark = pytest.mark.usefixtures("prefect_harness")``). End-to-end tests
that need real workers share ``dub_stack``: the project's stack (``scripts/stack.sh``, ``prefect.yaml``)
with one cpu worker and two "gpu" workers, started once per session (``tests/stack.py``).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.scheduling import XdistUnits
from tests.stack import Stack, running_stack

# Before anything imports prefect: its settings are read once (recipe gotcha G7), and the harness
# server's telemetry otherwise logs "database is locked" noise.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Tests write their outputs anywhere under the temp folder (tasks/run/outputs.py confines `out` to the output
# roots); tests of the default roots unset it. Stack subprocesses get a clean DUBFLOW_* environment.
os.environ.setdefault("DUBFLOW_OUTPUT_ROOTS", tempfile.gettempdir())
os.environ.setdefault("DUBFLOW_WORKSPACE_ROOTS", tempfile.gettempdir())  # workspace.root, confined alike
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # each pytest-xdist worker its own Prefect home: a temporary server of `dubflow dub` keeps its SQLite
    # database there, and two workers must not share one (tests/scheduling.py)
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"dubflow-prefect-{worker}-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], True)
    # the cores shared out among the workers: each worker's torch / OpenMP threads (read when torch is first
    # imported, after this), so that two workers on two cores do not run four spinning threads
    share = (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))


def pytest_configure(config: pytest.Config) -> None:
    # `make test` runs the files on 2 workers (pytest-xdist): tests/scheduling.py says how
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistUnits(), "dubflow-xdist-units")


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary Prefect server (SQLite) for the session; yields the session's result storage dir.

    Result storage (where cache records live) is per session through ``temporary_settings``: setting
    ``os.environ`` here would be too late, and stale cache hits from an earlier session would follow.
    """
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    results = tmp_path_factory.mktemp("prefect-results")
    with (
        temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results)}),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield results


@pytest.fixture(scope="session")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random weights root, written once per session (per xdist worker); tests copy it into a
    workspace's cache with ``tests.tiny_weights.seed_cache``."""
    # late: torch and the model are imported only for the tests that need them
    from tasks.infinitetalk import ensure_tiny_root

    return ensure_tiny_root(tmp_path_factory.mktemp("tiny-weights"))


@pytest.fixture(scope="session")
def dub_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The real stack in a temporary Prefect home: server, pools, deployments, cpu + 2 gpu workers.

    The code version is pinned: other work landing in flows/ tasks/ model/ while the tests run must
    not move a film to a new workspace between two of its runs.
    """
    base = tmp_path_factory.mktemp("stack")
    with running_stack(base, n_gpu_workers=2) as stack:
        yield stack


@pytest.fixture
def backend_log() -> Iterator[list[str]]:
    """Messages of the InfiniteTalk backend's logger, in order (a handler of its own: Prefect
    reconfigures logging)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("tasks.infinitetalk")
    handler, level = Keep(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)
