"""Per-shot dub decision: speech in the dub track + a face to animate, a global policy and per-shot overrides.

The reason string is shown as-is in the shot table ("why dubbed / why not"), so it is short and specific.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tasks.region import RegionPlan
from tasks.speech import SpeechInfo

POLICIES = ("auto", "all", "none")
OVERRIDES = ("dub", "skip")


@dataclass(frozen=True)
class Decision:
    """Whether a shot is dubbed, and why."""

    dub: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)


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


def decide_dub(
    shot_index: int,
    speech: SpeechInfo,
    region: RegionPlan,
    policy: str = "auto",
    overrides: Mapping[Any, Any] | None = None,
    require_face: bool = True,
) -> Decision:
    """Decide whether to dub one shot.

    Order: a per-shot override wins; then policy "all" / "none"; then "auto": dub iff the dub track has speech
    and a face was found (``require_face=False`` lets full-frame mode dub faceless shots, e.g. a narrator
    walking out of frame).
    """
    if policy not in POLICIES:
        raise ValueError(f"dub policy must be one of {POLICIES}, got {policy!r}")
    action = parse_overrides(overrides).get(shot_index)
    if action == "dub":
        return Decision(True, "forced by override")
    if action == "skip":
        return Decision(False, "skipped by override")
    if policy == "all":
        return Decision(True, "policy: dub all shots")
    if policy == "none":
        return Decision(False, "policy: dub no shots")
    if not speech.has_speech:
        return Decision(
            False, speech.reason if speech.reason.startswith("no speech") else "no speech in dub track"
        )
    pct = f"speech {speech.speech_ratio:.0%}"
    if region.face_found:
        return Decision(True, f"{pct} + face")
    if region.mode == "full" and not require_face:
        return Decision(True, f"{pct}, full frame (no face needed)")
    return Decision(False, "no face found" if region.detections == 0 else "no steady face found")


__all__ = ["OVERRIDES", "POLICIES", "Decision", "decide_dub", "parse_overrides"]
