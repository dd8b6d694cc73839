"""Two speakers at once: a shot with a two-speaker segment (`tasks.decision.record.DubRegion` of status "two" with two
`people`) is generated with the multi (two-person) InfiniteTalk checkpoint, one audio stream per person
(each person's dub stem, its wav2vec2 features cached per film like the dialogue's) and person masks
from the people's boxes mapped into the shot's model crop (`model.sampling.conditioning.speaker_masks`); the DiT's
own routing (`model.network.dit`) then sends each stem to the tokens of its person. Without the multi checkpoint
the segment is dubbed as the louder person's one-speaker region, with the reason saying so.

How a shot is generated: the whole shot runs two-speaker once it holds a two-speaker segment (the person
masks and both stems for every chunk; outside the overlap one stem is silent, so that face is driven by
silence). That is the official `audio_type: para`, each stem loudness-normalised on its own as the official
prepares each person's track (the film's stems are already aligned in time, so `add` never applies). So a
shot needs one DiT, and the resident holder keeps one DiT at a time (`resident.ResidentModels`: the
LoadSpec's `multi` flag picks the DiT file and is not part of its key): a two-speaker shot loads the multi
DiT on demand in place of the single one (VAE, CLIP and the encoders stay), the next one-speaker shot
loads the single one back. One model load per switch, which the estimate and the group sizing price.

This file holds those rules only: no chunk loop (`session`, `chunk`), no gate (`tasks.decision.gate` and c18's
characters decide when a segment has two speakers), no model code.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.sampling.conditioning import speaker_masks
from tasks.config.pipeline import PipelineConfig
from tasks.decision.record import DubRegion, ShotDecision
from tasks.decision.shot_decision import region_config
from tasks.errors import MediaError
from tasks.infinitetalk.cost import TWO
from tasks.picture.region import Box, RegionPlan, plan_from_track
from tasks.render.backend import ShotContext

if TYPE_CHECKING:
    import torch

    from tasks.infinitetalk.timing import Stopwatch

log = logging.getLogger(__package__)  # the package's one logger, "tasks.infinitetalk"

MISSING = "two speakers: multi checkpoint missing, dubbing the louder"
OTHER_PAIR = "two speakers: another pair in this shot, dubbing the louder"


def is_two(region: DubRegion) -> bool:
    """A two-speaker segment (the contract's status "two" with one entry per person)."""
    return region.status == TWO and len(region.people) == 2


def _who(person: dict[str, Any]) -> str:
    character = person.get("character")
    return f"track {person['track']}" + (f", {character}" if character else "")


def _louder(region: DubRegion) -> dict[str, Any]:
    """The person entry of the region's `speaker` (the louder one), else the first."""
    return next((p for p in region.people if p.get("track") == region.speaker), region.people[0])


def as_louder(region: DubRegion, cfg: PipelineConfig) -> DubRegion:
    """The two-speaker segment as the louder person's one-speaker region: its box re-planned around that
    person's face (a full-frame plan stays full frame)."""
    person = _louder(region)
    plan = region.plan
    if plan.mode != "full":
        box = tuple(int(round(v)) for v in person["box"])
        n = region.end_frame - region.start_frame
        plan = plan_from_track([(0, box)], plan.frame_size, n, 1, region_config(cfg))  # type: ignore[list-item]
    return dataclasses.replace(region, speaker=int(person["track"]), status="speaker", plan=plan, people=())


def resolve_two_speakers(
    decision: ShotDecision, multi_available: Callable[[], bool], cfg: PipelineConfig
) -> ShotDecision:
    """The decision the backend generates: two-speaker segments kept when the multi checkpoint is there
    (`multi_available()`, asked only for a shot with such a segment; one pair of people per shot: the
    longest segment's, segments of another pair dub their louder person), otherwise each one dubbed as its
    louder person's one-speaker region. Idempotent; the reason says why."""
    regions = decision.regions
    two = [r for r in regions if is_two(r)]
    if not two:
        return decision
    keep = max(two, key=lambda r: r.end_frame - r.start_frame) if multi_available() else None
    pair = None if keep is None else sorted(str(p["stem"]) for p in keep.people)
    out, notes = [], []
    for r in regions:
        if is_two(r) and (keep is None or sorted(str(p["stem"]) for p in r.people) != pair):
            out.append(as_louder(r, cfg))
            note = f"{MISSING if keep is None else OTHER_PAIR} ({_who(_louder(r))})"
            notes += [note] if note not in notes else []
        else:
            out.append(r)
    if not notes:
        return decision
    for note in notes:
        log.warning("%s", note)
    return dataclasses.replace(decision, reason="; ".join([decision.reason, *notes]), regions=tuple(out))


@dataclass(frozen=True)
class TwoSpeakers:
    """The shot's two-speaker segment: its region and its two people (in the order audio and masks take)."""

    region: DubRegion

    @property
    def people(self) -> tuple[dict[str, Any], ...]:
        return self.region.people

    def stem_paths(self, context: ShotContext) -> list[Path]:
        """Each person's dub stem (ShotContext.stems by the entry's stem name, else its character)."""
        paths = []
        for person in self.people:
            name = str(person["stem"])
            path = context.stems.get(name) or context.stems.get(str(person.get("character")))
            if path is None:
                known = ", ".join(sorted(context.stems)) or "none"
                raise MediaError(
                    context.dialogue.path,
                    f"two-speaker segment needs the stem {name!r} ({_who(person)}); stems given: {known}",
                )
            paths.append(Path(path))
        return paths

    def model_boxes(self, plan: RegionPlan | None, display_hw: tuple[int, int]) -> tuple[list[Box], tuple]:
        """The people's boxes in the pixels of the frame the model input is made from, and that frame's
        (H, W): the display frame for a full-frame shot, else the crop box (at the segment's middle frame)."""
        boxes = [tuple(float(v) for v in p["box"]) for p in self.people]
        if plan is None or plan.mode == "full":
            return boxes, display_hw  # type: ignore[return-value]
        x0, y0, x1, y1 = plan.box_at((self.region.start_frame + self.region.end_frame) // 2)
        w, h = x1 - x0, y1 - y0
        inside = [
            (min(max(a - x0, 0), w), min(max(b - y0, 0), h), min(max(c - x0, 0), w), min(max(d - y0, 0), h))
            for a, b, c, d in boxes
        ]
        return inside, (h, w)  # type: ignore[return-value]

    def masks(
        self, plan: RegionPlan | None, display_hw: tuple[int, int], model_hw: tuple[int, int]
    ) -> torch.Tensor:
        """(3, h, w) person 1, person 2, background masks at latent resolution (`speaker_masks`, the official
        cover-resize + centre crop from that frame to the model size). A person outside the crop is an error."""

        boxes, frame_hw = self.model_boxes(plan, display_hw)
        mh, mw = model_hw
        masks = speaker_masks(boxes, 2, frame_hw, model_hw, (mh // 8, mw // 8))  # (3, h, w)
        for person, mask in zip(self.people, masks[:2], strict=True):
            if not mask.any():
                raise ValueError(
                    f"two-speaker segment: {_who(person)}'s box {person['box']} is outside the model crop"
                )
        return masks


def two_speakers(decision: ShotDecision) -> TwoSpeakers | None:
    """The shot's two-speaker segment after `resolve_two_speakers` (at most one pair per shot), or None."""
    two = [r for r in decision.regions if is_two(r)]
    return TwoSpeakers(max(two, key=lambda r: r.end_frame - r.start_frame)) if two else None


def stem_feature_files(
    backend: Any, film_dir: Path, context: ShotContext, two: TwoSpeakers, watch: Stopwatch
) -> list[Path]:
    """The people's stems' wav2vec2 feature files (cached per film and stem, like the dialogue's)."""
    return [backend.audio_features_file(film_dir, path, watch) for path in two.stem_paths(context)]
