"""The run report next to the output: `<out stem>.report.json` and `<out stem>.report.html`, written
atomically (staged and delivered like the film when the output was claimed), from the workspace's markers
(each shot's done marker, the decision it kept, its QC record) and a thumbnail of every dubbed face (one
frame of the source decoded per face). What it holds: `tasks.timeline.run_report`. Written before the
workspace is removed (`workspace.keep: false`); its links into the workspace then say so.
"""

from __future__ import annotations

import json
import logging
from fractions import Fraction
from pathlib import Path
from typing import Any

from prefect import task

from flows.runtime import run_logger
from flows.shot_task import QC_RECORD
from tasks.files import atomic_write_bytes
from tasks.media.deliver import Destination, deliver, staging
from tasks.media.intermediates import read_marker
from tasks.media.probe import VideoInfo
from tasks.render.shot_qc import decision_path
from tasks.run.workspace import Workspace, read_shot_done
from tasks.timeline.run_report import dubbed_regions, face_thumbnail, film_report, report_html, shot_entry

log = logging.getLogger(__name__)


def report_paths(out: str) -> list[str]:
    """The report's two files next to `out`."""
    return [str(Path(out).with_suffix(".report.json")), str(Path(out).with_suffix(".report.html"))]


def current_log() -> str | None:
    """The run's log file (`tasks.run.run_log.run_log`'s handler on the root logger), None outside one."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, "dubflow_run_log", False):
            return str(handler.baseFilename)  # type: ignore[attr-defined]
    return None


def gather_shots(
    ws: Workspace, video: dict[str, Any], records: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every shot's report entry from its markers, with face thumbnails."""
    info = VideoInfo.from_dict(video)
    fps = Fraction(str(video["fps"]))
    width, height = info.display_size
    shots = []
    for record, row in zip(records, rows, strict=True):
        index, key = record["index"], record["key"]
        done = read_shot_done(ws, index, key) or {}
        result = done.get("result") or {}
        kept = read_marker(decision_path(Path(result["path"]))) if result.get("path") else None
        qc = result.get("qc") or read_marker(ws.shot_dir(index, key) / QC_RECORD)
        decision = kept or record.get("decision") or {}
        start = int(record["plan"]["start_frame"])
        thumbs = []
        for region in dubbed_regions(decision, start):
            middle = (region["frames"][0] + region["frames"][1] - 1) // 2
            for person in region["people"]:
                box = person["box"]
                thumbs.append(face_thumbnail(info, middle, box) if box and row["status"] == "done" else None)
        shots.append(shot_entry(row, record, fps, video.get("timecode"), (height, width), kept, qc, thumbs))
    return shots


@task(task_run_name="report-{name}")
def write_run_report(
    out: str,
    source: str,
    video: dict[str, Any],
    records: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    ws: dict[str, str],
    outputs: dict[str, str | None],
    keep: bool,
    notes: list[str],
    name: str = "",
    dest: dict[str, Any] | None = None,
    key: str = "",
) -> list[str]:
    """`<out stem>.report.json` and `.report.html` (see the module docstring); their paths."""

    workspace = Workspace.from_dict(ws)
    shots = gather_shots(workspace, video, records, rows)
    if not keep:
        notes = [*notes, f"the workspace {workspace.path} is removed after delivery (workspace.keep: false): "
                 "its QC sheets and shot files with it"]  # fmt: skip
    report = film_report(
        source, video, shots, outputs, str(workspace.path) if keep else None, current_log(), notes
    )
    blobs = {
        ".report.json": json.dumps(report, indent=1).encode(),
        ".report.html": report_html(report).encode(),
    }
    if dest is None:
        paths = [str(atomic_write_bytes(Path(out).with_suffix(s), b)) for s, b in blobs.items()]
    else:  # staged privately, then delivered like the film (never over a file dubflow did not write)
        where = Destination.from_dict(dest)
        with staging(where, Path(out).name) as folder:
            staged = [atomic_write_bytes(folder / Path(out).with_suffix(s).name, b) for s, b in blobs.items()]
            paths = [str(deliver(where, f, f.name, key, Path(out).name)) for f in staged]
    run_logger(log).debug("report %s", paths[1])
    return paths
