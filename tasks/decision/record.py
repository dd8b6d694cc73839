"""The decision wing's records: a speaker `Turn`, a dubbed `DubRegion` and the shot's `ShotDecision`.

Plain data, no decisions made here: `tasks.decision.gate` and `tasks.decision.stems` build turns and
regions, `tasks.decision.shot_decision` the shot decision, which the renderer and the backends read as is.
Typed all the way inside one process; a dict only where it crosses a process or a file (`to_dict` /
`from_dict`: the Prefect task boundary and the renderer's kept ``decision.json``, whose format is
``{"dub", "reason", "details": {"speech", "regions", "faces", "characters"}}``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.perception.face_analysis import ShotFaces
from tasks.perception.speech import SpeechInfo
from tasks.picture.region import RegionPlan

# A two-speaker turn's or region's person: {"track": id, "character": name | None, "stem": name | None,
# "box": [x0, y0, x1, y1] (display pixels, the person's face over the turn)}; the contract with
# tasks/infinitetalk/multi.py, kept as JSON-ready dicts.
Person = dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """Shot frames [start, end) in which ``track`` speaks (None: nobody on screen, voice-over)."""

    start: int
    end: int
    track: int | None
    score: float
    status: str  # speaker | uncertain | none | two (two speakers at once: `people`)
    people: tuple[Person, ...] = ()


@dataclass(frozen=True)
class DubRegion:
    """Shot frames [start_frame, end_frame) dubbed in ``plan``'s box around ``speaker`` (display pixels)."""

    start_frame: int
    end_frame: int
    speaker: int | None  # track id; None: no face (full-frame dub of a faceless shot, or a forced dub)
    score: float
    status: str  # speaker | uncertain | forced | plan | two (two speakers at once: `people`)
    plan: RegionPlan
    people: tuple[Person, ...] = ()  # two-speaker segment: one entry per person

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "plan": self.plan.to_dict(), "people": list(self.people)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DubRegion:
        spk = d.get("speaker")
        return cls(
            start_frame=int(d["start_frame"]),
            end_frame=int(d["end_frame"]),
            speaker=None if spk is None else int(spk),
            score=float(d["score"]),
            status=str(d["status"]),
            plan=RegionPlan.from_dict(d["plan"]),
            people=tuple(d.get("people") or ()),
        )


@dataclass(frozen=True)
class ShotDecision:
    """Whether a shot is dubbed, why (shown in the shot table as is), where (one region per speaker turn)
    and the evidence: the dub slice's speech, the shot's face analysis (None when the outcome could not
    depend on it) and the characters of its tracks ({track id (str): name})."""

    dub: bool
    reason: str
    regions: tuple[DubRegion, ...] = ()
    speech: SpeechInfo | None = None
    faces: ShotFaces | None = None
    characters: dict[str, str] = field(default_factory=dict)
    # the speaker turns the gate decided from (uncertain ones included; not in the JSON form): the review
    # step lists the uncertain ones (`flows.review`)
    turns: tuple[Turn, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the Prefect task boundary, the renderer's ``decision.json``)."""
        details = {
            "speech": None if self.speech is None else self.speech.to_dict(),
            "regions": [r.to_dict() for r in self.regions],
            "faces": None if self.faces is None else self.faces.to_dict(),
            "characters": dict(self.characters),
        }
        return {"dub": self.dub, "reason": self.reason, "details": details}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShotDecision:
        """Inverse of :meth:`to_dict` (a missing or null detail reads as absent)."""
        details = d.get("details") or {}
        speech, faces = details.get("speech"), details.get("faces")
        return cls(
            dub=bool(d["dub"]),
            reason=str(d["reason"]),
            regions=tuple(DubRegion.from_dict(r) for r in details.get("regions") or ()),
            speech=None if speech is None else SpeechInfo.from_dict(speech),
            faces=None if faces is None else ShotFaces.from_dict(faces),
            characters={str(k): str(v) for k, v in (details.get("characters") or {}).items()},
        )


__all__ = ["DubRegion", "Person", "ShotDecision", "Turn"]
