"""Create (or update) the automation that marks a flow run Crashed when its heartbeats stop.

A flow run whose process dies with its host (a GPU worker killed, a machine lost) stays Running in
Prefect forever: nothing reports its end, and the film run waiting for that shot group would wait
forever too. Every flow run sends a ``prefect.flow-run.heartbeat`` event every
``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (Prefect's default 180); this Prefect automation (a
proactive event trigger, Prefect's documented "zombie flow run" recipe) sets a run Crashed when no
heartbeat and no final state followed its last heartbeat within ``DUBFLOW_LOST_RUN_S`` seconds
(default three heartbeats). The film run then sees its group end Crashed, fails naming the lost shots,
and a re-run renders only those. Used by scripts/stack.sh start/team; holds no state of its own.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

NAME = "dubflow: crash flow runs whose heartbeats stopped"


def lost_run_seconds() -> int:
    """DUBFLOW_LOST_RUN_S, else three heartbeat intervals, and never less than one interval plus the
    server outage a film must ride out (DUBFLOW_API_OUTAGE_S, default 300 s): heartbeats sent while
    the server is away are lost, so a shorter window would mark live runs Crashed after a restart."""
    heartbeat = int(os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or 180)
    outage = int(os.environ.get("DUBFLOW_API_OUTAGE_S") or 300)
    return int(os.environ.get("DUBFLOW_LOST_RUN_S") or max(3 * heartbeat, heartbeat + outage))


def watch(within_s: int) -> AutomationCore:
    """The automation: after a heartbeat, expect another one (or a final state) within ``within_s``."""
    trigger = EventTrigger(
        posture=Posture.Proactive,
        after={"prefect.flow-run.heartbeat"},
        expect={
            "prefect.flow-run.heartbeat",
            "prefect.flow-run.Completed",
            "prefect.flow-run.Failed",
            "prefect.flow-run.Cancelled",
            "prefect.flow-run.Crashed",
        },
        match={"prefect.resource.id": ["prefect.flow-run.*"]},
        for_each={"prefect.resource.id"},
        threshold=1,
        within=timedelta(seconds=within_s),
    )
    action = ChangeFlowRunState(
        state=StateType.CRASHED,
        message=f"no heartbeat for {within_s} s: its worker or host was lost (dubflow heartbeat watch)",
    )
    return AutomationCore(name=NAME, description=__doc__.split("\n\n")[0], trigger=trigger, actions=[action])


def ensure_watch(within_s: int) -> str:
    """Replace any automation of this name by the current one; return what was done."""
    with get_client(sync_client=True) as client:
        old = client.read_automations_by_name(NAME)
        for automation in old:
            client.delete_automation(automation.id)
        client.create_automation(watch(within_s))
    return "replaced" if old else "created"


if __name__ == "__main__":
    seconds = lost_run_seconds()
    done = ensure_watch(seconds)
    sys.stderr.write(f"stack: heartbeat watch {done} (a run silent for {seconds} s is marked Crashed)\n")
