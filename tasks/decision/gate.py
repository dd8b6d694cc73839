"""Per-shot dub decision: speech in the dub track + who speaks on screen, a global policy and per-shot overrides.

A shot is dubbed when the dub track speaks in it and someone on screen says the source's lines: only the
speaking track's region is dubbed (one `DubRegion` per speaker `Turn`); a shot whose speech nobody on
screen says (voice-over, off-screen speaker, listeners only, posters) is passed through.  What the shot's
overrides and the policy settle first is `tasks.decision.overrides.precedence`.  Uncertain speaker
segments follow `speaker.uncertain` (most_likely | skip | largest).  The reason string is shown as-is in the
shot table ("why dubbed / why not"), so it is short and specific.
Must not decode media nor run models: it reads the speech verdict and the shot's face analysis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasks.config.speaker import GateConfig, SpeakerConfig
from tasks.decision.overrides import ShotOverrides, precedence
from tasks.decision.record import DubRegion, ShotDecision, Turn
from tasks.perception.face_analysis import ShotFaces
from tasks.perception.speaker import SpeakerSegment
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

UNCERTAIN = ("most_likely", "skip", "largest")


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


def _beside_change(
    segs: Sequence[SpeakerSegment], targets: list[tuple[int | None, bool]]
) -> list[tuple[int | None, bool]]:
    """``targets`` with each ambiguous segment beside a change of voice (`SpeakerSegment.change`, content's turn
    band) dubbed on the face of the turn on its own side of the change: the nearest segment before it (it ends
    by the change) or after it (it starts at the change) that is no such band's; its own face where there is
    none.  The band is uncertain because the change is placed only to a few frames; dubbing all of it on one
    face moved the switch to the band's edge (0.6 s early or late), so the switch is put at the change."""
    out = list(targets)
    for i, seg in enumerate(segs):
        at = seg.change
        if at is None or not targets[i][1]:
            continue
        side = range(i - 1, -1, -1) if seg.end_frame <= at else range(i + 1, len(segs))
        j = next((j for j in side if segs[j].change is None), None)
        if j is not None:
            out[i] = (targets[j][0], True)
    return out


def _across_change(
    segs: Sequence[SpeakerSegment], targets: list[tuple[int | None, bool]], faces: ShotFaces
) -> list[tuple[int | None, bool]]:
    """``targets`` (after `_beside_change`) where a change of voice has the same face dubbed on both sides and only
    one side is sure of it: the unsure side (its ambiguous segments from the change up to a sure one or another
    change, its half of the band included) dubbed on the other moving face, when exactly two are on screen.  A
    change of voice is a change of speaker; the likeliest face of an unsure turn is often the sure neighbour's
    still-moving mouth, which left the whole shot on one face."""
    live = [t.id for t in faces.tracks if not t.still]
    if len(live) != 2:
        return targets
    out = list(targets)
    for c in sorted({s.change for s in segs if s.change is not None}):
        before = [i for i, s in enumerate(segs) if s.end_frame <= c][::-1]  # moving away from the change
        after = [i for i, s in enumerate(segs) if s.start_frame >= c]
        jb = next((i for i in before if segs[i].change is None), None)
        ja = next((i for i in after if segs[i].change is None), None)
        if jb is None or ja is None:
            continue
        (face, unsure_b), (face_a, unsure_a) = out[jb], out[ja]
        if face is None or face != face_a or unsure_b == unsure_a:
            continue
        other = live[1] if live[0] == face else live[0]
        for i in before if unsure_b else after:
            if not out[i][1] or segs[i].change not in (None, c):
                break
            if out[i][0] == face:
                out[i] = (other, True)
    return out


def speaker_turns(faces: ShotFaces, uncertain: str, min_score: float) -> list[Turn]:
    """The turns covering the shot, from the face analysis's speaker segments: each reaches to the middle of
    the gaps around it (the first from frame 0, the last to the end); neighbours with the same track are
    one turn, scored by their time-weighted mean.  A turn is "uncertain" when another face moved its lips
    too in one of its segments or its score is below ``min_score``.  Under ``most_likely`` the uncertain
    speech beside a change of voice is dubbed on the face of the turn on its side (`_beside_change`), and an
    unsure turn not on the face its sure neighbour across a change of voice speaks with (`_across_change`)."""
    if uncertain not in UNCERTAIN:
        raise ValueError(f"speaker.uncertain must be one of {UNCERTAIN}, got {uncertain!r}")
    segs = list(faces.segments)
    targets = [_target(seg, faces, uncertain) for seg in segs]
    if uncertain == "most_likely":
        targets = _across_change(segs, _beside_change(segs, targets), faces)
    turns: list[list[Any]] = []  # [start, end, track, [(score, frames)], ambiguous]
    for i, seg in enumerate(segs):
        start = 0 if i == 0 else (segs[i - 1].end_frame + seg.start_frame) // 2
        end = faces.num_frames if i == len(segs) - 1 else (seg.end_frame + segs[i + 1].start_frame) // 2
        track, ambiguous = targets[i]
        scored = (seg.score, seg.end_frame - seg.start_frame)
        # the same speaker (or nobody) goes on: one turn; [issue 24] unless one of them is sure and the
        # other ambiguous (agreement segments: a clear line next to an unclear one stays apart)
        if (
            turns
            and turns[-1][2] == track
            and (turns[-1][4] == ambiguous or faces.agreement == faces.asd == ())
        ):
            turns[-1][1] = end
            turns[-1][3].append(scored)
            turns[-1][4] = turns[-1][4] or ambiguous
        else:
            turns.append([start, end, track, [scored], ambiguous])
    out = []
    for start, end, track, scores, ambiguous in turns:
        score = sum(s * n for s, n in scores) / max(1, sum(n for _, n in scores))
        sure = not ambiguous and (track is None or score >= min_score)
        out.append(Turn(start, end, track, round(score, 3), "speaker" if sure else "uncertain"))
    return out


def answer_turns(
    turns: Sequence[Turn],
    answers: Sequence[tuple[int, int, int | None]],
    shot_start: int,
    faces: ShotFaces,
    shot_index: int,
) -> list[Turn]:
    """The turns with the review's answers applied (``answers``: (start, end film frames, track | None)): a
    turn whose middle lies in an answer's frames speaks as answered (status "answered"; None: nobody on
    screen). An answer naming no face track of the shot raises ValueError naming the shot."""
    ids = {t.id for t in faces.tracks}
    for _a, _b, track in answers:
        if track is not None and track not in ids:
            have = ", ".join(map(str, sorted(ids))) or "none"
            raise ValueError(
                f"shot {shot_index}: answer {track}: no such face track (the shot's tracks: {have})"
            )
    out = []
    for turn in turns:
        mid = shot_start + (turn.start + turn.end) // 2
        hit = [track for a, b, track in answers if a <= mid < b]
        if hit:
            status = "answered" if hit[-1] is not None else "none"
            turn = Turn(turn.start, turn.end, hit[-1], turn.score, status)
        out.append(turn)
    return out


def _why_not(faces: ShotFaces, turns: Sequence[Turn]) -> str:
    if not faces.tracks:
        return "no face found"
    if all(t.still for t in faces.tracks):
        return "only still faces (poster, photo or screen)"
    if any(turn.status == "uncertain" for turn in turns):
        return "speaker uncertain (speaker.uncertain: skip)"
    return "speaker off screen"


def decide_dub(
    ov: ShotOverrides,
    speech: SpeechInfo,
    faces: ShotFaces | None,
    region: RegionConfig,
    gate: GateConfig,
    speaker: SpeakerConfig,
    *,
    turns: Sequence[Turn] | None = None,
    why_not: str = "",
    names: Mapping[str, str] | None = None,
) -> ShotDecision:
    """Decide whether and where to dub one shot (``ov``: its overrides; its region overrides are applied
    after, by `apply_region_overrides`).

    Order: `precedence` (skip override, policy "none", a forced dub, no speech in the dub slice); then
    someone on screen must say the source's lines (``gate.require_face`` false lets full-frame mode dub
    speech shots without a face; uncertain turns follow ``speaker.uncertain`` / ``speaker.min_score``).
    ``faces`` may be None only when the decision cannot depend on it.  ``turns`` (per-character stems,
    `tasks.decision.stems`): replace the face analysis's speaker turns; ``why_not`` then says why a shot
    with no dubbed turn is passed through.  ``names``: {track id (str): character}.
    """
    ruling = precedence(ov, gate.policy, speech)
    if ruling.dub is False:
        return ShotDecision(False, ruling.reason)
    if faces is None:
        raise ValueError(f"shot {ov.index}: the decision needs the shot's face analysis")
    turns = speaker_turns(faces, speaker.uncertain, speaker.min_score) if turns is None else turns
    regions = tuple(_region(faces, turn, region) for turn in turns if turn.track is not None)
    if ruling.dub:
        return ShotDecision(True, ruling.reason, regions or (_whole_shot(faces, region, "forced"),))
    pct = f"speech {speech.speech_ratio:.0%}"
    if regions:
        who = " -> ".join(_who(r, names or {}) for r in regions)
        sure = all(r.status in ("speaker", "two", "answered") for r in regions)
        tag = "speaker" if sure else f"speaker uncertain, {speaker.uncertain.replace('_', ' ')}"
        return ShotDecision(True, f"{pct}; {tag}: {who} (score {min(r.score for r in regions):.2f})", regions)
    if region.mode == "full" and not gate.require_face:
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
    return _region(faces, Turn(start=0, end=faces.num_frames, track=track, score=0.0, status=status), cfg)


def _holding(boxes: list[Box], frame_hw: tuple[int, int], num_frames: int, cfg: RegionConfig) -> RegionPlan:
    """A two-speaker region's plan: the smallest bucket-aspect box holding every face box with a margin,
    static; the full-frame box when that does not fit in the frame."""
    x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    both = (int(x0), int(y0), int(x1), int(y1))
    (h, w), bucket = snap_box_size(1.4 * (y1 - y0), 1.15 * (x1 - x0), frame_hw, cfg.size)
    if cfg.mode == "full" or h < y1 - y0 or w < x1 - x0:
        box, bucket = full_frame_box(frame_hw, cfg.size)
        mode, why = "full", "two speakers: full frame"
    else:
        bx = min(max(round((x0 + x1 - w) / 2), 0), frame_hw[1] - w)
        by = min(max(round((y0 + y1 - h) / 2), 0), frame_hw[0] - h)
        box, mode, why = (bx, by, bx + w, by + h), "region", "two speakers: a box holding both faces"
    return RegionPlan(
        mode=mode, box=box, bucket=bucket, face_found=True, detections=len(boxes), reason=why,
        frame_size=frame_hw, num_frames=num_frames, face_box=both,
    )  # fmt: skip


def _region(faces: ShotFaces, turn: Turn, cfg: RegionConfig) -> DubRegion:
    """The dub box of the turn's frames around its track (tasks.picture.region geometry, display pixels); a
    two-speaker turn's box holds every person's box (`people`)."""
    start, end, track = turn.start, turn.end, turn.track
    samples: list[tuple[int, Box]] = []
    n_samples = len(range(0, end - start, max(1, faces.step_frames)))
    if turn.people:
        plan = _holding([p["box"] for p in turn.people], faces.display_hw, end - start, cfg)
    else:
        if track is not None:
            tr = faces.track(track)
            samples = [(t - start, b) for t, b in tr.samples(start, end)] or [(0, tr.boxes[-1])]
            n_samples = max(1, len(samples))
        plan = plan_from_track(samples or None, faces.display_hw, end - start, n_samples, cfg)
        if track is None and cfg.mode != "full":
            box, bucket = full_frame_box(faces.display_hw, cfg.size)
            plan = RegionPlan(
                mode="full", box=box, bucket=bucket, face_found=False, detections=0, reason="no face: full frame",
                frame_size=faces.display_hw, num_frames=end - start,
            )  # fmt: skip
    return DubRegion(
        start_frame=start, end_frame=end, speaker=track, score=round(turn.score, 3), status=turn.status,
        plan=plan, people=turn.people,
    )  # fmt: skip


def apply_region_overrides(
    decision: ShotDecision,
    ov: ShotOverrides,
    faces: ShotFaces | None,
    region: RegionConfig,
    frame_hw: tuple[int, int],
    num_frames: int,
) -> ShotDecision:
    """The automatic ``decision`` with the shot's speaker / crop overrides (``ov``) applied: one region over
    the whole shot, around that face track and/or in that box, dubbed whatever the evidence said (a shot
    skipped by its dub override stays skipped). An unknown track raises ValueError naming the shot."""
    speaker, box = ov.speaker, ov.crop
    if ov.action == "skip" or (speaker is None and box is None):
        return decision
    what = [] if speaker is None else [f"speaker {speaker}"]
    if speaker is not None:
        ids = [t.id for t in faces.tracks] if faces is not None else []
        if speaker not in ids:
            have = ", ".join(map(str, ids)) or "none"
            raise ValueError(
                f"shot {ov.index}: speaker {speaker}: no such face track (the shot's tracks: {have})"
            )
    if box is not None:
        what.append(f"crop [{', '.join(map(str, box))}]")
    reason = "plan: " + ", ".join(what)
    if box is None:
        assert faces is not None
        whole = Turn(start=0, end=faces.num_frames, track=speaker, score=0.0, status="plan")
        dubbed = _region(faces, whole, region)
    else:
        plan = plan_from_box(box, frame_hw, num_frames, region.size, reason)
        dubbed = DubRegion(
            start_frame=0, end_frame=num_frames, speaker=speaker, score=0.0, status="plan", plan=plan
        )
    return ShotDecision(True, reason, (dubbed,))


__all__ = ["UNCERTAIN", "answer_turns", "apply_region_overrides", "decide_dub", "speaker_turns"]
