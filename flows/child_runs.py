"""Waiting for a child flow run (a shot group on a GPU worker) without ever hanging silently.

A child run that no worker picks up stays Scheduled, then Late, forever (the only GPU worker died,
or none was started). `await_child` polls the run until it ends; while it has not been started by
any worker it counts against ``checks.unscheduled_timeout_s``, after which the child is cancelled
and `ChildNotStarted` names the pool and the fix. Once a worker has taken the run (Pending,
Running, ...) the time it takes is its own: shots may legitimately run for hours. Only the Prefect
client is used here; no media work, no workspace files.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import UUID

from tasks.errors import DubflowError

log = logging.getLogger(__name__)


class ChildNotStarted(DubflowError):
    """No worker of the pool started a child run in time (the message names the pool)."""


def await_child(
    child_id: UUID,
    *,
    name: str,
    pool: str,
    unscheduled_timeout_s: float,
    poll_s: float = 2.0,
    outage_s: float = 900.0,
) -> Any:
    """The child flow run once it is final; `ChildNotStarted` (child cancelled) if never started in time.

    An API that cannot be reached (a server restart or outage) is waited out with a growing poll
    interval (up to 30 s), one log line when it goes away and one when it is back; only an outage
    longer than `outage_s` (``checks.api_outage_s``) raises.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    waited_since = time.monotonic()
    away_since: float | None = None
    with get_client(sync_client=True) as client:
        while True:
            try:
                run = client.read_flow_run(child_id)
            except Exception as exc:  # the API is away: wait it out, up to outage_s
                now = time.monotonic()
                if away_since is None:
                    away_since = now
                    log.warning("%s: the Prefect API cannot be reached (%s); waiting up to %.0f s",
                                name, type(exc).__name__, outage_s)  # fmt: skip
                if now - away_since > outage_s:
                    raise
                time.sleep(min(30.0, max(poll_s, (now - away_since) / 4)))  # backoff
                continue
            if away_since is not None:
                log.info("%s: the Prefect API is back after %.0f s", name, time.monotonic() - away_since)
                away_since, waited_since = None, time.monotonic()  # an outage is not time unscheduled
            state = run.state
            if state is not None and state.is_final():
                return run
            if state is None or state.type == StateType.SCHEDULED:  # Scheduled / Late: no worker took it
                waited = time.monotonic() - waited_since
                if waited >= unscheduled_timeout_s:
                    message = (
                        f"no worker of pool {pool} started {name} (child run {run.name}) within "
                        f"{unscheduled_timeout_s:.0f} s (checks.unscheduled_timeout_s); is a worker of "
                        f"{pool} running? (scripts/stack.sh workers)"
                    )
                    try:
                        client.set_flow_run_state(child_id, Cancelled(message=message), force=True)
                    except Exception as exc:  # the timeout is the error to report
                        log.warning("cancelling child run %s failed: %s", run.name, exc)
                    raise ChildNotStarted(None, message)
            else:
                waited_since = time.monotonic()  # taken by a worker: only a run back in Scheduled counts
            time.sleep(poll_s)
