"""Whether a shot group's process is still alive, whatever the Prefect server says about its run.

A `dub-group` run holds ``<workspace>/groups/<first>-<last>-<keys>.lock`` (an flock: the kernel drops
it when the process dies, however it dies) for as long as it renders. When the server was away (a
restart, an outage) and its heartbeat watch marked the group's run Crashed while the group was in
fact rendering on, the film run does not believe the state: it waits while the lock is held, then
judges the group by its shots' done markers, and sets the run's state to what it really was
(`outlived_crash`). A group whose lock is free and whose shots are not all done was really lost
(`GroupLost`): `run_group` retries it once in the same film run, on any live worker, and only its
unfinished shots are rendered (each resuming at its last finished chunk).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.errors import DubflowError
from tasks.run.workspace import Workspace, shot_done, stable_hash

log = logging.getLogger(__name__)


class GroupLost(DubflowError):
    """A group's process died (its worker or host was lost) before its shots were done."""


def group_lock_path(ws: Workspace, shots: Sequence[dict[str, Any]]) -> Path:
    """The liveness lock of the group of `shots` (first and last index + a hash of the shot keys)."""
    keys = stable_hash([s["key"] for s in shots], length=8)
    return ws.path / "groups" / f"{shots[0]['index']:04d}-{shots[-1]['index']:04d}-{keys}.lock"


def group_alive(ws: Workspace, shots: Sequence[dict[str, Any]]) -> bool:
    """Whether a live process holds the group's lock (it is rendering)."""
    try:
        fd = os.open(group_lock_path(ws, shots), os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def outlived_crash(
    ws: Workspace, shots: Sequence[dict[str, Any]], child: Any, name: str, poll_s: float = 5.0
) -> bool:
    """For a child run seen Crashed: wait while its process still renders; True when all its shots are
    done then (the run's state is set to Completed, naming why), False when the group was lost."""
    if group_alive(ws, shots):
        log.warning("%s: its run was marked %s (%s) but the group is still rendering: waiting for it",
                    name, child.state.name, child.state.message)  # fmt: skip
        while group_alive(ws, shots):
            time.sleep(poll_s)
    if not all(shot_done(ws, s["index"], s["key"]) for s in shots):
        crash_unfinished_tasks(child, name)
        return False
    _set_completed(
        child, f"its shots are done: the group outlived a {child.state.name} state ({child.state.message})"
    )
    log.info("%s: every shot is done; the run's state is set back to Completed", name)
    return True


def _set_completed(child: Any, message: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Completed

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(child.id, Completed(message=message), force=True)
    except Exception as exc:  # the film goes on: its shots are done
        log.warning("cannot set the state of child run %s: %s", child.name, exc)


def crash_unfinished_tasks(child: Any, name: str) -> int:
    """Mark Crashed the task runs of a lost group run that are still Running or Pending (the shot it
    was rendering when its process died: nobody else ever ends them, and the UI would show that shot
    running for ever next to its re-render). Returns how many were set."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = TaskRunFilter(
        flow_run_id=TaskRunFilterFlowRunId(any_=[child.id]),
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])),
    )
    message = f"its group run {child.name} was lost ({child.state.name}: {child.state.message})"
    try:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(task_run_filter=unfinished)
            for run in runs:
                client.set_task_run_state(run.id, Crashed(message=message), force=True)
    except Exception as exc:  # the film goes on: only the display of the lost run is at stake
        log.warning("%s: cannot end the lost run's task runs: %s", name, exc)
        return 0
    if runs:
        log.info("%s: %d task run(s) of the lost run marked Crashed: %s", name, len(runs),
                 ", ".join(r.name for r in runs))  # fmt: skip
    return len(runs)
