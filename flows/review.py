"""The review step of `dub-film` (`review.enabled`): one pause of the film run for the turns that stay uncertain.

After every shot is rendered (the uncertain turns under `speaker.uncertain`, so each has a QC preview) the
CPU-pool parent pauses ONCE (`pause_flow_run(wait_for_input=...)`; the group runs are over, no GPU worker is
held) with a form built at run time: one dropdown per uncertain turn (each face on screen, "nobody on
screen", "use the policy"; default the policy) and a markdown description holding a data-URI JPEG contact
sheet of the faces labelled as the choices, each turn's timecodes and a link to its QC preview.

The deadline: a thread resumes the run with the defaults at `review.timeout_s` (the pause's own timeout is
set past it and never reached: an expired pause ends the run Failed, PrefectHQ/prefect#11414), so the film
completes with the policy. The answers (`tasks.decision.review.settle`: one answer carries to the same
character's other uncertain turns) go into the film's plan file and into the shots' overrides; the caller
re-keys those shots, so only the shots whose decision changed render again.

`dubflow dub` (a local run) never pauses: `log_uncertain` lists the turns and the plan file to edit.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from prefect import task
from pydantic import Field, create_model

from flows.film_steps import FlowSteps
from flows.runtime import run_logger
from tasks.config.pipeline import PipelineConfig
from tasks.decision.cast import plan_cast
from tasks.decision.review import (
    POLICY,
    Settled,
    UncertainTurn,
    answer_overrides,
    contact_sheet,
    face_label,
    fresh_plan,
    parse_choice,
    plan_answers,
    settle,
    write_answers,
)
from tasks.decision.shot_decision import faces_made_from, faces_path
from tasks.errors import DubflowError
from tasks.files import read_bound_json
from tasks.media.intermediates import read_marker
from tasks.media.probe import VideoInfo
from tasks.perception.face_analysis import ShotFaces, source_samples
from tasks.run.workspace import Workspace, read_shot_done
from tasks.timeline.shot_key import shot_config

log = logging.getLogger(__name__)

QC_RECORD = "qc.json"  # flows.shot_task.QC_RECORD (not imported: that module pulls the render stack)
DEADLINE_BY = "deadline"


def qc_preview(ws: Workspace, record: Mapping[str, Any]) -> str | None:
    """The shot's QC preview mp4 (source | dub), when it was written."""
    done = read_shot_done(ws, record["index"], record["key"]) or {}
    qc = (done.get("result") or {}).get("qc") or read_marker(
        ws.shot_dir(record["index"], record["key"]) / QC_RECORD
    )
    path = (qc or {}).get("preview")
    return str(Path(path).resolve()) if path and Path(path).is_file() else None


def review_form(turns: Sequence[UncertainTurn], fps: Fraction, previews: Mapping[int, str | None]) -> type:
    """The RunInput model of the form: one Literal field per turn, default "use the policy"."""
    from prefect.input import RunInput

    fields: dict[str, Any] = {}
    for t in turns:
        policy = "nobody" if t.policy is None else face_label(t.policy)
        where = f"; QC preview: {previews[t.shot]}" if previews.get(t.shot) else ""
        fields[t.field] = (
            Literal[t.choices()],  # type: ignore[valid-type]
            Field(
                default=POLICY,
                title=f"shot {t.shot} {t.span(fps)}",
                description=f"who speaks in shot {t.shot}, {t.span(fps)} (the policy dubs {policy}){where}",
            ),
        )
    return create_model("DubReview", __base__=RunInput, **fields)


def review_description(
    turns: Sequence[UncertainTurn], fps: Fraction, previews: Mapping[int, str | None], sheet_jpeg: bytes,
    deadline: datetime, plan_file: str,
) -> str:  # fmt: skip
    """The form's markdown: what to do, the contact sheet (data URI), one table row per turn."""
    uri = "data:image/jpeg;base64," + base64.b64encode(sheet_jpeg).decode()
    lines = [
        f"### {len(turns)} turn(s) the analysis left uncertain",
        "Pick who speaks in each turn: the faces below are labelled exactly as the choices. "
        f'"{POLICY}" keeps `speaker.uncertain`; one answer also settles the same character\'s other '
        f"uncertain turns. Without an answer by {deadline:%Y-%m-%d %H:%M:%S} UTC the run goes on with the "
        f"policy. Answers are kept in `{plan_file}`.",
        "",
        f"![faces of the uncertain turns]({uri})",
        "",
        "| shot | timecode | faces | policy | QC |",
        "|---|---|---|---|---|",
    ]
    for t in turns:
        policy = "nobody" if t.policy is None else face_label(t.policy)
        link = f"[preview]({Path(previews[t.shot]).as_uri()})" if previews.get(t.shot) else "-"
        faces = " ".join(str(f["track"]) for f in t.faces) or "-"
        lines.append(f"| {t.shot} | {t.span(fps)} | {faces} | {policy} | {link} |")
    return "\n".join(lines)


def sheet_frames(video: Mapping[str, Any], turns: Sequence[UncertainTurn]) -> dict[int, Any]:
    """The film frames the contact sheet crops the faces from (display orientation, RGB)."""
    from tasks.media.frames import read_frames

    wanted = {f["frame"] for t in turns for f in t.faces}
    return read_frames(VideoInfo.from_dict(dict(video)), wanted) if wanted else {}


def _resume_at_deadline(run_id: Any, timeout_s: float, defaults: dict[str, str], stop: threading.Event,
                        fired: list[bool]) -> None:  # fmt: skip
    """At the deadline, resume the paused run with every field at its default (the policy)."""
    if stop.wait(timeout_s):
        return
    from prefect.client.orchestration import get_client

    for _attempt in range(30):  # the pause may still be being set when the deadline is very short
        if stop.is_set():
            return
        try:
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(run_id)
                if not run.state.is_paused():
                    time.sleep(1)
                    continue
                result = client.resume_flow_run(run_id, run_input=defaults)
            if getattr(result, "status", None) is not None and str(result.status.value).upper() == "ACCEPT":
                fired.append(True)
                log.info("review deadline: resumed with the policy")
                return
        except Exception as exc:  # an API hiccup: try again
            log.warning("review deadline: resume failed (%s); retrying", exc)
        time.sleep(1)


def ask_once(
    turns: Sequence[UncertainTurn], video: Mapping[str, Any], previews: Mapping[int, str | None],
    timeout_s: float, plan_file: str, key: str,
) -> tuple[dict[str, str], bool]:  # fmt: skip
    """Pause this flow run once for ``turns``: ({field: choice}, whether the deadline answered)."""
    from prefect.flow_runs import pause_flow_run
    from prefect.runtime import flow_run

    fps = Fraction(video["fps"])
    sheet = contact_sheet(turns, sheet_frames(video, turns), fps)
    deadline = datetime.now(UTC) + timedelta(seconds=timeout_s)
    form = review_form(turns, fps, previews)
    description = review_description(turns, fps, previews, sheet, deadline, plan_file)
    defaults = {t.field: POLICY for t in turns}
    stop, fired = threading.Event(), []
    thread = threading.Thread(
        target=_resume_at_deadline, args=(flow_run.id, timeout_s, defaults, stop, fired), daemon=True,
        name="review-deadline",
    )  # fmt: skip
    run_logger(log).info(
        "review: %d uncertain turn(s); the run pauses for answers until %s UTC (contact sheet %d bytes)",
        len(turns), f"{deadline:%H:%M:%S}", len(sheet),
    )  # fmt: skip
    thread.start()
    try:
        answer = pause_flow_run(
            wait_for_input=form.with_initial_data(description=description),
            timeout=int(timeout_s) + 3600,  # never reached: the deadline thread resumes first
            poll_interval=2,
            key=key,
        )
    finally:
        stop.set()
    values = {t.field: str(getattr(answer, t.field, POLICY)) for t in turns}
    return values, bool(fired)


def review_notes(settled: Sequence[Settled], by_deadline: bool) -> dict[int, str]:
    """The shot table's `answered by` cell per shot with uncertain turns."""
    out: dict[int, list[str]] = {}
    for s in settled:
        who = "nobody" if s.speaker is None else face_label(s.speaker)
        if s.by == "policy":
            text = f"policy ({who}{', deadline' if by_deadline else ''})"
        else:
            text = f"{s.by}: {who}"
        out.setdefault(s.turn.shot, []).append(text)
    return {shot: "; ".join(v) for shot, v in out.items()}


def log_uncertain(turns: Sequence[UncertainTurn], fps: Fraction, plan_file: str | None) -> None:
    """A local run's closing list: each uncertain turn and what the policy dubbed, and the plan to edit."""
    logger = run_logger(log)
    for t in turns:
        policy = "nobody" if t.policy is None else face_label(t.policy)
        faces = ", ".join(face_label(f["track"]) for f in t.faces) or "none"
        logger.warning(
            "uncertain turn: shot %d %s (faces on screen: %s): the policy dubbed %s",
            t.shot,
            t.span(fps),
            faces,
            policy,
        )
    if plan_file:
        logger.warning(
            "%d uncertain turn(s): to settle them, set `answers:` (or `speaker:`) in %s and run again with --plan %s",
            len(turns), plan_file, plan_file,
        )  # fmt: skip


__all__ = ["ask_once", "log_uncertain", "parse_choice", "qc_preview", "review_description", "review_form",
           "review_notes"]  # fmt: skip


def review_step(
    runner: Any, steps: FlowSteps, film: dict[str, Any], prepared: Any, cfg: PipelineConfig,
    turns: list[Any], plan_path: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """Pause once for the uncertain `turns` (`flows.review.ask_once`), settle them (a person, the same
    character, or the policy), put the answers into the plan file and the shots' overrides, re-key and
    re-decide those shots: the film's records, which the flow renders again (only the shots whose key
    changed render)."""
    ws, records, video = steps.ws, prepared.records, prepared.video
    assert ws is not None
    by_index = {r["index"]: r for r in records}
    shots = sorted({t.shot for t in turns})
    spans = [[t.shot, t.start_frame, t.end_frame] for t in turns]
    ids = runner.call(
        review_identities, video, records, spans, film["config"], str(ws.path), name=film["tag"]
    )
    characters = {(int(i), int(k)): str(c) for i, k, c in ids["faces"]}
    voices = {t.field: ids["voices"].get(f"{t.shot}:{t.start_frame}:{t.end_frame}") for t in turns}
    previews = {i: qc_preview(ws, by_index[i]) for i in shots}
    key = f"review-{ws.key[:12]}"
    values, by_deadline = ask_once(turns, video, previews, cfg.review.timeout_s, plan_path, key)
    settled = settle(turns, values, characters, voices, cfg.speaker.voice_min_cos)
    answers = plan_answers(settled)
    notes = review_notes(settled, by_deadline)
    logger = run_logger(log)
    for s in settled:
        logger.info("review: shot %d %s -> %s (%s)", s.turn.shot, s.turn.field, s.speaker, s.by)
    if answers:
        fps = Fraction(video["fps"])
        fresh = fresh_plan(
            film["source"], prepared.track.source, fps, video["frame_count"], records, film["config"]
        )
        try:
            write_answers(plan_path, answers, fresh)
            logger.info("review: answers for shot(s) %s written to %s", sorted(answers), plan_path)
        except DubflowError as exc:  # e.g. a plan dubflow did not write: this run still applies them
            logger.warning("review: answers not kept in %s (%s); this run applies them", plan_path, exc)
        changed = [
            {**by_index[i], "overrides": answer_overrides(by_index[i].get("overrides"), i, a)}
            for i, a in sorted(answers.items())
        ]
        changed = steps.keyed(changed, prepared.track.to_dict(), prepared.stems)
        decisions = steps.decide(video, changed, prepared.track.to_dict())
        for r in changed:
            by_index[r["index"]] = {**r, "decision": decisions[r["index"]]}
    records = [{**by_index[r["index"]], **({"review": notes[r["index"]]} if r["index"] in notes else {})}
               for r in records]  # fmt: skip
    return records


@task(task_run_name="review identities {name}")
def review_identities(
    video: dict[str, Any], records: list[dict[str, Any]], turns: list[list[int]], config: dict[str, Any],
    work_dir: str, name: str = "",
) -> dict[str, Any]:  # fmt: skip
    """Who is who in the review's uncertain ``turns`` ([[shot, start_frame, end_frame]], film frames):
    {"faces": [[shot, track, character]], "voices": {"shot:start:end": voice embedding or None}}. The
    characters are the planning's own where the run linked them (`cast.shot`), else a link over just these
    shots' tracks (face embeddings next to their cached face analyses); each voice is the GE2E embedding of the
    film's own audio over the turn (None without audio or under `speaker.voice_min_s`)."""
    by_index = {r["index"]: r for r in records}
    shots = sorted({t[0] for t in turns})
    info = VideoInfo.from_dict(video)
    linked = [((by_index[i].get("overrides") or {}).get("cast") or {}).get("shot") for i in shots]
    if all(shot and shot.get("tracks") for shot in linked):
        faces = [
            [i, int(k), v] for i, shot in zip(shots, linked, strict=True) for k, v in shot["tracks"].items()
        ]
    else:

        def faces_of(index: int) -> tuple[ShotFaces | None, Path | None]:
            r = by_index[index]
            cfg_i = PipelineConfig.from_dict(shot_config(config, r.get("overrides")))
            cache = faces_path(work_dir, index, r["plan"]["start_frame"], r["plan"]["end_frame"], cfg_i)
            made_from = faces_made_from(info, r["plan"]["start_frame"], r["plan"]["end_frame"], cfg_i)
            saved = read_bound_json(cache, made_from, "face analysis") if cache.is_file() else None
            return (None, None) if saved is None else (ShotFaces.from_dict(saved), cache)

        spans = [(i, by_index[i]["plan"]["start_frame"], by_index[i]["plan"]["end_frame"]) for i in shots]
        cast = plan_cast(info, spans, faces_of, PipelineConfig.from_dict(config))
        faces = [
            [i, int(k), v] for i in shots for k, v in (cast.shots.get(i) or {}).get("tracks", {}).items()
        ]
    cfg = PipelineConfig.from_dict(config)
    voices: dict[str, Any] = {}
    long_enough = [t for t in turns if (t[2] - t[1]) / float(info.fps) >= cfg.speaker.voice_min_s]
    if len(turns) > 1 and long_enough and info.audio:
        from model.speaker.voice_id import embed_many, load_voice_encoder  # torch: only for several turns

        wavs = [source_samples(info, t[1], t[2]) for t in long_enough]
        if all(w is not None for w in wavs):
            emb = embed_many(load_voice_encoder(), wavs)
            voices = {
                f"{t[0]}:{t[1]}:{t[2]}": [round(float(v), 6) for v in e]
                for t, e in zip(long_enough, emb, strict=True)
            }
    run_logger(log).info(
        "review: %d face(s) of %d shot(s) in characters, %d turn voice(s)",
        len(faces),
        len(shots),
        len(voices),
    )
    return {"faces": faces, "voices": voices}
