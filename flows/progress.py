"""What a film run shows in the Prefect UI: run names, per-shot progress, the shot table, the summary.

* every shot is a task run named like ``shot-0042 00:12:03.125-00:12:09.000`` (``shot_run_name``);
* each shot has a progress artifact updated once per chunk (``ShotProgress``, usable as the
  ``on_progress(fraction)`` callback of the per-shot renderer);
* the film run has a table artifact with the shot plan and each shot's status/reason
  (``publish_shot_table``), and a final markdown + link artifact with the output and timings
  (``publish_summary``).

Artifact keys may only hold ``[a-z0-9-]``; ``artifact_key`` makes one from any parts. A keyed artifact
is listed (and versioned per run) on the Artifacts page; the film key keeps runs of one film together.
"""

from __future__ import annotations

import io
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

log = logging.getLogger(__name__)

SHOT_TABLE_COLUMNS = ("shot", "start", "end", "frames", "chunks", "backend", "status", "reused", "reason")


def artifact_key(*parts: str | int) -> str:
    """Join ``parts`` into a valid artifact key: lowercase, runs of other characters become one dash."""
    text = "-".join(str(p) for p in parts).lower()
    key = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    if not key:
        raise ValueError(f"artifact_key: nothing usable in {parts!r}")
    return key


def timecode(seconds: float) -> str:
    """``HH:MM:SS.mmm`` (millisecond rounding), e.g. 723.125 -> ``00:12:03.125``."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"timecode: expected a finite time >= 0, got {seconds}")
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}.{ms:03d}"


def shot_run_name(index: int, start_s: float, end_s: float) -> str:
    """Task run name of a shot: ``shot-0042 00:12:03.125-00:12:09.000`` (end exclusive).

    ASCII only: the UI's run graph draws names with an ASCII bitmap font, so an en dash would vanish.
    """
    return f"shot-{index:04d} {timecode(start_s)}-{timecode(end_s)}"


class ShotProgress:
    """A shot's progress artifact; call it with the done fraction in [0, 1] after each chunk.

    Progress is UI telemetry: an API error while updating is logged, never raised, so a hiccup of the
    server cannot fail a long GPU shot.
    """

    def __init__(self, key: str, description: str) -> None:
        self.key = key
        self.artifact_id: UUID = create_progress_artifact(0.0, key=key, description=description)
        self.percent = 0.0

    def __call__(self, fraction: float) -> None:
        percent = round(100.0 * min(max(fraction, 0.0), 1.0), 2)
        if percent == self.percent:
            return
        try:
            update_progress_artifact(artifact_id=self.artifact_id, progress=percent)
        except Exception as exc:  # telemetry must not fail the shot
            log.warning("progress artifact %s: update to %.1f%% failed: %s", self.key, percent, exc)
            return
        self.percent = percent


def shot_table_rows(shots: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the shot table from records with ``index``, ``start_s``, ``end_s`` and optionally
    ``frames``, ``chunks``, ``backend``, ``status``, ``reused`` (result from an earlier run), ``speaker``,
    ``score``, ``agreement`` (each face track's audio-visual agreement with the speech), ``lips`` (the output
    check: the dubbed lips' fit to the dub's words, REVIEW when flagged), ``answered by`` (who settled its uncertain turns in the review step: a person,
    a character's answer or the policy), ``reason``."""
    rows = []
    reviewed = any("answered by" in shot for shot in shots)  # the review step ran (flows/review.py)
    for shot in shots:
        rows.append(
            {
                "shot": f"{int(shot['index']):04d}",
                "start": timecode(float(shot["start_s"])),
                "end": timecode(float(shot["end_s"])),
                "frames": shot.get("frames", ""),
                "chunks": shot.get("chunks", ""),
                "backend": shot.get("backend", ""),
                "status": shot.get("status", "pending"),
                "reused": "yes" if shot.get("reused") else "",
                "speaker": shot.get("speaker", ""),
                "score": shot.get("score", ""),
                "agreement": shot.get("agreement", ""),
                "lips": shot.get("lips", ""),
                **({"answered by": shot.get("answered by", "")} if reviewed else {}),
                "reason": shot.get("reason") or "",
            }
        )
    return rows


def publish_shot_table(key: str, shots: Sequence[Mapping[str, Any]], description: str) -> UUID:
    """Table artifact of the shot plan / shot states (see ``shot_table_rows``)."""
    return create_table_artifact(shot_table_rows(shots), key=key, description=description)


def publish_summary(
    key: str,
    *,
    title: str,
    output: str | Path,
    timings: Mapping[str, float],
    notes: Sequence[str] = (),
) -> tuple[UUID, UUID]:
    """Final markdown artifact (output path, timings, notes) and a ``file://`` link to the output."""
    out = Path(output).resolve()
    lines = [f"# {title}", "", f"Output: `{out}`", "", "| stage | seconds |", "|---|---:|"]
    lines += [f"| {stage} | {seconds:.1f} |" for stage, seconds in timings.items()]
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    md = create_markdown_artifact("\n".join(lines) + "\n", key=key, description=title)
    link = create_link_artifact(out.as_uri(), link_text=out.name, key=f"{key}-output", description=title)
    return md, link


class TqdmToLogger(io.StringIO):
    """File-like sink for ``tqdm(file=...)`` that forwards each refresh to a logger (e.g. the run
    logger), since tqdm's stderr never reaches the Prefect UI. Pair with ``mininterval`` to limit lines."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter, level: int = logging.INFO) -> None:
        super().__init__()
        self.logger = logger
        self.level = level

    def write(self, buf: str) -> int:
        text = buf.strip("\r\n\t ")
        if text:
            self.logger.log(self.level, text)
        return len(buf)

    def flush(self) -> None:
        pass


def attempt_phases(states: Sequence[Any]) -> list[dict[str, float]]:
    """(pickup, start, run) seconds of every attempt of a flow run, from its state history.

    pickup = Scheduled -> Pending (worker poll, or waiting for a busy worker), start = Pending ->
    Running (process start, imports, pull step, flow load), run = Running -> final state.
    """
    out: list[dict[str, float]] = []
    current: dict[str, Any] = {}
    for state in sorted(states, key=lambda s: s.timestamp):
        kind = state.type.value
        if kind == "SCHEDULED":
            current = {kind: state.timestamp}
        elif kind in ("PENDING", "RUNNING"):
            current.setdefault(kind, state.timestamp)
        elif state.is_final() and {"SCHEDULED", "PENDING", "RUNNING"} <= set(current):
            out.append(
                {
                    "pickup_s": (current["PENDING"] - current["SCHEDULED"]).total_seconds(),
                    "start_s": (current["RUNNING"] - current["PENDING"]).total_seconds(),
                    "run_s": (state.timestamp - current["RUNNING"]).total_seconds(),
                }
            )
            current = {}
    return out
