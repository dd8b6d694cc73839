"""How `make test` spreads the suite over the box's cores (pytest-xdist, ``-n 2 --dist loadfile``).

A whole test file goes to one worker, so its module fixtures are built once and its tests keep their order.
The files that start whole stacks run as one unit on one worker (``UNITS``): a session fixture too costly to
build twice is shared, and no two stacks (servers, workers, heartbeats) compete for the cores at once. The
longest units are handed out first (``LONGEST_FIRST``, measured: docs/testing.md), so that neither worker is
left alone with a long one at the end. Without xdist (or with ``-n 0``) nothing here is used.
"""

from __future__ import annotations

import pytest

# file -> unit. The files that start a whole stack (Prefect server, workers, PostgreSQL) run on one worker,
# one stack at a time, in their collection order: test_flow_e2e.py and test_stack.py share the session's
# `dub_stack` (tests/conftest.py), and test_stack.py's last test stops it.
UNITS = {
    "tests/test_flow_e2e.py": "stacks",
    "tests/test_stack.py": "stacks",
    "tests/test_team_e2e.py": "stacks",
}
# units by measured wall time, longest first (the rest follow in collection order)
LONGEST_FIRST = (
    "stacks",
    "tests/test_av_sync.py",
    "tests/test_asd_doubt.py",
    "tests/test_asd_lead.py",
)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or the shared unit its file belongs to."""
    path = nodeid.split("::", 1)[0]
    return UNITS.get(path, path)


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the units of LONGEST_FIRST first, in that order; a stable sort, so every
    file keeps its tests' order and the rest keep the collection order."""
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


class XdistUnits:
    """Registered by tests/conftest.py when pytest-xdist is loaded."""

    def pytest_configure_node(self, node) -> None:
        """Controller: tell each worker how the run is distributed (a worker's own ``--dist`` reads "no")."""
        node.workerinput["dubflow_dist"] = node.config.getoption("dist")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # only on the workers of a loadfile run, which all sort alike (the controller checks that their
        # collections agree); a serial run keeps the plain collection order
        if getattr(config, "workerinput", {}).get("dubflow_dist") == "loadfile":
            longest_first(items)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        if config.getoption("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling  # late: xdist is optional (the dev extra has it)

        class FileUnits(LoadFileScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return unit_of(nodeid)

        config.option.loadscopereorder = False  # keep LONGEST_FIRST's order, not "most tests first"
        return FileUnits(config, log)
