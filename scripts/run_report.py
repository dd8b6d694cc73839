"""Where a film run's time went: per group run and per shot, orchestration versus rendering.

    python scripts/run_report.py FILM_RUN_ID [--json]

Reads the Prefect API (PREFECT_API_URL, see scripts/env.sh) and the run workspace's ``attempts.jsonl``
(the renderer's own seconds per shot). For each group run: worker pickup (Scheduled -> Pending), process
start (Pending -> Running: interpreter, imports, pull step, flow load), run time and the render time of
its shots (the renderer's own seconds, the first shot's including the model load); overhead per shot =
(process start + run time - render time) / shots. Pickup is reported apart: it includes waiting for a
busy worker. For each shot task run: wall time minus render time. The model-load
share per group is the planned one (the film run's groups table artifact).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentTaskRunId,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from flows.progress import attempt_phases
from tasks.run.workspace import Workspace, read_attempts


def report(film_run_id: UUID) -> dict[str, Any]:
    with get_client(sync_client=True) as client:
        film = client.read_flow_run(film_run_id)
        film_tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[film.id])))
        groups = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_task_run_id=FlowRunFilterParentTaskRunId(any_=[t.id for t in film_tasks])
            )
        )
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[film.id]))
        )
        shares = {}
        for artifact in artifacts:
            if artifact.type == "table" and artifact.key and artifact.key.endswith("-groups"):
                shares = {row["group"]: row["load_share_pct"] for row in json.loads(artifact.data)}
        rows, shot_overheads = [], []
        for group in sorted(groups, key=lambda g: g.name):
            ws = Workspace.from_dict(group.parameters["ws"])
            attempts = read_attempts(ws)
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[group.id])))
            rendered = 0.0
            for task in tasks:
                if not task.name.startswith("shot-") or task.start_time is None or task.end_time is None:
                    continue
                index = int(task.name[5:9])
                mine = [a for a in attempts if a["shot"] == index and task.start_time.isoformat() <= a["at"]]
                seconds = mine[0]["seconds"] if mine and task.state.name != "Cached" else 0.0
                rendered += seconds
                shot_overheads.append((task.end_time - task.start_time).total_seconds() - seconds)
            for attempt in attempt_phases(client.read_flow_run_states(group.id)):
                n = len(group.parameters["shots"])
                rows.append(
                    {
                        "group": group.name,
                        "shots": n,
                        **{k: round(v, 2) for k, v in attempt.items()},
                        "render_s": round(rendered, 2),
                        # process start + in-run orchestration, per shot (pickup also holds queueing
                        # for a busy worker, so it is reported apart)
                        "overhead_per_shot_s": round(
                            (attempt["start_s"] + attempt["run_s"] - rendered) / n, 2
                        ),
                        "planned_load_share_pct": shares.get(group.name),
                    }
                )
    return {
        "film_run": film.name,
        "state": film.state.name if film.state else None,
        "film_run_s": film.total_run_time.total_seconds(),
        "groups": rows,
        "shot_task_overhead_median_s": round(statistics.median(shot_overheads), 3)
        if shot_overheads
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("film_run_id", type=UUID)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = report(args.film_run_id)
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    print(f"{data['film_run']}: {data['state']}, {data['film_run_s']:.1f} s running")
    cols = ["group", "shots", "pickup_s", "start_s", "run_s", "render_s", "overhead_per_shot_s",
            "planned_load_share_pct"]  # fmt: skip
    print(" | ".join(cols))
    for row in data["groups"]:
        print(" | ".join(str(row[c]) for c in cols))
    print(f"shot task runs: median overhead {data['shot_task_overhead_median_s']} s (wall minus render)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
