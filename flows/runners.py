"""How a film's shot groups run: `load_group` (the group's model load, warmed at its shots' planned model
sizes, before the first shot), `render_group` (every shot of a group in order, failures recorded and
never stopping the others), `InlineRunner` (plain calls, no Prefect API: `dubflow dub --no-prefect`),
`PrefectRunner` (task runs; groups as child runs of `dub-group`, on GPU workers or in-process) and
`online_workers` (how many GPU workers to plan groups for).

Holds no flow and no film step: the `dub-group` flow and the `run_group` task that starts it live in
`flows/dub_film.py` (entrypoints), which hands `run_group` to `PrefectRunner`, so this module never
imports the flows.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

from prefect import Task
from prefect.futures import wait

from flows.group_liveness import group_lock_path
from flows.groups import Group
from flows.runtime import where_am_i
from flows.shot_task import BackendSlot, dub_shot, failure_reason, prepare_one_shot, shot_qc
from tasks.render.interrupts import check_stop
from tasks.run.workspace import Workspace, log_group_load, mark_shot_failed, shot_done

log = logging.getLogger(__name__)

GPU_POOL = "gpu-pool"

ShotRunner = Callable[[dict[str, Any]], BaseException | None]


def render_group(
    ws: Workspace,
    shots: Sequence[dict[str, Any]],
    run_shot: ShotRunner,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> dict[int, str]:
    """Every shot of a group in order; failures are recorded and never stop the others (recording one
    never raises either, e.g. on a full disk). The failed shots: {index: reason}.

    `prepare(shot)` (`flows.shot_task.prepare_one_shot`: the gate, region plan, decision) runs one shot
    ahead on a thread of its own while the current shot renders; a shot runs only after its preparation
    returned, and a preparation that raised is that shot's failure (its render does not start).
    """
    failed = {}
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shot-prepare")
    stopping = False
    try:
        ahead: Future | None = pool.submit(prepare, shots[0]) if prepare and shots else None
        for i, shot in enumerate(shots):
            check_stop()  # a signal asked the run to stop: no new shot starts
            mine, ahead = ahead, None
            error = mine.exception() if mine is not None else None  # waits for this shot's preparation
            if prepare and i + 1 < len(shots):
                ahead = pool.submit(prepare, shots[i + 1])  # the next shot's, while this one renders
            if error is None:
                error = run_shot(shot)
            if isinstance(error, KeyboardInterrupt):  # a stop (Prefect hands it back as the shot's state)
                raise error
            if error is not None:
                failed[shot["index"]] = failure_reason(error)
                mark_shot_failed(ws, shot["index"], shot["key"], failed[shot["index"]], where_am_i())
    except KeyboardInterrupt:
        stopping = True
        raise
    finally:  # on a stop, the next shot's preparation is not waited for (it writes nothing the run needs)
        pool.shutdown(wait=not stopping, cancel_futures=True)
    return failed


def load_group(
    ws: Workspace, film: dict[str, Any], shots: Sequence[dict[str, Any]], backends: BackendSlot
) -> dict[str, Any]:
    """The group's model load before its first shot, warmed at the sizes its shots still to render were
    planned at (`BackendSlot.warm_up`), recorded apart from the shots (`log_group_load`): the record, {}
    when nothing was warmed. A load that fails here is logged and left to the shots (each then loads and
    fails with its own reason, as without this step)."""
    try:
        load = backends.warm_up(ws, film, list(shots))
    except Exception as exc:
        log.warning("group model load before its first shot failed (%s); the shots load", failure_reason(exc))
        return {}
    if not load:
        return {}
    record = {"group": group_lock_path(ws, shots).stem, "shots": [s["index"] for s in shots], **load,
              **where_am_i(), "pid": os.getpid()}  # fmt: skip
    log_group_load(ws, record)
    return record


def online_workers(pool: str) -> int:
    """Online workers polling `pool` (at least 1, so planning works before workers report)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkerStatus

    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    return max(1, sum(w.status == WorkerStatus.ONLINE for w in workers))


class InlineRunner:
    """The film sequence as plain function calls: no Prefect API, no artifacts, groups in order."""

    fanout = "inline"

    def __init__(self) -> None:
        self.errors: list[str] = []  # why shots failed, in order (also when failed.json cannot be written)

    def call(self, t: Any, *args: Any, **kwargs: Any) -> Any:
        check_stop()  # a signal asked the run to stop: no new step starts
        return t.fn(*args, **kwargs)

    def n_workers(self) -> int:
        return 1

    def run_groups(
        self, ws: Workspace, film: dict[str, Any], shots: list[dict[str, Any]], groups: list[Group]
    ) -> dict[int, str]:
        backends = BackendSlot.for_config(film["config"])  # one backend for the whole film
        gate = BackendSlot.for_config(film["config"])  # the shot preparation's, one shot ahead
        qc_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shot-qc")  # one shot behind

        def run_shot(shot: dict[str, Any]) -> BaseException | None:
            try:
                result = dub_shot.fn(ws.as_dict(), film, shot, backends)
            except Exception as exc:  # keep going: every failed shot is reported
                log.error("shot %04d failed: %s", shot["index"], failure_reason(exc))
                return exc
            if result.get("dubbed"):  # its QC beside the next shot's render
                qc_pool.submit(shot_qc.fn, ws.as_dict(), film, shot)
            return None

        states = {}
        with qc_pool:  # waits for the last QC
            for group in groups:
                members = [shots[i] for i in group.shots]
                load_group(ws, film, members, backends)  # warms only sizes not warm yet
                prepare = functools.partial(prepare_one_shot, ws, film, backends=gate)
                failed = render_group(ws, members, run_shot, prepare)
                self.errors += [f"shot {i:04d}: {why}" for i, why in failed.items()]
                states[group.index] = "Failed" if failed else "Completed"
        return states

    def publish(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        pass


class PrefectRunner:
    """The film sequence as Prefect task runs; groups as child runs (deployments or in-process).

    `group_task` is `flows.dub_film.run_group`: one task run per group, which starts its child run.
    """

    def __init__(
        self, fanout: Literal["local", "deployments"], group_task: Task[..., dict[str, Any]]
    ) -> None:
        self.fanout = fanout
        self.group_task = group_task
        self.errors: list[str] = []  # why group runs failed, in group order

    def call(self, t: Any, *args: Any, **kwargs: Any) -> Any:
        check_stop()  # a signal asked the run to stop: no new step starts
        return t(*args, **kwargs)

    def n_workers(self) -> int:
        return online_workers(GPU_POOL) if self.fanout == "deployments" else 1

    def run_groups(
        self, ws: Workspace, film: dict[str, Any], shots: list[dict[str, Any]], groups: list[Group]
    ) -> dict[int, str]:
        states, futures = {}, {}
        for group in groups:
            members = [shots[i] for i in group.shots]
            all_done = all(shot_done(ws, s["index"], s["key"]) for s in members)
            wrapper = self.group_task.with_options(refresh_cache=not all_done)
            args = (ws.as_dict(), film, members, group.name, self.fanout)
            if self.fanout == "deployments":
                futures[group.index] = wrapper.submit(*args)
            else:  # one device: groups one after another
                states[group.index] = wrapper(*args, return_state=True).name
        wait(list(futures.values()))  # always wait for every group: one failure must not cancel others
        states.update({i: f.state.name for i, f in futures.items()})
        self.errors = [f.state.message for f in futures.values() if f.state.is_failed() and f.state.message]
        return states

    def publish(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # UI telemetry must not fail a film
            log.warning("artifact %s failed: %s", getattr(fn, "__name__", fn), exc)
