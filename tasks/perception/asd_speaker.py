"""The speaker decision on learned speaking scores (Light-ASD, `tasks.perception.asd`), and its join with the
agreement route's verdict (`tasks.perception.speaker.refine_with_agreement`).

With a learned active-speaker score per face and frame (`tasks.perception.asd`, Light-ASD: does this
face say what is heard), `find_asd_speakers` gives a second verdict: `speaker`'s Viterbi pass over the per-step
scores (the evidence that track j speaks is its score above ``on``), each run judged on the scores of
every visible face: one face clearly above ``on`` (by ``band``) leading every other by ``margin`` or with
every other below ``on + band`` = that face speaks (a moving listener, an out-of-sync copy score low);
none above it = "none" (voice-over, a reaction shot); two above it close together, or the best within
``band`` of ``on`` = "uncertain" (two speakers, or the network cannot tell).  A segment shorter than
``min_s`` (a short line after a pause) is a speaker only when it continues the previous speaker; and a
speaker whose lips do not go better with their own moment of the audio than with others (mean sync lead,
`tasks.perception.asd.sync_lead`, below ``sync_min``: lips that move during speech without following it,
a lone face mouthing along) is only "uncertain"; so is a face alone on screen leading by less than
``sync_sure`` (a close-up and a reaction shot under an off-screen voice look alike to the network).
`fuse_asd` then joins the two verdicts frame by frame: the network settles what agreement left
uncertain, contradicts (-> uncertain) a confident agreement speaker when it is sure of another face or
of nobody or cannot confirm that face on its own (uncertain about it with no rival: weak sync lead, a
score barely above the line, too short a line; the held-out reaction shot, a lone face mouthing along
that agreement took for the speaker), and leaves agreement's "none" alone (no moving mouth, or none
following the speech: the network scores a listener's parted lips under a voice-over as speaking) unless
it names a face clearly in sync, or one whose line it gives that face elsewhere (-> uncertain).  Whichever route
named it, a confident face whose lips fit other moments of the audio better (a negative mean lead over its
segment) is uncertain (`doubt_out_of_sync`).  Near a
change of speaker only two routes agreeing are sure: a confident segment that neighbours another face's
within the network's reach (``REACH_S``) is uncertain unless agreement named its face
(`doubt_unconfirmed_switches`).  And a shot in which the two routes contradict each other for a line or more (one
sure of a face, the other naming another in sync) has no confident segment at all (`doubt_contradicted_shot`):
both measure rhythm, and a listener whose lips fit it by chance in one line can fool both in the next.
Pure numpy on per-frame rows (no media, no models).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from model.speaker.light_asd_format import VIDEO_FPS
from tasks.perception.asd import SHIFTS
from tasks.perception.speaker import (
    SpeakerSegment,
    SpeakerSettings,
    row_means,
    speech_runs,
    step_means,
    still_tracks,
    viterbi,
)

# how far the network's verdict may carry a turn into its neighbour: the sync lead's farthest swap (1.6 s)
REACH_S = max(abs(d) for d in SHIFTS) / VIDEO_FPS


@dataclass(frozen=True)
class AsdSettings:
    """Thresholds of the learned active-speaker decision (the `speaker:` section's asd_* keys)."""

    on: float  # per-step mean score above this: the face says the line
    band: float  # a best face below on + band is "uncertain", so is one led by less than ``margin`` by
    margin: float  # ... a second face above on + band (two speakers?)
    scale: float  # score above ``on`` of a full-strength segment
    switch_penalty: float  # evidence (steps x score units) a speaker change must win by
    min_s: float  # a shorter segment is a speaker only as the previous one's speaker going on
    sync_min: (
        float  # a speaker's mean sync lead (score lost by moving the audio) must reach this, else uncertain
    )
    sync_sure: float  # a lone face's speaker needs this lead (else uncertain); it overrules agreement's none


def find_asd_speakers(
    asd: np.ndarray,
    lead: np.ndarray,
    face_change: np.ndarray,
    speech_prob: np.ndarray,
    fps: float,
    settings: SpeakerSettings,
    asd_settings: AsdSettings,
) -> list[SpeakerSegment]:
    """Speaker segments of one shot from learned speaking scores (`tasks.perception.asd.asd_scores`).

    asd, lead (n_tracks, T): each track's speaking score per frame (> 0: speaking) and its sync lead, NaN
    where absent;
    face_change (n_tracks, T): the still-picture test's; speech_prob (T,): the source's speech probability.
    """
    n_tracks, n_frames = asd.shape if asd.ndim == 2 else (0, len(speech_prob))
    speech = np.asarray(speech_prob) >= 0.5
    if n_frames == 0 or not speech.any():
        return []
    step = max(1, round(settings.step_s * fps))
    n_steps = -(-n_frames // step)
    still = still_tracks(face_change, settings) if n_tracks else np.zeros(0, bool)
    sc = np.where(still[:, None], np.nan, asd.astype(np.float64)) if n_tracks else np.zeros((0, n_frames))
    steps_sc = step_means(sc, step, n_steps)
    steps_lead = step_means(lead.astype(np.float64), step, n_steps) if n_tracks else steps_sc
    steps_speech = np.array([speech[s * step : (s + 1) * step].mean() >= 0.5 for s in range(n_steps)])
    shown = (  # (n_tracks, n_steps): the face is on screen at that step
        ~np.isnan(step_means(face_change.astype(np.float64), step, n_steps))
        if n_tracks
        else np.zeros((0, n_steps), bool)
    )
    lone = shown & (shown.sum(axis=0) == 1)  # (n_tracks, n_steps): the only face on screen at that step
    evidence = np.zeros((n_tracks + 1, n_steps))  # state 0: nobody on screen
    with np.errstate(invalid="ignore"):
        evidence[1:] = np.clip(steps_sc - asd_settings.on, -4.0, 4.0)
    evidence[1:][np.isnan(steps_sc)] = -8.0  # an absent face cannot be the speaker
    evidence[1:, ~steps_speech] = np.where(np.isnan(steps_sc[:, ~steps_speech]), -8.0, 0.0)
    states = viterbi(evidence, asd_settings.switch_penalty)
    bridge = max(1, round(0.4 / settings.step_s))
    out: list[SpeakerSegment] = []
    least = round(asd_settings.min_s * fps)
    for s0, s1, state in speech_runs(states, steps_speech, bridge):
        f0, f1 = s0 * step, min(n_frames, s1 * step)
        means = row_means(steps_sc[:, s0:s1])
        seg = _judge_asd(state - 1, means, (f0, f1), asd_settings)
        if seg.status == "speaker" and seg.speaker is not None:
            synced = row_means(steps_lead[seg.speaker : seg.speaker + 1, s0:s1])[0]
            if not synced >= asd_settings.sync_min:  # moving lips that do not follow the speech
                seg = dataclasses.replace(seg, status="uncertain", score=round(0.5 * seg.score, 3))
            elif lone[seg.speaker, s0:s1].all() and not synced >= asd_settings.sync_sure:
                # the only face on screen (a close-up, or a reaction shot under an off-screen voice): no other
                # face to rank it against, so only a strong lead tells its own line from other words
                seg = dataclasses.replace(seg, status="uncertain", score=round(0.5 * seg.score, 3))
        if f1 - f0 < least and seg.status != "none":  # a short line: only as the previous speaker going on
            prev = out[-1] if out else None
            k = seg.speaker
            goes_on = prev is not None and prev.status == "speaker" and prev.speaker == k
            if goes_on and k is not None and means[k] > asd_settings.on:
                seg = dataclasses.replace(seg, status="speaker", runner_up=None, score=prev.score)
            elif seg.status == "speaker":
                seg = dataclasses.replace(seg, status="uncertain", score=round(0.5 * seg.score, 3))
        out.append(seg)
    return out


def _judge_asd(chosen: int, means: np.ndarray, frames: tuple[int, int], a: AsdSettings) -> SpeakerSegment:
    """Status and score of one segment from each face's mean speaking score (NaN: absent)."""
    f0, f1 = frames
    ranked = sorted(((float(means[k]), k) for k in range(len(means)) if not np.isnan(means[k])), reverse=True)
    if chosen < 0 or chosen not in [k for _, k in ranked]:
        top, who = ranked[0] if ranked else (-np.inf, None)
        if who is not None and top > a.on - a.band:  # nobody by the path, yet a face is near the line
            return SpeakerSegment(
                f0,
                f1,
                "uncertain",
                who,
                round(float(np.clip((top - a.on + a.band) / (4 * a.band), 0, 0.5)), 3),
            )
        return SpeakerSegment(
            f0, f1, "none", None, round(float(np.clip((a.on - top) / a.scale, 0.0, 1.0)), 3)
        )
    best = float(means[chosen])
    rivals = [(m, k) for m, k in ranked if k != chosen]
    second, rival = rivals[0] if rivals else (-np.inf, None)
    strength = float(np.clip((best - a.on) / a.scale, 0.0, 1.0))
    if rival is not None and second >= a.on + a.band and best - second < a.margin:  # two speakers?
        lead = float(np.clip((best - second) / a.margin, 0.0, 1.0))
        return SpeakerSegment(f0, f1, "uncertain", chosen, round(0.5 * strength * lead, 3), rival)
    if best < a.on + a.band:
        return SpeakerSegment(f0, f1, "uncertain", chosen, round(0.5 * strength, 3), rival)
    return SpeakerSegment(f0, f1, "speaker", chosen, round(0.5 + 0.5 * strength, 3))


def _unconfirmed(b: SpeakerSegment | None, k: int | None) -> bool:
    """The learned route left face ``k`` uncertain with no rival face: its mean sync lead is below
    ``sync_min`` (lips moving while the speech plays without following it, a lone face mouthing other
    words), it is barely above the line, or its line is too short to tell."""
    return b is not None and b.status == "uncertain" and b.speaker == k and b.runner_up is None


def _span_leads(lead: np.ndarray, seg: SpeakerSegment) -> np.ndarray:
    """(n_tracks,) each face's mean sync lead over ``seg``'s frames (NaN where it has none: absent, unscored)."""
    rows = np.asarray(lead[:, seg.start_frame : seg.end_frame], np.float64)
    return np.array([np.nanmean(r) if np.isfinite(r).any() else np.nan for r in rows])


@dataclass(frozen=True)
class SyncEvidence:
    """What the fusion's lead rules read: the sync leads (n_tracks, T) of `asd_scores`, the thresholds and
    the clock (a learned segment shorter than ``settings.min_s`` never overrules agreement)."""

    lead: np.ndarray
    settings: AsdSettings
    fps: float

    def leads(self, learned: list[SpeakerSegment]) -> dict[int, float]:
        """{id(segment): mean lead of the face it names over its frames} for the segments long enough to
        count (NaN where unscored)."""
        least = round(self.settings.min_s * self.fps)
        out: dict[int, float] = {}
        for seg in learned:
            if seg.speaker is None or seg.end_frame - seg.start_frame < least:
                continue
            out[id(seg)] = float(_span_leads(self.lead, seg)[seg.speaker])
        return out


def fuse_asd(
    agreed: list[SpeakerSegment],
    learned: list[SpeakerSegment],
    n_frames: int,
    sync: SyncEvidence | None = None,
) -> list[SpeakerSegment]:
    """Frame by frame, the agreement route's segments (``agreed``: `refine_with_agreement`) joined with the
    learned ones (``learned``: `find_asd_speakers`), then runs of one verdict as segments (score: the mean
    of the chosen verdicts' scores).  Agreement uncertain + learned speaker -> the learned speaker; a
    confident agreement speaker stays unless the learned route is sure of another face (-> uncertain, both
    named) or of nobody (-> uncertain), or cannot confirm it.  With the sync leads (``sync``), over learned
    segments of at least ``min_s``: a confident agreement speaker whose learned segment names another face
    leading by at least ``sync_min`` is uncertain (both named), agreement "none" gives way to "uncertain"
    where the learned route names a face leading by ``sync_sure`` or inside a learned speaker segment whose
    face the fusion names the speaker elsewhere in it (one line is not nobody's in part: the held-out
    speaker whose lips follow her voice weakly was "nobody" for its first 1.2 s), else it stays; where that
    "nobody" runs straight into the line's first frame the fusion gives its face, it is the line's start
    (agreement's correlation warming up: the held-out out-of-sync speaker was dubbed 10 frames late) and the
    face speaks from the line's start; then `doubt_out_of_sync` (a confident face whose lips fit other moments
    of the audio better),
    `doubt_unconfirmed_switches` and `doubt_contradicted_shot` (a contradiction of ``min_s`` or more)."""
    leads = sync.leads(learned) if sync is not None else {}
    settings = sync.settings if sync is not None else None

    def frames(segs: list[SpeakerSegment]) -> list[SpeakerSegment | None]:
        out: list[SpeakerSegment | None] = [None] * n_frames
        for seg in segs:
            out[seg.start_frame : seg.end_frame] = [seg] * (min(n_frames, seg.end_frame) - seg.start_frame)
        return out

    verdicts: list[tuple[str, int | None, int | None] | None] = []
    scores = np.zeros(n_frames)
    # per frame, agreement's own verdict: nobody on screen / sure of a face (the warm-up rule below reads them)
    nobody = [a is not None and a.status == "none" for a in frames(agreed)]
    sure_agreed = [a is not None and a.status == "speaker" for a in frames(agreed)]
    for t, (a, b) in enumerate(zip(frames(agreed), frames(learned), strict=True)):
        pick: tuple[str, int | None, int | None] | None = None
        sure_b = b is not None and b.status == "speaker"
        if a is None:
            pick, scores[t] = (
                (None if b is None else (b.status, b.speaker, b.runner_up)),
                0 if b is None else b.score,
            )
        elif a.status == "uncertain" and sure_b:
            pick, scores[t] = ("speaker", b.speaker, None), b.score
        elif a.status == "speaker" and sure_b and b.speaker != a.speaker:
            pick, scores[t] = ("uncertain", a.speaker, b.speaker), 0.5 * min(a.score, b.score)
        elif a.status == "speaker" and b is not None and b.status == "none":  # sure nobody on screen says it
            pick, scores[t] = ("uncertain", a.speaker, None), 0.5 * a.score
        elif a.status == "speaker" and _unconfirmed(b, a.speaker):  # its lips not shown to follow the audio
            pick, scores[t] = ("uncertain", a.speaker, None), 0.5 * min(a.score, b.score)
        elif (
            settings is not None
            and a.status == "speaker"
            and b is not None
            and b.status == "uncertain"
            and b.speaker not in (None, a.speaker)
            and leads.get(id(b), np.nan) >= settings.sync_min
        ):  # the network's best is another face, in sync with the speech: agreement may have the listener
            pick, scores[t] = ("uncertain", a.speaker, b.speaker), 0.5 * min(a.score, b.score)
        elif (
            settings is not None
            and a.status == "none"
            and b is not None
            and b.status != "none"
            and b.speaker is not None
            and leads.get(id(b), np.nan) >= settings.sync_sure
        ):  # a face clearly in sync where agreement heard nobody on screen
            pick, scores[t] = ("uncertain", b.speaker, None), 0.5 * b.score
        else:
            pick, scores[t] = (a.status, a.speaker, a.runner_up), a.score
        verdicts.append(pick)
    for seg in learned:  # one line of the network's is not nobody's where the fusion gives it to its face
        span = range(seg.start_frame, min(n_frames, seg.end_frame))
        named, doubted = ("speaker", seg.speaker, None), ("uncertain", seg.speaker, None)
        first = next((t for t in span if verdicts[t] == named), None)  # the fusion's first sure frame of it
        if seg.status != "speaker" or first is None:
            continue
        warm = first  # from here to ``first`` the face speaks: the line's start, agreement warming up
        if sure_agreed[first]:  # agreement's "nobody" running straight into its own sure frames of the face
            while warm > seg.start_frame and nobody[warm - 1] and verdicts[warm - 1] is not None:
                if verdicts[warm - 1][0] != "none" and verdicts[warm - 1] != doubted:
                    break
                warm -= 1
        for t in span:
            if warm <= t < first:
                verdicts[t], scores[t] = named, seg.score
            elif verdicts[t] is not None and verdicts[t][0] == "none":
                verdicts[t], scores[t] = doubted, 0.5 * seg.score
    out: list[SpeakerSegment] = []
    t = 0
    while t < n_frames:
        v = verdicts[t]
        e = t + 1
        while e < n_frames and verdicts[e] == v:
            e += 1
        if v is not None:
            out.append(SpeakerSegment(t, e, v[0], v[1], round(float(np.mean(scores[t:e])), 3), v[2]))
        t = e
    if sync is None:
        return out
    out = doubt_out_of_sync(out, sync)
    out = doubt_unconfirmed_switches(out, agreed, round(REACH_S * sync.fps))
    return doubt_contradicted_shot(out, agreed, learned, round(sync.settings.min_s * sync.fps), sync)


def doubt_out_of_sync(fused: list[SpeakerSegment], sync: SyncEvidence) -> list[SpeakerSegment]:
    """Confident speaker segments whose face's mean sync lead over them is below zero are "uncertain": its lips
    go better with other moments of the audio than with this one.  Agreement correlates lip motion with the
    speech's energy, which a listener mouthing along can match for a line; the network's lead asks whether the
    lips follow this moment of the audio (the held-out moving listener that agreement named for 2 s led by
    -0.15 there, the speaker beside it by +0.16; the confident faces of the right cases lead by 0.26 or more,
    and the learned route's own speakers by ``sync_min`` at least).  A face the network did not score (beyond
    ``asd_max_faces``) keeps its verdict."""
    out = []
    for seg in fused:
        # a face with no lead (unscored: NaN) is not below the bar
        if (
            seg.status == "speaker"
            and seg.speaker is not None
            and _span_leads(sync.lead, seg)[seg.speaker] < 0.0
        ):
            seg = dataclasses.replace(seg, status="uncertain", score=round(0.5 * seg.score, 3))
        out.append(seg)
    return out


def name_likeliest(segments: list[SpeakerSegment], lead: np.ndarray) -> list[SpeakerSegment]:
    """Uncertain segments named after the face whose lips follow the speech best over them (the highest mean
    sync lead of the faces the network scored), the face named before kept as the runner-up.  Only what
    `speaker.uncertain: most_likely` dubs changes, not any confidence: over the uncertain turns of the 210
    composed cases the named face was right on 57 % of their frames before, 66 % this way (benchmarks/RESULTS.md).

    lead (n_tracks, T): `asd_scores`' sync leads, NaN where a face is absent or unscored."""
    out = []
    for seg in segments:
        if seg.status == "uncertain" and seg.speaker is not None:
            means = _span_leads(lead, seg)
            best = int(np.nanargmax(means)) if np.isfinite(means).any() else seg.speaker
            if best != seg.speaker:
                seg = dataclasses.replace(seg, speaker=best, runner_up=seg.speaker)
        out.append(seg)
    return out


def _confirmed(seg: SpeakerSegment, agreed: list[SpeakerSegment]) -> bool:
    """Agreement itself named ``seg``'s face the speaker over at least half of its frames."""
    both = sum(
        max(0, min(a.end_frame, seg.end_frame) - max(a.start_frame, seg.start_frame))
        for a in agreed
        if a.status == "speaker" and a.speaker == seg.speaker
    )
    return 2 * both >= seg.end_frame - seg.start_frame


def doubt_unconfirmed_switches(
    fused: list[SpeakerSegment], agreed: list[SpeakerSegment], reach: int
) -> list[SpeakerSegment]:
    """Confident speaker segments that hand the floor to another face's confident segment less than ``reach``
    frames away are "uncertain" unless agreement itself named their face: the sync lead's swapped pairs
    carry a turn's evidence that far into its neighbour (the recurrent chunks, of up to 6 s, further still),
    so near a change of speaker the network's verdict alone may be the other turn's (the held-out turn-taking case gave the answer's face
    1.5 s of the first line; a moving listener took 1.8 s from a speaker whose lips follow the voice weakly,
    the network then naming the speaker for the rest of the shot)."""
    sure = [i for i, s in enumerate(fused) if s.status == "speaker" and s.speaker is not None]
    doubt: set[int] = set()
    for i, j in zip(sure, sure[1:], strict=False):
        a, b = fused[i], fused[j]
        if a.speaker != b.speaker and b.start_frame - a.end_frame < reach:
            doubt.update(k for k in (i, j) if not _confirmed(fused[k], agreed))
    return [
        dataclasses.replace(s, status="uncertain", score=round(0.5 * s.score, 3)) if i in doubt else s
        for i, s in enumerate(fused)
    ]


def contradicted_frames(
    agreed: list[SpeakerSegment],
    learned: list[SpeakerSegment],
    n_frames: int,
    in_sync: dict[int, float] | None = None,
    sync_min: float = 0.0,
) -> int:
    """Frames on which one route is sure of a face while the other names a different one: the two measures of
    lip-audio fit disagree about whose lips carry the line.  A learned segment that is only a guess counts
    where its face is in sync with the speech (``in_sync``: `SyncEvidence.leads`, at least ``sync_min``), as
    in `fuse_asd`; without ``in_sync`` every guess counts."""
    count = 0
    for seg in agreed:
        for other in learned:
            if None in (seg.speaker, other.speaker) or seg.speaker == other.speaker:
                continue
            if "speaker" not in (seg.status, other.status):
                continue
            guess = other.status != "speaker"
            if guess and in_sync is not None and not in_sync.get(id(other), np.nan) >= sync_min:
                continue
            f0, f1 = max(seg.start_frame, other.start_frame), min(seg.end_frame, other.end_frame, n_frames)
            count += max(0, f1 - f0)
    return count


def doubt_contradicted_shot(
    fused: list[SpeakerSegment],
    agreed: list[SpeakerSegment],
    learned: list[SpeakerSegment],
    least: int,
    sync: SyncEvidence | None = None,
) -> list[SpeakerSegment]:
    """Every confident segment of a shot is "uncertain" when, for ``least`` frames or more anywhere in it, one
    route is sure of a face and the other names another.  Both routes measure how well a face's lips fit the
    rhythm of the speech; a listener who talks or mouths along fits it by chance for a line or two, and where
    that fools one route in one line it can fool both in the next (the held-out two talking faces: agreement
    took the speaker for her first line and the listener for the rest, the network took the listener for the
    middle line, the fused verdict named the listener with confidence; the held-out turn-taking case:
    agreement gave the first line to the answer's face, whose later line the network was sure of while
    agreement preferred the other face there).  So a contradiction is a shot for review, not a vote."""
    ends = [s.end_frame for s in fused]
    in_sync, sync_min = (None, 0.0) if sync is None else (sync.leads(learned), sync.settings.sync_min)
    if not ends or contradicted_frames(agreed, learned, max(ends), in_sync, sync_min) < least:
        return fused
    return [
        dataclasses.replace(s, status="uncertain", score=round(0.5 * s.score, 3))
        if s.status == "speaker"
        else s
        for s in fused
    ]


__all__ = [
    "AsdSettings",
    "SyncEvidence",
    "contradicted_frames",
    "doubt_contradicted_shot",
    "doubt_out_of_sync",
    "doubt_unconfirmed_switches",
    "find_asd_speakers",
    "fuse_asd",
    "name_likeliest",
]
