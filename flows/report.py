"""What a film run reports from its workspace markers: the per-shot records the run plans with, the shot
table rows (done / copied / failed / planned, and why; which results were reused from earlier runs), each
group's done/failed shots and workers, the groups table artifact and the summed per-stage shot timings.

Reads markers only (never writes them) and runs nothing: the tasks, runners and flows that produce the
markers live in `flows/shot_task.py`, `flows/runners.py` and `flows/dub_film.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flows.group_liveness import group_lock_path
from flows.groups import Group
from flows.progress import artifact_key
from tasks.media.intermediates import read_marker
from tasks.run.workspace import Workspace, read_group_loads, read_shot_done, read_shot_failed


def shot_rows(
    ws: Workspace, shots: list[dict[str, Any]], backend: str, reused: set[int] | None = None
) -> list[dict[str, Any]]:
    """Shot table rows (status done / copied / failed / planned, and why) from the workspace markers.

    `reused`: the shots whose result was complete before this run (`reused_shots`), marked in the rows.
    """
    rows = []
    for shot in shots:
        row = {k: shot[k] for k in ("index", "start_s", "end_s", "frames", "chunks")}
        if reused is not None:
            row["reused"] = shot["index"] in reused
        done = read_shot_done(ws, shot["index"], shot["key"])
        if done is not None:
            result = done.get("result", {})
            status = "done" if result.get("dubbed", True) else "copied"
            row |= {
                "backend": result.get("backend", backend),
                "status": status,
                "reason": result.get("reason"),
            }
            row["output"] = done["output"]
            row |= lips_column(
                result.get("qc") or read_marker(ws.shot_dir(shot["index"], shot["key"]) / "qc.json")
            )
        else:
            failed = read_shot_failed(ws, shot["index"], shot["key"])
            status = "failed" if failed else "planned"
            row |= {"backend": backend, "status": status, "reason": failed and failed.get("reason")}
        row |= speaker_columns(shot.get("decision"))
        if "review" in shot:  # the review step's: who settled the shot's uncertain turns (person / policy)
            row["answered by"] = shot["review"]
        if row["status"] == "planned" and not row["reason"] and shot.get("decision"):
            row["reason"] = shot["decision"]["reason"]
        rows.append(row)
    return rows


def lips_column(qc: dict[str, Any] | None) -> dict[str, Any]:
    """The shot table's output check (`tasks.perception.lip_check`): the dubbed lips' fit to the dub's words,
    "REVIEW" when it flags the shot; nothing where QC (or the check) did not run."""
    if not qc or "lip_flag" not in qc:
        return {}
    fit = qc.get("lip_fit")
    return {"lips": ("?" if fit is None else f"{fit:+.2f}") + (" REVIEW" if qc["lip_flag"] else "")}


def speaker_columns(decision: dict[str, Any] | None) -> dict[str, Any]:
    """The shot table's speaker (track ids per dubbed turn, with their character when known, both people of
    a two-speaker turn joined by "+"; "-" when nobody on screen is dubbed) and score, and each face track's
    audio-visual agreement with the source's speech ("0 +0.42, 1 -0.26") where it was measured, with its
    learned speaking score (Light-ASD, `speaker.asd`: "0 +0.42 asd +1.9") where that was."""
    if not decision:
        return {"speaker": "", "score": ""}
    regions = decision.get("regions") or []
    agree, asd = decision.get("agreement") or {}, decision.get("asd") or {}
    cells = [
        " ".join(
            [k, *([f"{agree[k]:+.2f}"] if k in agree else []), *([f"asd {asd[k]:+.1f}"] if k in asd else [])]
        )
        for k in [*agree, *(k for k in asd if k not in agree)]
    ]
    extra = {"agreement": ", ".join(cells)} if cells else {}
    if not regions:
        return {"speaker": "-", "score": "", **extra}
    who = " -> ".join(_turn(r) for r in regions)
    return {"speaker": who, "score": round(min(float(r["score"]) for r in regions), 2), **extra}


def _turn(region: dict[str, Any]) -> str:
    people = region.get("people") or [{"track": region["speaker"], "character": region.get("character")}]
    return " + ".join(
        ("?" if p["track"] is None else str(p["track"]))
        + (f" {p['character']}" if p.get("character") else "")
        for p in people
    )


def reused_shots(rows: list[dict[str, Any]]) -> set[int]:
    """Shots whose result is already complete (rows made before rendering): this run reuses them."""
    return {r["index"] for r in rows if r["status"] in ("done", "copied")}


def shot_timings(rows: list[dict[str, Any]], ws: Workspace, shots: list[dict[str, Any]]) -> dict[str, float]:
    """Sum of the renderer timings per stage (seconds) of the shots this run rendered (not reused)."""
    total: dict[str, float] = {}
    for row, shot in zip(rows, shots, strict=True):
        if row.get("reused"):
            continue
        done = read_shot_done(ws, row["index"], shot["key"]) or {}
        for stage, seconds in (done.get("result", {}).get("timings_s") or {}).items():
            if isinstance(seconds, int | float):
                total[f"shots: {stage}"] = total.get(f"shots: {stage}", 0.0) + float(seconds)
    return total


def group_report(ws: Workspace, shots: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Done/failed shots of a group, where they were rendered (from the workspace markers) and its model
    loads that warmed before the first shot (`flows.runners.load_group`: models and warm-up seconds)."""
    done, failed, workers = [], [], set()
    for shot in shots:
        record = read_shot_done(ws, shot["index"], shot["key"])
        if record is not None:
            done.append(shot["index"])
        else:
            failed.append(shot["index"])
            record = read_shot_failed(ws, shot["index"], shot["key"])
        if record is not None and record.get("worker"):
            workers.add(f"{record['worker']}@{record.get('host', '?')}:{record.get('device', '?')}")
    group = group_lock_path(ws, shots).stem
    loads = [r for r in read_group_loads(ws) if r.get("group") == group]  # warmed before its first shot
    return {"done": done, "failed": failed, "workers": sorted(workers), "loads": loads}


def publish_groups(
    tag: str,
    ws: Workspace,
    groups: list[Group],
    shots: list[dict[str, Any]],
    states: dict[int, str],
    model_load_s: float,
) -> None:
    """Table artifact: each group's shots, estimated GPU time, model-load share, state and workers."""
    from prefect.artifacts import create_table_artifact

    rows = []
    for group in groups:
        report = group_report(ws, [shots[i] for i in group.shots])
        rows.append(
            {
                "group": group.name,
                "est_gpu_s": round(group.est_gpu_s, 1),
                "load_share_pct": round(100 * group.load_share(model_load_s), 1),
                "state": states.get(group.index, "?"),
                "failed": ", ".join(f"{i:04d}" for i in report["failed"]),
                "workers": ", ".join(report["workers"]),
            }
        )
    create_table_artifact(rows, key=artifact_key(tag, "groups"), description="shot groups")
