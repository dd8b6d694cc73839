"""The film run's last step: the film assembled from its verified shots, the edit-suite timeline and the
run report delivered next to it (`deliver`), and the summary artifact (`publish_film_summary`). `Rendered` is
what rendering the shot groups leaves for them. No rendering here.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.film_tasks import (
    assemble_film,
    export_timeline,
    timeline_paths,
)
from flows.progress import artifact_key, publish_summary
from flows.run_report import write_run_report
from tasks.backends import settings_hook
from tasks.config.pipeline import PipelineConfig
from tasks.render.shot import PREVIEW_LABEL
from tasks.run.outputs import output_comment
from tasks.run.workspace import (
    Workspace,
    read_shot_done,
)
from tasks.timeline.export import EXTRA_FORMATS


@dataclass
class Rendered:
    """What `render_groups` leaves for delivery and the summary."""

    rows: list[dict[str, Any]]  # the shot table's rows after rendering
    groups: list[Any]  # flows.groups.Group
    shares: list[float]  # the model-load share per group (plan)
    reused: set[int]  # shots complete before this run
    per_stage: dict[str, float]  # summed per-shot stage timings


def deliver(
    runner: Any, ws: Workspace, film: dict[str, Any], records: list[dict[str, Any]], rendered: Rendered,
    out: str, audio_path: str, pad: bool, cfg: PipelineConfig, dest: Any = None,
    inputs: dict[str, list[int | str]] | None = None,
) -> dict[str, str]:  # fmt: skip
    """The film assembled from the verified shot results, its edit-suite timeline, the workspace removed
    when `workspace.keep` is off: {"output", "timeline"}. `dest`: the claimed output
    (`tasks.run.outputs.claim_output`), re-checked at each final rename."""
    name, cfgd, rows = Path(film["source"]).name, film["config"], rendered.rows
    paths = [r["output"] for r in rows]
    files = [(read_shot_done(ws, r["index"], r["key"]) or {}).get("result", {}).get("file") for r in records]
    final = runner.call(
        assemble_film, film["video"], paths, out, audio_path, pad, cfgd, str(ws.path), name=name, records=files,
        stamp=output_comment(ws.key, PREVIEW_LABEL if cfg.workspace.preview else None), dest=dest, key=ws.key,
        noted=inputs,
    )  # fmt: skip
    args = (final, film["source"], film["video"], records, rows, audio_path, cfgd)
    timeline = runner.call(export_timeline, *args, name=name, dest=dest, key=ws.key, noted=inputs)
    sidecars = dict(
        zip(("dub audio (48 kHz WAV)", "timeline (OTIO)"), timeline_paths(final, cfgd), strict=False)
    )
    sidecars |= {f"timeline ({EXTRA_FORMATS[n][0]})": str(Path(final).with_suffix(EXTRA_FORMATS[n][1]))
                 for n in EXTRA_FORMATS if getattr(cfg.timeline, n)}  # fmt: skip
    report = runner.call(
        write_run_report, final, film["source"], film["video"], records, rows, ws.as_dict(),
        {"film": final, **sidecars}, cfg.workspace.keep, _run_notes(cfg), name=name, dest=dest, key=ws.key,
    )  # fmt: skip
    if not cfg.workspace.keep:
        shutil.rmtree(ws.path, ignore_errors=True)
    return {"output": final, "timeline": timeline, "report": report[1]}


def _run_notes(cfg: PipelineConfig) -> list[str]:
    """What a reader of the report must not miss about this run's settings."""
    notes = []
    if cfg.backend.name == "passthrough":
        notes.append("DRY RUN: passthrough backend, the film is NOT dubbed")
    elif (hook := settings_hook(cfg.backend.name, "run_notes")) is not None:
        notes += hook(cfg.sections)  # the backend's own (the tiny random model's label)
    if cfg.workspace.preview:
        notes.append("PREVIEW PASS (configs/preview.yaml): fast settings, not the final dub")
    return notes


def publish_film_summary(
    runner: Any, film: dict[str, Any], records: list[dict[str, Any]], rendered: Rendered,
    final: dict[str, str], timings: dict[str, float], cfg: PipelineConfig,
) -> None:  # fmt: skip
    """The run's summary artifact: timings and what was (not) dubbed."""
    shares, preview = rendered.shares, cfg.workspace.preview
    notes = [
        f"{len(records)} shots in {len(rendered.groups)} group(s), fan-out {runner.fanout}, backend {cfg.backend.name}",
        f"{len(rendered.reused)} shot(s) reused from earlier runs, {len(records) - len(rendered.reused)} rendered",
        f"edit-suite timeline: {final['timeline']}",
        f"report: {final['report']}",
        f"model-load share per group (plan): {100 * min(shares):.1f}-{100 * max(shares):.1f} %",
    ]
    if cfg.backend.name == "passthrough":
        notes.append("DRY RUN: passthrough backend, the film is NOT dubbed")
    if preview:
        notes.append("PREVIEW PASS (configs/preview.yaml): fast settings, not the final dub")
    runner.publish(
        publish_summary, artifact_key(film["tag"], "summary"), output=final["output"], timings=timings,
        title=f"{Path(film['source']).name} dubbed{' (PREVIEW)' if preview else ''}", notes=notes,
    )  # fmt: skip
