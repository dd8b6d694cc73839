"""Create the dubflow process work pools that do not exist yet (used by scripts/stack.sh start).

An existing pool is left as it is, so a base job template customised by a team (env vars, working
directory) survives restarts of the stack; `prefect work-pool create --overwrite` would reset it.
"""

from __future__ import annotations

import sys

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectNotFound
from prefect.workers.process import ProcessWorker


def ensure_pools(names: list[str]) -> list[str]:
    """Create each missing pool as a ``process`` pool; return the names created."""
    created = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                template = ProcessWorker.get_default_base_job_template()
                client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
                created.append(name)
    return created


if __name__ == "__main__":
    pools = sys.argv[1:] or ["cpu-pool", "gpu-pool"]
    made = ensure_pools(pools)
    sys.stderr.write(f"stack: work pools {', '.join(pools)} ready (created: {', '.join(made) or 'none'})\n")
