"""The report a film run leaves next to its output (`<out>.report.json` and `<out>.report.html`): per shot
its SMPTE timecode in/out at the film's rate (from the film's own start timecode), whether it was dubbed and
why, who (each dubbed face by its place in the frame, with a thumbnail in the HTML), where the speech the
decision listened to came from, the scores in words, its QC sheet and preview; then the run's outputs,
workspace and log.

`shot_entry` and `film_report` build the JSON-ready dict from records the caller read, `report_html`
renders it as one self-contained page (thumbnails inline); `face_thumbnail` decodes the one frame a face's
thumbnail is cut from. Nothing is written here.
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import opentimelineio as otio

from tasks.media.frames import read_frames
from tasks.media.probe import VideoInfo
from tasks.picture.geometry import ModelGeometry

log = logging.getLogger(__name__)

REPORT_FORMAT = 1

# what a region's status means, for a person reading the report
STATUS_WORDS = {
    "speaker": "sure: this face's lips follow the speech",
    "two": "two people speak at once: both faces dubbed",
    "uncertain": "uncertain: the likeliest face was dubbed",
    "forced": "forced (an override or the gate's policy): the largest moving face",
    "plan": "set in the shot plan",
}


def face_thumbnail(info: VideoInfo, frame: int, box: Sequence[float], height: int = 96) -> str | None:
    """A face as a small PNG data URI: display frame `frame` of the film, cropped to `box` (display pixels)
    with a margin; None when the frame cannot be decoded (logged: the report is written without it)."""
    try:
        picture = ModelGeometry.for_video(info, "480").to_display(read_frames(info, [frame])[frame])
    except Exception as exc:
        log.warning("report: frame %d not decoded for a thumbnail: %s", frame, exc)
        return None
    h, w = picture.shape[:2]
    x0, y0, x1, y1 = (float(v) for v in box)
    m = 0.25 * max(x1 - x0, y1 - y0)
    xa, ya, xb, yb = max(0, int(x0 - m)), max(0, int(y0 - m)), min(w, int(x1 + m)), min(h, int(y1 + m))
    if xb - xa < 2 or yb - ya < 2:
        return None
    crop = np.ascontiguousarray(picture[ya:yb, xa:xb])  # (h', w', 3) RGB
    size = (max(2, round(crop.shape[1] * height / crop.shape[0])), height)
    ok, png = cv2.imencode(
        ".png", cv2.cvtColor(cv2.resize(crop, size, interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2BGR)
    )
    return "data:image/png;base64," + base64.b64encode(png.tobytes()).decode() if ok else None


def smpte(frame: int, fps: Fraction, start_timecode: str | None = None) -> str:
    """Film frame `frame` as SMPTE timecode at `fps` from the film's start timecode (';' drop-frame at
    29.97/59.94, as OpenTimelineIO writes it). A rate SMPTE has no timecode for (a variable-rate film's
    average, say) counts non-drop frames at its rounded rate."""
    rate = float(fps)
    try:
        first = 0
        if start_timecode:
            first = round(otio.opentime.from_timecode(start_timecode.replace(".", ":"), rate).value)
        return otio.opentime.to_timecode(otio.opentime.RationalTime(first + frame, rate), rate)
    except ValueError:
        nominal = max(1, round(rate))
        first = 0
        if start_timecode:
            h, m, sec, ff = (int(x) for x in start_timecode.replace(";", ":").replace(".", ":").split(":"))
            first = ((h * 60 + m) * 60 + sec) * nominal + ff
        n = first + frame
        return f"{n // (3600 * nominal):02d}:{n // (60 * nominal) % 60:02d}:{n // nominal % 60:02d}:{n % nominal:02d}"


def position_words(box: Sequence[float], frame_hw: Sequence[int]) -> str:
    """Where a face box sits in the frame, in words: "left, upper third, medium close-up" (display pixels)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    h, w = (float(v) for v in frame_hw)
    cx, cy = (x0 + x1) / 2 / w, (y0 + y1) / 2 / h
    across = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "centre"
    down = "upper third" if cy < 1 / 3 else "lower third" if cy > 2 / 3 else "middle"
    share = (y1 - y0) / h
    size = "close-up" if share > 0.45 else "medium shot" if share > 0.2 else "wide (small face)"
    return f"{across}, {down}, {size}"


def score_words(score: float | None, status: str) -> str:
    """A region's score and status as a sentence (the score: the speaker analysis's confidence, 0-1)."""
    meaning = STATUS_WORDS.get(status, status)
    if score is None or status in ("forced", "plan"):
        return meaning
    level = "high" if score >= 0.7 else "moderate" if score >= 0.4 else "low"
    return f"{meaning} (confidence {level}, {score:.2f} of 1)"


def speech_words(speech: Mapping[str, Any] | None, source_audio: bool | None) -> str:
    """Where the speech the decision listened to came from, in words."""
    parts = []
    if speech is not None:
        parts.append(f"the dub track speaks {float(speech['speech_ratio']):.0%} of the shot")
    if source_audio is True:
        parts.append("who speaks was matched against the film's own dialogue")
    elif source_audio is False:
        parts.append("the film has no speech here, so who speaks was matched against the dub track")
    return "; ".join(parts) if parts else "no speech analysis (the decision did not need it)"


def dubbed_regions(decision: Mapping[str, Any], start: int) -> list[dict[str, Any]]:
    """The decision's dubbed regions as {frames (film), status, score, people: [{track, box}]}: from a
    kept decision (`ShotDecision.to_dict`: shot frames, boxes in its plan) or a planning record
    (`regions_json`: film frames, its box)."""
    details = decision.get("details")
    out = []
    for r in (details or {}).get("regions") if details else decision.get("regions") or []:
        plan = r.get("plan") if isinstance(r.get("plan"), dict) else {}
        box = plan.get("face_box") or plan.get("box") or r.get("box")
        offset = start if details else 0
        people = r.get("people") or [{"track": r.get("speaker")}]
        out.append(
            {
                "frames": [offset + int(r["start_frame"]), offset + int(r["end_frame"])],
                "status": str(r.get("status")),
                "score": r.get("score"),
                "people": [{"track": p.get("track"), "box": p.get("box") or box} for p in people],
            }
        )
    return out


def shot_entry(
    row: Mapping[str, Any],
    record: Mapping[str, Any],
    fps: Fraction,
    start_timecode: str | None,
    frame_hw: Sequence[int],
    decision: Mapping[str, Any] | None = None,
    qc: Mapping[str, Any] | None = None,
    thumbnails: Sequence[str | None] = (),
) -> dict[str, Any]:
    """One shot of the report. `row`: the shot table's row (`flows.report.shot_rows`); `record`: the film
    run's record (plan, key, the planning's decision); `frame_hw`: the film's display size; `decision`:
    the decision the shot kept beside its intermediate (`ShotDecision.to_dict`), else the planning's is
    used; `qc`: its QC record (preview, contact_sheet); `thumbnails`: an image URI per face of `who`."""
    plan = record["plan"]
    start, end = int(plan["start_frame"]), int(plan["end_frame"])
    decision = decision or record.get("decision") or {}
    details = decision.get("details") or {}
    faces = details.get("faces") or {}
    names = details.get("characters") or {}
    who = []
    for region in dubbed_regions(decision, start):
        for person in region["people"]:
            track, box = person["track"], person["box"]
            character = names.get(str(track)) or next(
                (r.get("character") for r in decision.get("regions") or [] if r.get("speaker") == track), None
            )
            who.append(
                {
                    "frames": region["frames"],
                    "track": track,
                    "character": character,
                    "place": position_words(box, frame_hw) if box else "whole frame",
                    "box": [round(float(v), 1) for v in box] if box else None,
                    "score": region["score"],
                    "status": region["status"],
                    "confidence": score_words(region["score"], region["status"]),
                }
            )
    for face, uri in zip(who, thumbnails, strict=False):
        face["thumbnail"] = uri
    status = row["status"]
    return {
        "shot": int(row["index"]),
        "frames": [start, end],
        "tc_in": smpte(start, fps, start_timecode),
        "tc_out": smpte(end, fps, start_timecode),  # exclusive, as an edit's record out
        "dubbed": status == "done",
        "status": {"done": "dubbed", "copied": "not dubbed (copied through)"}.get(status, status),
        "why": row.get("reason") or decision.get("reason") or "",
        "reused": bool(row.get("reused")),
        "who": who,
        "speech": speech_words(details.get("speech"), faces.get("source_audio") if faces else None),
        "qc_sheet": (qc or {}).get("contact_sheet"),
        "qc_preview": (qc or {}).get("preview"),
        "intermediate": row.get("output"),
    }


def film_report(
    source: str,
    video: Mapping[str, Any],
    shots: Sequence[Mapping[str, Any]],
    outputs: Mapping[str, str | None],
    workspace: str | None,
    log: str | None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The whole report: the film, every shot (`shot_entry`), the outputs {label: path}, workspace, log."""
    fps = Fraction(str(video["fps"]))
    return {
        "format": REPORT_FORMAT,
        "film": str(source),
        "fps": str(fps),
        "start_timecode": video.get("timecode") or smpte(0, fps),
        "frames": int(video["frame_count"]),
        "duration": smpte(int(video["frame_count"]), fps),
        "dubbed_shots": sum(1 for s in shots if s["dubbed"]),
        "shots": list(shots),
        "outputs": {k: v for k, v in outputs.items() if v},
        "workspace": workspace,
        "log": log,
        "notes": list(notes),
    }


def _link(path: str | None, text: str) -> str:
    if not path:
        return ""
    return f'<a href="{html.escape(Path(path).resolve().as_uri())}">{html.escape(text)}</a>'


def report_html(report: Mapping[str, Any]) -> str:
    """The report as one self-contained HTML page (thumbnails are data URIs; links are file:// URIs)."""
    e = html.escape
    rows = []
    for s in report["shots"]:
        who = "<br>".join(
            (f'<img src="{e(w["thumbnail"])}" alt="face" height="64"> ' if w.get("thumbnail") else "")
            + e(
                f"track {w['track']}" + (f" ({w['character']})" if w.get("character") else "")
                if w["track"] is not None
                else "no face"
            )
            + f"<br><small>{e(w['place'])}; {e(w['confidence'])}</small>"
            for w in s["who"]
        )
        qc = " ".join(x for x in (_link(s["qc_sheet"], "QC sheet"), _link(s["qc_preview"], "preview")) if x)
        rows.append(
            "<tr>"
            f"<td>{s['shot']:04d}</td><td>{e(s['tc_in'])}</td><td>{e(s['tc_out'])}</td>"
            f'<td class="{"dub" if s["dubbed"] else "nodub"}">{e(s["status"])}'
            f"{' (reused)' if s['reused'] else ''}</td>"
            f"<td>{e(s['why'])}</td><td>{who or '-'}</td><td>{e(s['speech'])}</td><td>{qc or '-'}</td>"
            "</tr>"
        )
    outputs = "".join(f"<li>{e(k)}: {_link(v, v)}</li>" for k, v in report["outputs"].items())
    extra = "".join(
        f"<li>{e(k)}: {_link(report[k], report[k]) if report[k] else 'not kept'}</li>"
        for k in ("workspace", "log")
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in report["notes"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dubflow report: {e(Path(report["film"]).name)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 6px;vertical-align:top;font-size:14px}}th{{background:#eee}}
.dub{{color:#060}}.nodub{{color:#666}}</style></head><body>
<h1>{e(Path(report["film"]).name)}</h1>
<p>{report["dubbed_shots"]} of {len(report["shots"])} shots dubbed; {report["frames"]} frames at {e(report["fps"])} fps,
start timecode {e(report["start_timecode"])}, duration {e(report["duration"])}.</p>
<ul>{notes}</ul>
<table><tr><th>shot</th><th>TC in</th><th>TC out</th><th>dubbed</th><th>why</th><th>who</th>
<th>speech</th><th>QC</th></tr>
{"".join(rows)}
</table>
<h2>Outputs</h2><ul>{outputs}{extra}</ul>
</body></html>
"""
