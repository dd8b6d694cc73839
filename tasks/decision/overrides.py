"""One shot's overrides, read once, and the one precedence rule that settles a shot before its picture.

`shot_overrides` reads the shot's entries of the gate's per-shot maps (`gate.overrides` {index: dub | skip},
`gate.speakers` {index: face track}, `gate.crops` {index: [x0, y0, x1, y1]}; an edited shot plan lands
there through `tasks.timeline.shot_key.shot_config`) into a `ShotOverrides`, checked, before any analysis.
`precedence` is the order skip > policy none > forced (override dub, policy all) > the dub slice's speech;
both the face-analysis need (`needs_faces`, called by `tasks.decision.shot_decision.needed_faces`) and the
gate (`tasks.decision.gate.decide_dub`) call it, so the two cannot disagree.
Pure logic on config values and the speech verdict: no media, no faces.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.config.speaker import GateConfig
from tasks.errors import ConfigError
from tasks.perception.speech import SpeechInfo
from tasks.picture.region import Box

POLICIES = ("auto", "all", "none")
OVERRIDES = ("dub", "skip")


@dataclass(frozen=True)
class ShotOverrides:
    """What the config says about one shot (None: automatic)."""

    index: int
    action: str | None = None  # "dub" | "skip" (gate.overrides)
    speaker: int | None = None  # face track dubbed over the whole shot (gate.speakers)
    crop: Box | None = None  # box dubbed over the whole shot, display pixels (gate.crops)
    # the review's answers (gate.answers): (start, end film frames, face track or None = nobody on screen)
    answers: tuple[tuple[int, int, int | None], ...] = ()


@dataclass(frozen=True)
class Ruling:
    """What `precedence` settles: ``dub`` False (not dubbed) or True (dubbed whatever the evidence; the
    region still follows the faces), with the shot table's ``reason``; None: who speaks on screen decides."""

    dub: bool | None
    reason: str = ""


def parse_overrides(raw: Mapping[Any, Any] | None) -> dict[int, str]:
    """Validate a ``{shot_index: "dub" | "skip"}`` mapping (keys may be strings, as in YAML/JSON)."""
    out: dict[int, str] = {}
    for key, value in (raw or {}).items():
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"shot override key {key!r} is not a shot index") from None
        if index < 0:
            raise ValueError(f"shot override key {key!r} must be >= 0")
        action = str(value).strip().lower()
        if action not in OVERRIDES:
            raise ValueError(f"shot override for shot {index} must be 'dub' or 'skip', got {value!r}")
        out[index] = action
    return out


def _own(raw: Mapping[Any, Any] | None, shot_index: int) -> Any:
    """The entry of a {shot index: value} mapping for this shot (keys may be strings, as in YAML / JSON)."""
    own = [v for k, v in (raw or {}).items() if str(k).strip() == str(shot_index)]
    return own[-1] if own else None


def region_overrides(
    shot_index: int,
    speakers: Mapping[Any, Any] | None,
    crops: Mapping[Any, Any] | None,
    frame_hw: tuple[int, int] | None = None,
) -> tuple[int | None, Box | None]:
    """This shot's speaker track and crop box overrides (None: automatic); a bad value raises ValueError
    naming the shot. ``frame_hw``: the display frame (H, W) the box must lie in."""
    speaker, box = _own(speakers, shot_index), _own(crops, shot_index)
    if speaker is not None and (isinstance(speaker, bool) or not isinstance(speaker, int) or speaker < 0):
        raise ValueError(
            f"shot {shot_index}: speaker must be a face track id (an integer >= 0), got {speaker!r}"
        )
    if box is None:
        return speaker, None
    ints = isinstance(box, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in box)
    if not ints or len(box) != 4:
        raise ValueError(
            f"shot {shot_index}: crop must be [x0, y0, x1, y1] (4 integers, display pixels), got {box!r}"
        )
    x0, y0, x1, y1 = box
    if not (0 <= x0 < x1 and 0 <= y0 < y1):
        raise ValueError(f"shot {shot_index}: crop {list(box)} needs 0 <= x0 < x1 and 0 <= y0 < y1")
    if frame_hw is not None and (x1 > frame_hw[1] or y1 > frame_hw[0]):
        raise ValueError(
            f"shot {shot_index}: crop {list(box)} lies outside the {frame_hw[1]}x{frame_hw[0]} frame (display pixels)"
        )
    return speaker, (x0, y0, x1, y1)


def turn_answers(
    shot_index: int, answers: Mapping[Any, Any] | None
) -> tuple[tuple[int, int, int | None], ...]:
    """This shot's review answers (``gate.answers``): ((start_frame, end_frame, track | None), ...) in film
    frames; a bad entry raises ValueError naming the shot."""
    own = _own(answers, shot_index)
    if own is None:
        return ()
    if not isinstance(own, list | tuple):
        raise ValueError(f"shot {shot_index}: answers must be a list, got {own!r}")
    out = []
    for entry in own:
        ok = isinstance(entry, Mapping) and all(
            isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool)
            for k in ("start_frame", "end_frame")
        )
        speaker = entry.get("speaker") if isinstance(entry, Mapping) else None
        ok = ok and (
            speaker is None or (isinstance(speaker, int) and not isinstance(speaker, bool) and speaker >= 0)
        )
        if not ok or entry["start_frame"] >= entry["end_frame"]:
            raise ValueError(
                f"shot {shot_index}: an answer must be {{start_frame, end_frame, speaker: track id or null}} "
                f"(start < end), got {entry!r}"
            )
        out.append((entry["start_frame"], entry["end_frame"], speaker))
    return tuple(out)


def dub_action(shot_index: int, gate: GateConfig) -> str | None:
    """The shot's ``gate.overrides`` entry ("dub" | "skip" | None); the whole map is checked."""
    try:
        return parse_overrides(gate.overrides).get(shot_index)
    except ValueError as ex:
        raise ConfigError("gate.overrides", str(ex)) from ex


def shot_overrides(
    shot_index: int, gate: GateConfig, frame_hw: tuple[int, int] | None = None
) -> ShotOverrides:
    """The shot's overrides from the gate section, checked (a bad value: ConfigError naming the shot);
    ``frame_hw``: the display frame (H, W) a crop must lie in."""
    try:
        speaker, crop = region_overrides(shot_index, gate.speakers, gate.crops, frame_hw)
        answers = turn_answers(shot_index, gate.answers)
    except ValueError as ex:
        raise ConfigError("gate", str(ex)) from ex
    return ShotOverrides(shot_index, dub_action(shot_index, gate), speaker, crop, answers)


def precedence(ov: ShotOverrides, policy: str, speech: SpeechInfo) -> Ruling:
    """The one precedence of a shot's outcome: its skip override, then policy "none" (unless the shot is
    forced), then a forced dub (its dub override, policy "all"), then the dub slice's speech."""
    if policy not in POLICIES:
        raise ValueError(f"dub policy must be one of {POLICIES}, got {policy!r}")
    if ov.action == "skip":
        return Ruling(False, "skipped by override")
    if policy == "none" and ov.action != "dub":
        return Ruling(False, "policy: dub no shots")
    if ov.action == "dub":
        return Ruling(True, "forced by override")
    if policy == "all":
        return Ruling(True, "policy: dub all shots")
    if not speech.has_speech:
        return Ruling(
            False, speech.reason if speech.reason.startswith("no speech") else "no speech in dub track"
        )
    return Ruling(None)


def needs_faces(ov: ShotOverrides, ruling: Ruling, region_mode: str) -> bool:
    """Whether the shot's outcome or its dubbed region depends on the picture under ``ruling``: never for a
    skipped shot; always when the shot's region follows a face track it names; otherwise when who speaks
    decides, or when a forced dub's region follows the faces (not in full-frame mode)."""
    if ov.action == "skip":
        return False
    if ov.speaker is not None:
        return True
    if ruling.dub is None:
        return True
    return ruling.dub and region_mode != "full"


__all__ = [
    "OVERRIDES",
    "POLICIES",
    "Ruling",
    "ShotOverrides",
    "dub_action",
    "needs_faces",
    "parse_overrides",
    "precedence",
    "region_overrides",
    "shot_overrides",
    "turn_answers",
]
