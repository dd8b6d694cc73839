"""The editable shot plan (`dubflow plan FILM --audio DUB --out plan.yaml`): per shot its timecodes, the
automatic dub decision and why, the regions the gate chose (one per speaker turn: frames, box in display
pixels, speaker track, score; `tasks.decision.shot_decision.regions_json`, as in `dubflow estimate --json`) and the
seed, plus blank override fields an editor fills in; `dubflow dub ... --plan plan.yaml` applies them as each shot's own config overrides.

Override fields (null / `auto` = the automatic choice): `dub` (auto | yes | no), `speaker` (a face track
id: that track's region is dubbed over the whole shot) and `crop` (a box in display pixels: that box is
dubbed), both replacing the automatic region and dubbing the shot, the backends' own per-shot fields (the
registry's `tasks.backends.plan_fields`: the model's sampling settings, which become `backend.options`),
`color_strength` and `answers`. Each maps onto config keys (`to_config_overrides`), so a shot's result key
sees them like any other setting and only the shots whose effective inputs changed re-render.

Text and records only: writing and reading the YAML and validating it against the film's shots; the
automatic decisions come from the caller (`flows.estimate.estimate_film`), nothing here decodes media.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from tasks.backends import plan_fields, plan_options
from tasks.config.pipeline import PipelineConfig
from tasks.decision.overrides import region_overrides, turn_answers
from tasks.errors import ConfigError
from tasks.files import load_yaml
from tasks.media.deliver import write_delivered
from tasks.timeline.shot_key import shot_config

FORMAT = "dubflow-shot-plan/1"
PLAN_KEY = "shot-plan"  # the key a delivered plan file's record names (any plan dubflow wrote is replaced)
# The override fields before and after the backends' own (`tasks.backends.plan_fields`), in the file's order:
# field -> (what it means, written as the file's legend; the YAML types it takes, none for `dub`'s choice)
_REGION_FIELDS: Mapping[str, tuple[str, tuple[type, ...]]] = {
    "dub": ("auto | yes | no", ()),
    "speaker": ("dub this face track (a speaker id of auto.regions) over the whole shot", (int,)),
    "crop": ("[x0, y0, x1, y1] display pixels, as auto.regions' boxes: dub this box", (list,)),
}
_PICTURE_FIELDS: Mapping[str, tuple[str, tuple[type, ...]]] = {
    "color_strength": ("colour matching strength, 0 = off", (int, float)),
    "answers": (
        "uncertain turns settled: [{start_frame, end_frame, speaker: track id or null (nobody), by}]",
        (list,),
    ),
}
SHOT_KEYS = ("index", "start", "end", "start_frame", "end_frame", "auto", "override")


def override_fields() -> dict[str, tuple[str, tuple[type, ...]]]:
    """Every override field of a shot, in the file's order: field -> (its meaning, the YAML types it takes)."""
    return {**_REGION_FIELDS, **plan_fields(), **_PICTURE_FIELDS}


def timecode(frame: int, fps: Fraction) -> str:
    """HH:MM:SS.mmm of a frame's start time."""
    ms = round(float(frame / fps) * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"


def plan_document(
    film: str, audio: str, fps: Fraction, frame_count: int, shots: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The plan as a YAML-ready mapping. `shots`: index, start_frame, end_frame, dub, reason, regions (the
    estimate's: start_frame, end_frame, box, speaker, score, status), backend (the backend's automatic
    values of its plan fields, `tasks.backends.plan_auto`)."""
    entries = []
    for s in shots:
        entries.append(
            {
                "index": s["index"],
                "start": timecode(s["start_frame"], fps),
                "end": timecode(s["end_frame"], fps),
                "start_frame": s["start_frame"],
                "end_frame": s["end_frame"],
                "auto": {
                    "dub": bool(s["dub"]),
                    "reason": s["reason"],
                    "regions": [_region(r) for r in s.get("regions") or ()],
                    **s.get("backend", {}),
                },
                "override": {name: ("auto" if name == "dub" else None) for name in override_fields()},
            }
        )
    return {
        "format": FORMAT,
        "film": str(Path(film).resolve()),
        "audio": str(Path(audio).resolve()),
        "fps": str(fps),
        "frame_count": frame_count,
        "shots": entries,
    }


def _region(r: Mapping[str, Any]) -> dict[str, Any]:
    """One dubbed region as plain YAML values (the box a list, the score a float)."""
    return {**r, "box": [int(v) for v in r["box"]], "score": float(r["score"])}


def write_plan(path: str | Path, document: Mapping[str, Any]) -> Path:
    """Write the plan YAML with a legend of the override fields on top (`tasks.media.deliver.write_delivered`:
    atomically, with its record, never over an input or a file dubflow did not write: `check_replaceable`
    says so before any work)."""
    legend = "\n".join(f"#   {name}: {meaning}" for name, (meaning, _) in override_fields().items())
    head = (
        "# dubflow shot plan: edit the `override:` fields of any shot (null / auto = the automatic choice),\n"
        "# then: dubflow dub FILM --audio DUB --out OUT --plan THIS_FILE (only changed shots re-render).\n"
        f"# `auto:` is what dubflow chose on its own (read only).\n{legend}\n"
    )
    body = yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True, width=110)
    # by the delivery rules: never over a file dubflow did not write (a user's edit of an earlier plan too)
    return write_delivered(path, (head + body).encode(), PLAN_KEY)


def read_plan(path: str | Path) -> dict[int, dict[str, Any]]:
    """{shot index: (start_frame, end_frame) and the overrides set}; a bad file is a one-line ConfigError."""
    path = Path(path)
    data = load_yaml(path, "shot plan")  # a regular file, bounded, no aliases (tasks/files.py)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("shots"), list):
        raise ConfigError(path, f"not a dubflow shot plan (expected format: {FORMAT} and a shots: list)")
    out: dict[int, dict[str, Any]] = {}
    for n, entry in enumerate(data["shots"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("index"), int):
            raise ConfigError(path, f"shots[{n}]: expected a mapping with an integer index")
        index = entry["index"]
        where = f"shot {index}"
        unknown = sorted(set(entry) - set(SHOT_KEYS))
        if unknown:
            raise ConfigError(path, f"{where}: unknown field {unknown[0]!r} (known: {', '.join(SHOT_KEYS)})")
        if index in out:
            raise ConfigError(path, f"{where}: listed twice")
        override = entry.get("override") or {}
        if not isinstance(override, dict):
            raise ConfigError(path, f"{where}: override must be a mapping, got {override!r}")
        out[index] = {
            "start_frame": entry.get("start_frame"),
            "end_frame": entry.get("end_frame"),
            "overrides": _check_overrides(path, where, override),
        }
    return out


def _check_overrides(path: Path, where: str, override: Mapping[str, Any]) -> dict[str, Any]:
    """The set override fields (null and `dub: auto` dropped), each type-checked."""
    fields = override_fields()
    unknown = sorted(set(override) - set(fields))
    if unknown:
        raise ConfigError(
            path, f"{where}: unknown override field {unknown[0]!r} (known: {', '.join(fields)})"
        )
    out: dict[str, Any] = {}
    for name, value in override.items():
        if value is None or (name == "dub" and value == "auto"):
            continue
        if name == "dub":
            if value not in ("yes", "no", True, False):  # YAML 1.1 reads a bare yes/no as a boolean
                raise ConfigError(path, f"{where}: dub must be auto, yes or no, got {value!r}")
            value = value in ("yes", True)
        elif isinstance(value, bool) or not isinstance(value, fields[name][1]):
            raise ConfigError(path, f"{where}: {name} must be {fields[name][1][0].__name__}, got {value!r}")
        out[name] = value
    if out.get("dub") is False and ("speaker" in out or "crop" in out):
        raise ConfigError(path, f"{where}: dub: no contradicts a speaker / crop override (leave those null)")
    return out


def to_config_overrides(
    index: int, fields: Mapping[str, Any], options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A shot's plan overrides as nested config updates (`tasks.timeline.shot_key.shot_config` merges them).
    The backends' own fields are backend options (`tasks.backends.plan_options`): they go over the run's
    `backend.options` (given as `options`), which win over the backend's own sections."""
    out: dict[str, dict[str, Any]] = {}
    answers = [
        {k: a.get(k) for k in ("start_frame", "end_frame", "speaker")} if isinstance(a, Mapping) else a
        for a in fields.get("answers") or ()
    ]  # `by` (who answered) is a note, not a setting
    gate = {
        "answers": {str(index): answers} if answers else None,
        "overrides": None if "dub" not in fields else {str(index): "dub" if fields["dub"] else "skip"},
        "speakers": None if "speaker" not in fields else {str(index): fields["speaker"]},
        "crops": None if "crop" not in fields else {str(index): list(fields["crop"])},
    }
    if any(gate.values()):
        out["gate"] = {k: v for k, v in gate.items() if v is not None}
    if own := plan_options(index, fields):
        out["backend"] = {"options": {**dict(options or {}), **own}}
    if "color_strength" in fields:
        out["color"] = {"strength": float(fields["color_strength"])}
    return out


def check_against_shots(
    path: str | Path, plan: Mapping[int, Mapping[str, Any]], shots: Sequence[Mapping[str, Any]]
) -> None:
    """Every plan entry names a shot of this film with the same frame range (a one-line error if not)."""
    spans = {s["index"]: (s["start_frame"], s["end_frame"]) for s in shots}
    for index, entry in plan.items():
        if index not in spans:
            raise ConfigError(path, f"shot {index}: no such shot (the film has shots 0-{len(spans) - 1})")
        have = (entry["start_frame"], entry["end_frame"])
        if have != spans[index] and have != (None, None):
            raise ConfigError(
                path,
                f"shot {index}: frames {have[0]}-{have[1]} in the plan, {spans[index][0]}-{spans[index][1]} "
                "in the film (the shot list changed: write a new plan)",
            )


def plan_overrides(
    path: str | Path,
    config: Mapping[str, Any],
    shots: Sequence[Mapping[str, Any]],
    frame_hw: tuple[int, int] | None = None,
    *,
    check_options: Callable[[PipelineConfig], None],
) -> dict[int, dict[str, Any]]:
    """{shot index: nested config overrides} of the plan file at `path` for a film with `shots`
    (index, start_frame, end_frame), each shot's effective config checked now, before any render (the
    backend's own option check is `check_options`, handed in so this wing imports no backend); a crop
    must lie in the display frame `frame_hw` (H, W). (A speaker's track id is checked against the shot's
    faces where they are analysed, in the film run's planning.)"""

    plan = read_plan(path)
    check_against_shots(path, plan, shots)
    options = dict(config["backend"]["options"])
    out = {}
    for index, entry in sorted(plan.items()):
        overrides = to_config_overrides(index, entry["overrides"], options)
        if not overrides:
            continue
        try:
            cfg = PipelineConfig.from_dict(shot_config(config, overrides), source=str(path))
            check_options(cfg)
        except ConfigError as ex:
            key = "" if ex.path in (None, str(path)) else f"{ex.path}: "  # a config key, or this file
            raise ConfigError(path, f"shot {index}: {key}{ex.problem}") from ex
        try:
            region_overrides(index, cfg.gate.speakers, cfg.gate.crops, frame_hw)
            turn_answers(index, cfg.gate.answers)
        except ValueError as ex:
            raise ConfigError(path, str(ex)) from ex
        out[index] = overrides
    return out
