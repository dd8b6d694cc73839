"""The shot decision record: whether a shot is dubbed, why, and the details the renderer needs.

Plain data, no decisions made here: `tasks.decision.shot_decision` builds it, the renderer and the backends
read it. It crosses the Prefect task boundary as a dict (`to_dict` / `from_dict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ShotDecision:
    """Whether a shot is dubbed, why (shown in the shot table), and JSON details (speech, region plan)."""

    dub: bool
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"dub": self.dub, "reason": self.reason, "details": self.details}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShotDecision:
        return cls(bool(d["dub"]), str(d["reason"]), dict(d.get("details") or {}))
