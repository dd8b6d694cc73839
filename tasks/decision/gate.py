"""Per-shot dub decision: speech in the dub track + who speaks on screen, a global policy and per-shot overrides.

A shot is dubbed when the dub track speaks in it and someone on screen says the source's lines: only the
speaking track's region is dubbed (one `DubRegion` per speaker turn); a shot whose speech nobody on screen
says (voice-over, off-screen speaker, listeners only, posters) is passed through.  Uncertain speaker
segments follow `speaker.uncertain` (most_likely | skip | largest).  The reason string is shown as-is in the
shot table ("why dubbed / why not"), so it is short and specific.
Must not decode media nor run models: it reads the speech verdict and the shot's face analysis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasks.decision.record import DubRegion, ShotDecision
from tasks.perception.face_analysis import ShotFaces
from tasks.perception.speech import SpeechInfo
from tasks.picture.region import (
    Box,
    RegionConfig,
    RegionPlan,
    full_frame_box,
    plan_from_box,
    plan_from_track,
    snap_box_size,
)

POLICIES = ("auto", "all", "none")
OVERRIDES = ("dub", "skip")
UNCERTAIN = ("most_likely", "skip", "largest")


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


def _target(seg, faces: ShotFaces, uncertain: str) -> tuple[int | None, bool]:
    """(track to dub or None, ambiguous) of one speaker segment under the uncertainty policy; ambiguous:
    another face moved its lips too (the policy picked the track)."""
    if seg.status == "none":
        return None, False
    if seg.status == "speaker":
        return seg.speaker, False
    if uncertain == "skip":
        return None, True
    if uncertain == "largest":
        visible = [
            t
            for t in faces.tracks
            if not t.still and t.start_frame < seg.end_frame and t.end_frame > seg.start_frame
        ]
        if visible:
            return max(visible, key=lambda t: t.side_px).id, True
    return seg.speaker, True


def speaker_turns(
    faces: ShotFaces, uncertain: str, min_score: float
) -> list[tuple[int, int, int | None, float, str]]:
    """[(start, end, track or None, score, status)] covering the shot: each segment reaches to the middle of
    the gaps around it (the first from frame 0, the last to the end); neighbours with the same track are
    one turn, scored by their time-weighted mean.  A turn is "uncertain" when another face moved its lips
    too in one of its segments or its score is below ``min_score``."""
    if uncertain not in UNCERTAIN:
        raise ValueError(f"speaker.uncertain must be one of {UNCERTAIN}, got {uncertain!r}")
    segs = list(faces.segments)
    turns: list[list[Any]] = []  # [start, end, track, [(score, frames)], ambiguous]
    for i, seg in enumerate(segs):
        start = 0 if i == 0 else (segs[i - 1].end_frame + seg.start_frame) // 2
        end = faces.num_frames if i == len(segs) - 1 else (seg.end_frame + segs[i + 1].start_frame) // 2
        track, ambiguous = _target(seg, faces, uncertain)
        scored = (seg.score, seg.end_frame - seg.start_frame)
        if turns and turns[-1][2] == track:  # the same speaker (or nobody) goes on: one turn
            turns[-1][1] = end
            turns[-1][3].append(scored)
            turns[-1][4] = turns[-1][4] or ambiguous
        else:
            turns.append([start, end, track, [scored], ambiguous])
    out = []
    for start, end, track, scores, ambiguous in turns:
        score = sum(s * n for s, n in scores) / max(1, sum(n for _, n in scores))
        sure = not ambiguous and (track is None or score >= min_score)
        out.append((start, end, track, round(score, 3), "speaker" if sure else "uncertain"))
    return out


def _why_not(faces: ShotFaces, turns: list[tuple]) -> str:
    if not faces.tracks:
        return "no face found"
    if all(t.still for t in faces.tracks):
        return "only still faces (poster, photo or screen)"
    if any(status == "uncertain" for *_, status in turns):
        return "speaker uncertain (speaker.uncertain: skip)"
    return "speaker off screen"


def decide_dub(
    shot_index: int,
    speech: SpeechInfo,
    faces: ShotFaces | None,
    region: RegionConfig,
    *,
    policy: str = "auto",
    overrides: Mapping[Any, Any] | None = None,
    require_face: bool = True,
    uncertain: str = "most_likely",
    min_score: float = 0.0,
    turns: Sequence[tuple] | None = None,
    why_not: str = "",
    names: Mapping[str, str] | None = None,
) -> ShotDecision:
    """Decide whether and where to dub one shot.

    Order: a per-shot override wins; then policy "all" / "none"; then "auto": the dub track must speak,
    then someone on screen must say the source's lines (``require_face=False`` lets full-frame mode dub
    speech shots without a face).  ``faces`` may be None only when the decision cannot depend on it.
    ``turns`` (per-character stems, `tasks.decision.stems`): replace the face analysis's speaker turns; ``why_not``
    then says why a shot with no dubbed turn is passed through.  ``names``: {track id (str): character}.
    """
    if policy not in POLICIES:
        raise ValueError(f"dub policy must be one of {POLICIES}, got {policy!r}")
    action = parse_overrides(overrides).get(shot_index)
    if action == "skip":
        return ShotDecision(False, "skipped by override")
    if policy == "none" and action != "dub":
        return ShotDecision(False, "policy: dub no shots")
    forced = "forced by override" if action == "dub" else "policy: dub all shots" if policy == "all" else None
    if forced is None and not speech.has_speech:
        return ShotDecision(
            False, speech.reason if speech.reason.startswith("no speech") else "no speech in dub track"
        )
    if faces is None:
        raise ValueError(f"shot {shot_index}: the decision needs the shot's face analysis")
    turns = speaker_turns(faces, uncertain, min_score) if turns is None else turns
    regions = tuple(
        _region(faces, a, b, t, sc, st, region, tuple(more[0]) if more else ())
        for a, b, t, sc, st, *more in turns
        if t is not None
    )
    if forced is not None:
        return ShotDecision(True, forced, regions or (_whole_shot(faces, region, "forced"),))
    pct = f"speech {speech.speech_ratio:.0%}"
    if regions:
        who = " -> ".join(_who(r, names or {}) for r in regions)
        sure = all(r.status in ("speaker", "two") for r in regions)
        tag = "speaker" if sure else f"speaker uncertain, {uncertain.replace('_', ' ')}"
        return ShotDecision(True, f"{pct}; {tag}: {who} (score {min(r.score for r in regions):.2f})", regions)
    if region.mode == "full" and not require_face:
        return ShotDecision(
            True, f"{pct}, full frame (no face needed)", (_whole_shot(faces, region, "forced"),)
        )
    return ShotDecision(False, why_not or _why_not(faces, turns))


def _who(r: DubRegion, names: Mapping[str, str]) -> str:
    """ "track 0 (ANNA)", or both people of a two-speaker region joined by "+"."""
    tracks = [p["track"] for p in r.people] or [r.speaker]
    return " + ".join(f"track {k}" + (f" ({names[str(k)]})" if str(k) in names else "") for k in tracks)


def _whole_shot(faces: ShotFaces, cfg: RegionConfig, status: str) -> DubRegion:
    """The whole shot around its largest moving face (or the full-frame box without one)."""
    live = [t for t in faces.tracks if not t.still] or list(faces.tracks)
    track = max(live, key=lambda t: t.side_px).id if live else None
    return _region(faces, 0, faces.num_frames, track, 0.0, status, cfg)


def _holding(boxes: list[Box], frame_hw: tuple[int, int], num_frames: int, cfg: RegionConfig) -> RegionPlan:
    """A two-speaker region's plan: the smallest bucket-aspect box holding every face box with a margin,
    static; the full-frame box when that does not fit in the frame."""
    x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    both = (int(x0), int(y0), int(x1), int(y1))
    (h, w), bucket = snap_box_size(1.4 * (y1 - y0), 1.15 * (x1 - x0), frame_hw, cfg.size)
    if cfg.mode == "full" or h < y1 - y0 or w < x1 - x0:
        box, bucket = full_frame_box(frame_hw, cfg.size)
        why = "two speakers: full frame"
        return RegionPlan("full", box, bucket, True, len(boxes), why, frame_hw, num_frames, face_box=both)
    bx = min(max(round((x0 + x1 - w) / 2), 0), frame_hw[1] - w)
    by = min(max(round((y0 + y1 - h) / 2), 0), frame_hw[0] - h)
    why = "two speakers: a box holding both faces"
    return RegionPlan("region", (bx, by, bx + w, by + h), bucket, True, len(boxes), why, frame_hw, num_frames,
                      face_box=both)  # fmt: skip


def _region(
    faces: ShotFaces,
    start: int,
    end: int,
    track: int | None,
    score: float,
    status: str,
    cfg: RegionConfig,
    people: tuple[dict[str, Any], ...] = (),
) -> DubRegion:
    """The dub box of frames [start, end) around ``track`` (tasks.picture.region geometry, display pixels); a
    two-speaker region's box holds every person's box (`people`)."""
    samples: list[tuple[int, Box]] = []
    n_samples = len(range(0, end - start, max(1, faces.step_frames)))
    if people:
        plan = _holding([p["box"] for p in people], faces.display_hw, end - start, cfg)
        return DubRegion(start, end, track, round(score, 3), status, plan, people)
    if track is not None:
        tr = faces.track(track)
        samples = [(t - start, b) for t, b in tr.samples(start, end)] or [(0, tr.boxes[-1])]
        n_samples = max(1, len(samples))
    plan = plan_from_track(samples or None, faces.display_hw, end - start, n_samples, cfg)
    if track is None and cfg.mode != "full":
        box, bucket = full_frame_box(faces.display_hw, cfg.size)
        plan = RegionPlan("full", box, bucket, False, 0, "no face: full frame", faces.display_hw, end - start)
    return DubRegion(start, end, track, round(score, 3), status, plan, people)


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


def apply_region_overrides(
    decision: ShotDecision,
    shot_index: int,
    faces: ShotFaces | None,
    region: RegionConfig,
    frame_hw: tuple[int, int],
    num_frames: int,
    override: tuple[int | None, Box | None],
    skipped: bool,
) -> ShotDecision:
    """The automatic ``decision`` with the shot's (speaker, crop) ``override`` applied: one region over the
    whole shot, around that face track and/or in that box, dubbed whatever the evidence said (a shot
    ``skipped`` by its dub override stays skipped). An unknown track raises ValueError naming the shot."""
    speaker, box = override
    if skipped or (speaker is None and box is None):
        return decision
    what = [] if speaker is None else [f"speaker {speaker}"]
    if speaker is not None:
        ids = [t.id for t in faces.tracks] if faces is not None else []
        if speaker not in ids:
            have = ", ".join(map(str, ids)) or "none"
            raise ValueError(
                f"shot {shot_index}: speaker {speaker}: no such face track (the shot's tracks: {have})"
            )
    if box is not None:
        what.append(f"crop [{', '.join(map(str, box))}]")
    reason = "plan: " + ", ".join(what)
    if box is None:
        assert faces is not None
        dubbed = _region(faces, 0, faces.num_frames, speaker, 0.0, "plan", region)
    else:
        dubbed = DubRegion(
            0, num_frames, speaker, 0.0, "plan", plan_from_box(box, frame_hw, num_frames, region.size, reason)
        )
    return ShotDecision(True, reason, (dubbed,))


__all__ = [
    "OVERRIDES",
    "POLICIES",
    "UNCERTAIN",
    "apply_region_overrides",
    "decide_dub",
    "parse_overrides",
    "region_overrides",
    "speaker_turns",
]
