"""The review step's logic: which turns stay uncertain, the choices a person gets for each, how answers
settle turns (one answer carried to the same character's other uncertain turns) and how they are written
into the film's shot plan (`answers:` override fields, `tasks.decision.plan_file`).

The Prefect side (the pause, its form and deadline) is `flows/review.py`; this module holds plain records
and rules only, plus the contact sheet (face crops labelled exactly as the form's choices), so the rules
are tested without a server. Must not run models.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from tasks.backends import plan_auto
from tasks.decision.plan_file import plan_document, read_plan, timecode, write_plan
from tasks.decision.record import ShotDecision

NOBODY = "nobody on screen"
POLICY = "use the policy"


def face_label(track: int) -> str:
    """The choice (and contact-sheet label) naming face track ``track``."""
    return f"face {track}"


def uncertain_of(d: ShotDecision, shot_start: int) -> list[dict[str, Any]]:
    """The shot's uncertain turns as JSON-ready records (film frames): the policy's track and every moving
    face on screen during the turn with its box (display pixels) nearest the turn's middle frame."""
    out = []
    if d.faces is None:
        return out
    for turn in d.turns:
        if turn.status != "uncertain":
            continue
        mid = (turn.start + turn.end) // 2
        faces = []
        for tr in d.faces.tracks:
            if tr.still or tr.end_frame <= turn.start or tr.start_frame >= turn.end:
                continue
            samples = tr.samples(turn.start, turn.end) or tr.samples()
            if not samples:
                continue
            _t, box = min(samples, key=lambda s: abs(s[0] - mid))
            faces.append(
                {"track": tr.id, "frame": shot_start + _t, "box": [int(v) for v in box],
                 "character": d.characters.get(str(tr.id))}
            )  # fmt: skip
        out.append(
            {"start_frame": shot_start + turn.start, "end_frame": shot_start + turn.end, "policy": turn.track,
             "faces": faces}
        )  # fmt: skip
    return out


@dataclass(frozen=True)
class UncertainTurn:
    """One uncertain turn of the film, as the form asks about it."""

    shot: int
    start_frame: int  # film frames, end exclusive
    end_frame: int
    policy: int | None  # the track `speaker.uncertain` dubs (None: nobody)
    faces: tuple[dict[str, Any], ...]  # {"track", "frame", "box", "character"}

    @property
    def field(self) -> str:
        """The form field's name (a Python identifier, unique in the film)."""
        return f"shot_{self.shot:04d}_frames_{self.start_frame}_{self.end_frame}"

    def choices(self) -> tuple[str, ...]:
        return (*(face_label(f["track"]) for f in self.faces), NOBODY, POLICY)

    def span(self, fps: Fraction) -> str:
        return f"{timecode(self.start_frame, fps)}-{timecode(self.end_frame, fps)}"

    def character_of(self, track: int | None) -> str | None:
        return next((f.get("character") for f in self.faces if f["track"] == track), None)


def film_turns(records: Sequence[Mapping[str, Any]]) -> list[UncertainTurn]:
    """Every uncertain turn of the film in film order (from the planning's decisions)."""
    out = []
    for r in sorted(records, key=lambda r: r["index"]):
        for u in (r.get("decision") or {}).get("uncertain") or ():
            out.append(
                UncertainTurn(r["index"], u["start_frame"], u["end_frame"], u["policy"], tuple(u["faces"]))
            )
    return out


@dataclass(frozen=True)
class Settled:
    """How one uncertain turn was settled: the track dubbed (None: nobody) and by whom."""

    turn: UncertainTurn
    speaker: int | None
    by: str  # "person" | "character <id> (shot N)" | "policy"

    @property
    def changed(self) -> bool:
        return self.by != "policy" and self.speaker != self.turn.policy


def parse_choice(turn: UncertainTurn, choice: str) -> tuple[bool, int | None]:
    """(answered, track) of a form value: (False, policy) for the policy, (True, None) for nobody."""
    if choice == POLICY:
        return False, turn.policy
    if choice == NOBODY:
        return True, None
    m = re.fullmatch(r"face (\d+)", choice)
    if m is None or int(m.group(1)) not in [f["track"] for f in turn.faces]:
        raise ValueError(f"shot {turn.shot}: {choice!r} is not one of {list(turn.choices())}")
    return True, int(m.group(1))


def settle(
    turns: Sequence[UncertainTurn],
    answers: Mapping[str, str],
    characters: Mapping[tuple[int, int], str],
    voices: Mapping[str, Sequence[float] | None] | None = None,
    min_cos: float = 0.6,
) -> list[Settled]:
    """Each turn settled: a person's answer; else the face of a character a person named elsewhere, when it is
    the only such character on screen and (with ``voices``) the turn's voice is that answer's (cosine of the
    voice embeddings >= ``min_cos``: the same character, and the same person speaking); else the policy.
    ``characters``: {(shot, track): character id} of the turns' faces (empty: no character links);
    ``voices``: {turn field: unit voice embedding of the film's own audio over the turn, or None}."""
    out: dict[str, Settled] = {}
    named: dict[str, list[UncertainTurn]] = {}  # character -> the turns a person answered with it
    for turn in turns:
        answered, track = parse_choice(turn, answers.get(turn.field, POLICY))
        if answered:
            out[turn.field] = Settled(turn, track, "person")
            ch = characters.get((turn.shot, track)) if track is not None else None
            if ch is not None:
                named.setdefault(ch, []).append(turn)

    def same_voice(turn: UncertainTurn, answered: UncertainTurn) -> bool:
        if voices is None:
            return True
        a, b = voices.get(turn.field), voices.get(answered.field)
        return a is not None and b is not None and float(np.dot(a, b)) >= min_cos

    for turn in turns:
        if turn.field in out:
            continue
        carried = []
        for f in turn.faces:
            ch = characters.get((turn.shot, f["track"]))
            source = next((a for a in named.get(ch, ()) if same_voice(turn, a)), None) if ch else None
            if source is not None:
                carried.append((ch, f["track"], source))
        if len(carried) == 1:  # exactly one answered character on screen, speaking in its voice
            ch, track, source = carried[0]
            out[turn.field] = Settled(turn, track, f"character {ch} (shot {source.shot})")
        else:
            out[turn.field] = Settled(turn, turn.policy, "policy")
    return [out[t.field] for t in turns]


def plan_answers(settled: Sequence[Settled]) -> dict[int, list[dict[str, Any]]]:
    """{shot: [{start_frame, end_frame, speaker, by}]} of the turns a person (or a character) settled."""
    out: dict[int, list[dict[str, Any]]] = {}
    for s in settled:
        if s.by != "policy":
            t = s.turn
            entry = {"start_frame": t.start_frame, "end_frame": t.end_frame, "speaker": s.speaker, "by": s.by}
            out.setdefault(t.shot, []).append(entry)
    return out


def answer_overrides(overrides: Mapping[str, Any] | None, index: int, answers: list[dict[str, Any]]) -> dict:
    """A shot's nested config overrides with its review answers (``gate.answers``), as the plan file's
    `answers:` field gives them (`tasks.decision.plan_file.to_config_overrides`: same effective config, same
    shot key, so a re-run with the plan file reuses the shot)."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in (overrides or {}).items()}
    keep = [{k: a[k] for k in ("start_frame", "end_frame", "speaker")} for a in answers]
    out["gate"] = {**dict(out.get("gate") or {}), "answers": {str(index): keep}}
    return out


def write_answers(
    path: str | Path, answers: Mapping[int, list[dict[str, Any]]], fresh: Mapping[str, Any] | None
) -> Path:
    """Put each shot's answers into the plan file at ``path`` (its `override.answers`), keeping everything
    else; ``fresh``: the plan document to start from when the file does not exist yet."""
    import yaml

    path = Path(path)
    if path.exists():
        read_plan(path)  # a dubflow shot plan, else a one-line ConfigError (never overwrite another file)
        doc = yaml.safe_load(path.read_text())
    else:
        if fresh is None:
            raise ValueError(f"{path}: no plan file to add answers to")
        doc = dict(fresh)
    for entry in doc["shots"]:
        if entry["index"] in answers:
            entry.setdefault("override", {})["answers"] = list(answers[entry["index"]])
    return write_plan(path, doc)


def fresh_plan(
    film: str,
    audio: str,
    fps: Fraction,
    frame_count: int,
    records: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
) -> dict[str, Any]:
    """The plan document `dubflow plan --out` would write, from the film run's planned records."""
    shots = []
    for r in records:
        d = r.get("decision") or {"dub": False, "reason": "", "regions": []}
        shots.append(
            {"index": r["index"], "start_frame": r["plan"]["start_frame"], "end_frame": r["plan"]["end_frame"],
             "dub": d["dub"], "reason": d["reason"],
             "regions": [{k: v for k, v in g.items() if k != "people"} for g in d.get("regions") or ()],
             "backend": plan_auto(config, r["index"])}
        )  # fmt: skip
    return plan_document(film, audio, fps, frame_count, shots)


# ------------------------------------------------------------------------------------ contact sheet

CELL = 96  # px: each face crop's height on the sheet
LABEL_H = 18


def contact_sheet(turns: Sequence[UncertainTurn], frames: Mapping[int, np.ndarray], fps: Fraction) -> bytes:
    """A small JPEG: one row per turn ("shot N hh:mm:ss.mmm-..."), then each face on screen cropped from the
    film frame ``frames[face["frame"]]`` (RGB, display pixels) and labelled as its choice ("face 1")."""
    rows = []
    for turn in turns:
        cells = [_text_cell(f"shot {turn.shot}", turn.span(fps), width=200)]
        for f in turn.faces:
            frame = frames.get(f["frame"])
            if frame is None:
                continue
            cells.append(_face_cell(frame, f["box"], face_label(f["track"])))
        rows.append(np.concatenate(cells, axis=1))
    width = max(r.shape[1] for r in rows)
    sheet = np.concatenate(
        [np.pad(r, ((0, 2), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows], axis=0
    )
    ok, jpg = cv2.imencode(".jpg", cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 80])
    assert ok
    return jpg.tobytes()


def _face_cell(frame: np.ndarray, box: Sequence[int], label: str) -> np.ndarray:
    h, w = frame.shape[:2]
    x0, y0, x1, y1 = box
    mx, my = (x1 - x0) // 3, (y1 - y0) // 3  # a margin around the face box
    crop = frame[max(0, y0 - my) : min(h, y1 + my), max(0, x0 - mx) : min(w, x1 + mx)]
    scale = CELL / max(1, crop.shape[0])
    crop = cv2.resize(crop, (max(1, round(crop.shape[1] * scale)), CELL), interpolation=cv2.INTER_AREA)
    cell = np.full((CELL + LABEL_H, max(crop.shape[1], 80), 3), 255, np.uint8)
    cell[LABEL_H:, : crop.shape[1]] = crop
    cv2.putText(cell, label, (2, LABEL_H - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return np.pad(cell, ((0, 0), (0, 4), (0, 0)), constant_values=255)


def _text_cell(line1: str, line2: str, width: int) -> np.ndarray:
    cell = np.full((CELL + LABEL_H, width, 3), 255, np.uint8)
    cv2.putText(cell, line1, (4, 40), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(cell, line2, (4, 64), cv2.FONT_HERSHEY_SIMPLEX, 0.38, (0, 0, 0), 1, cv2.LINE_AA)
    return cell


__all__ = [
    "NOBODY",
    "POLICY",
    "Settled",
    "UncertainTurn",
    "answer_overrides",
    "contact_sheet",
    "face_label",
    "film_turns",
    "fresh_plan",
    "parse_choice",
    "plan_answers",
    "settle",
    "uncertain_of",
    "write_answers",
]
