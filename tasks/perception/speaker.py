"""Who speaks when in a shot: the source's speech timeline + each face track's mouth activity -> segments.

Holds the active-speaker decision, pure numpy on per-frame signals (no media, no models):

1. A track whose face never changes is a still picture (poster, photo, paused screen) and never speaks.
2. Mouth activity is smoothed over ``smooth_s`` and averaged per ``step_s`` step.  In each step with source
   speech, the evidence that track j speaks is its activity above ``activity_on`` (a still listener's lips
   stay below it, a talking face's go well above); "nobody on screen" has evidence 0.  A Viterbi pass with a
   ``switch_penalty`` picks one state per step, so the speaker changes only on sustained evidence.
3. Each run of speech steps with one state is a `SpeakerSegment`: its track and a score, or nobody
   ("none": voice-over, off-screen speaker, only listeners on screen), or "uncertain" when another visible
   face moves its lips too (two talking faces: lip motion alone cannot tell; the one that is still in the
   shot's pauses and moves in its speech wins only if that contrast is clear).

4. With the source's own audio, `refine_with_agreement` judges each segment again on audio-visual
   agreement (`tasks.perception.av_sync`): where several mouths move, the one whose motion follows the
   speech clearly better is the speaker (a moving listener, an out-of-sync face lose), none following it
   is "none", neither clearly is "uncertain"; a lone moving mouth that does not follow the speech at all
   is "none" (a reaction shot under an off-screen voice).

The learned route (Light-ASD scores) is `tasks.perception.asd_speaker`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SpeakerSettings:
    """Thresholds of the speaker decision (the `speaker:` section)."""

    activity_on: float  # mouth activity above this means lips are moving (normalised patch units)
    still_face: float  # a track whose 90th-percentile face change stays below this is a still picture
    smooth_s: float  # activity smoothing window
    step_s: float  # decision step
    switch_penalty: float  # evidence (in steps x activity_on units) a speaker change must win by
    contrast_min: float  # speech-minus-pause activity gap that resolves an uncertain pair


@dataclass(frozen=True)
class AvSettings:
    """Thresholds of the agreement decision (the `speaker:` section's av_* keys)."""

    on: float  # agreement above this (and a lead of ``margin``): the lips follow the speech
    off: float  # talking faces all below this: nobody on screen says the line
    scale: float  # agreement above ``on`` of a full-strength score
    margin: float  # the speaker must out-agree every other talking face by this, else "uncertain"


@dataclass(frozen=True)
class SpeakerSegment:
    """Frames [start_frame, end_frame) of a shot with source speech and who says it."""

    start_frame: int
    end_frame: int
    status: str  # "speaker" | "none" | "uncertain"
    speaker: int | None  # track id: the speaker, or the most likely one when uncertain; None for "none"
    score: float  # 0..1 confidence in the status
    runner_up: int | None = None  # the other candidate of an uncertain segment
    # an uncertain segment beside a change of voice (content's turn band): the frame of that change; the
    # segment lies wholly on one side of it, and the likeliest-face policy dubs it on that side's turn's face
    change: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["change"] is None:  # records without a change read as before
            del d["change"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeakerSegment:
        spk, run, chg = d.get("speaker"), d.get("runner_up"), d.get("change")
        return cls(
            int(d["start_frame"]), int(d["end_frame"]), str(d["status"]),
            None if spk is None else int(spk), float(d["score"]), None if run is None else int(run),
            None if chg is None else int(chg),
        )  # fmt: skip


def still_tracks(face_change: np.ndarray, settings: SpeakerSettings) -> np.ndarray:
    """(n_tracks,) bool: tracks whose face (mouth and upper patch) never changes: still pictures."""
    out = np.zeros(face_change.shape[0], bool)
    for k, row in enumerate(face_change):
        vals = row[~np.isnan(row)]
        out[k] = len(vals) > 0 and float(np.percentile(vals, 90)) < settings.still_face
    return out


def _smooth(x: np.ndarray, n: int) -> np.ndarray:
    """NaN-aware running mean over ``n`` frames along the last axis (NaN where no value in the window)."""
    if n <= 1:
        return x.copy()
    ok = ~np.isnan(x)
    v = np.where(ok, x, 0.0)
    kernel = np.ones(n) / n
    num = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="same"), -1, v)
    den = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="same"), -1, ok.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0.3, num / np.maximum(den, 1e-9), np.nan)


def viterbi(evidence: np.ndarray, penalty: float) -> np.ndarray:
    """Best state per step for (n_states, n_steps) log-evidence (state 0: nobody on screen).

    A change between two speakers costs ``penalty``; to or from nobody costs half of it, so a pause in lip
    motion between two speakers' turns does not force one of them to keep the floor.
    """
    n_states, n_steps = evidence.shape
    cost = np.full((n_states, n_states), penalty)  # cost[from, to]
    cost[0, :] = cost[:, 0] = penalty / 2
    np.fill_diagonal(cost, 0.0)
    score = evidence[:, 0].copy()
    back = np.zeros((n_states, n_steps), np.int64)
    for t in range(1, n_steps):
        total = score[:, None] - cost  # (from, to)
        back[:, t] = np.argmax(total, axis=0)
        score = total[back[:, t], np.arange(n_states)] + evidence[:, t]
    states = np.zeros(n_steps, np.int64)
    states[-1] = int(np.argmax(score))
    for t in range(n_steps - 1, 0, -1):
        states[t - 1] = back[states[t], t]
    return states


def speech_runs(states: np.ndarray, speech: np.ndarray, bridge_steps: int) -> list[tuple[int, int, int]]:
    """[(first step, end step, state)] of the speech steps; a short nobody-run right after a speaker's run in
    the same stretch of speech is the speaker still talking with little lip motion (it joins that run)."""
    runs: list[list[int]] = []
    for s in range(len(states)):
        if not speech[s]:
            continue
        if runs and runs[-1][1] == s and runs[-1][2] == states[s]:
            runs[-1][1] = s + 1
        else:
            runs.append([s, s + 1, int(states[s])])
    out: list[list[int]] = []
    for run in runs:
        prev = out[-1] if out else None
        touching = prev is not None and prev[1] == run[0]
        quiet_tail = touching and run[2] == 0 and prev[2] != 0 and run[1] - run[0] <= bridge_steps
        if touching and (quiet_tail or prev[2] == run[2]):
            prev[1] = run[1]
        else:
            out.append(run)
    return [(a, b, c) for a, b, c in out]


def _contrast(act: np.ndarray, speech: np.ndarray, k: int) -> float | None:
    """Mean activity of track k in speech frames minus in pause frames (None without both)."""
    row = act[k]
    ok = ~np.isnan(row)
    on, off = ok & speech, ok & ~speech
    if on.sum() < 5 or off.sum() < 10:
        return None
    return float(np.mean(row[on]) - np.mean(row[off]))


def find_speakers(
    activity: np.ndarray,
    face_change: np.ndarray,
    speech_prob: np.ndarray,
    fps: float,
    settings: SpeakerSettings,
) -> list[SpeakerSegment]:
    """Speaker segments of one shot.

    activity (n_tracks, T): mouth activity per frame, NaN where the track is not visible; face_change
    (n_tracks, T): upper-face + mouth change (still-picture test); speech_prob (T,): source speech
    probability at each frame.
    """
    n_tracks, n_frames = activity.shape if activity.ndim == 2 else (0, len(speech_prob))
    speech = speech_prob >= 0.5
    if n_frames == 0 or not speech.any():
        return []
    step = max(1, round(settings.step_s * fps))
    n_steps = -(-n_frames // step)
    still = still_tracks(face_change, settings) if n_tracks else np.zeros(0, bool)
    act = (
        _smooth(activity.astype(np.float64), max(1, round(settings.smooth_s * fps))) if n_tracks else activity
    )
    act = np.where(still[:, None], np.nan, act) if n_tracks else act
    steps_act = np.full((n_tracks, n_steps), np.nan)
    steps_speech = np.zeros(n_steps, bool)
    for s in range(n_steps):
        sl = slice(s * step, min(n_frames, (s + 1) * step))
        steps_speech[s] = speech[sl].mean() >= 0.5
        for k in range(n_tracks):
            vals = act[k, sl][~np.isnan(act[k, sl])]
            if len(vals):
                steps_act[k, s] = float(np.mean(vals))
    on = settings.activity_on
    evidence = np.zeros((n_tracks + 1, n_steps))  # state 0: nobody on screen
    with np.errstate(invalid="ignore"):
        evidence[1:] = np.clip((steps_act - on) / on, -2.0, 4.0)
    evidence[1:][np.isnan(steps_act)] = -8.0  # an absent face cannot be the speaker
    evidence[0, ~steps_speech] = 0.0  # pauses: no evidence either way, the state carries over
    evidence[1:, ~steps_speech] = np.where(np.isnan(steps_act[:, ~steps_speech]), -8.0, 0.0)
    states = viterbi(evidence, settings.switch_penalty)

    bridge = max(1, round(1.0 / settings.step_s))
    segments = []
    for s0, s1, state in speech_runs(states, steps_speech, bridge):
        f0, f1 = s0 * step, min(n_frames, s1 * step)
        segments.append(_judge(state - 1, steps_act[:, s0:s1], act, speech, (f0, f1), settings))
    return segments


def _judge(
    chosen: int,
    seg_act: np.ndarray,
    act: np.ndarray,
    speech: np.ndarray,
    frames: tuple[int, int],
    settings: SpeakerSettings,
) -> SpeakerSegment:
    """Status and score of one segment whose Viterbi state is ``chosen`` (-1: nobody)."""
    on = settings.activity_on
    means = np.array([np.nanmean(r) if (~np.isnan(r)).any() else np.nan for r in seg_act])
    visible = [k for k in range(len(means)) if not np.isnan(means[k])]
    f0, f1 = frames
    if chosen < 0:
        top = max((means[k] for k in visible), default=0.0)
        return SpeakerSegment(f0, f1, "none", None, round(float(np.clip((on - top) / on, 0.0, 1.0)), 3))
    best = float(means[chosen])
    rivals = sorted(((float(means[k]), k) for k in visible if k != chosen), reverse=True)
    second, rival = rivals[0] if rivals else (0.0, None)
    margin = (best - max(second, on)) / max(best, 1e-9)
    strength = float(np.clip((best - on) / (2 * on), 0.0, 1.0))
    if rival is not None and second >= on:  # another mouth moves too: lip motion alone cannot tell
        c_best, c_rival = _contrast(act, speech, chosen), _contrast(act, speech, rival)
        if c_best is not None and c_rival is not None:
            if c_rival - c_best >= settings.contrast_min:
                chosen, rival = rival, chosen
            if abs(c_best - c_rival) >= settings.contrast_min:
                score = float(np.clip(abs(c_best - c_rival) / (4 * settings.contrast_min), 0.5, 0.8))
                return SpeakerSegment(f0, f1, "speaker", chosen, round(score, 3), rival)
        score = float(np.clip(margin, 0.0, 1.0)) * strength
        return SpeakerSegment(f0, f1, "uncertain", chosen, round(score, 3), rival)
    score = strength * float(np.clip(0.5 + margin, 0.0, 1.0))
    return SpeakerSegment(f0, f1, "speaker", chosen, round(score, 3))


def step_means(x: np.ndarray, step: int, n_steps: int) -> np.ndarray:
    """(rows, n_steps) NaN-aware mean of each row over each step (NaN where a step has no value)."""
    out = np.full((x.shape[0], n_steps), np.nan)
    for s in range(n_steps):
        part = x[:, s * step : (s + 1) * step]
        ok = ~np.isnan(part)
        has = ok.any(axis=1)
        out[has, s] = np.nansum(np.where(ok, part, 0.0)[has], axis=1) / ok[has].sum(axis=1)
    return out


def row_means(x: np.ndarray) -> np.ndarray:
    """(rows,) NaN-aware mean of each row (NaN where a row has no value)."""
    ok = ~np.isnan(x)
    return np.where(
        ok.any(axis=1), np.nansum(np.where(ok, x, 0.0), axis=1) / np.maximum(1, ok.sum(axis=1)), np.nan
    )


def refine_with_agreement(
    segments: list[SpeakerSegment],
    activity: np.ndarray,
    face_change: np.ndarray,
    agree: np.ndarray,
    fps: float,
    settings: SpeakerSettings,
    av: AvSettings,
) -> list[SpeakerSegment]:
    """The activity segments (`find_speakers`) judged again on audio-visual agreement.

    agree (n_tracks, n_steps): each track's agreement with the source's speech per ``step_s`` step
    (`tasks.perception.av_sync.agreement`).  Per segment, the talking faces are the chosen one and every
    other face whose mouth moves above ``activity_on`` over it (still pictures never):

    - one talking face: it stays the speaker unless its motion does not follow the speech at all
      (agreement below ``off``): then nobody on screen says the line ("none": a reaction shot, a
      listener mouthing along under an off-screen voice);
    - several: the one whose agreement is above ``on`` and leads every other talking face's by
      ``margin`` is the speaker (a moving listener, a face out of sync); none above ``off``: "none";
      otherwise "uncertain", most agreeing first (two speakers, or lips that cannot tell).
    "none" segments (no moving mouth) are kept.
    """
    if not segments or activity.ndim != 2 or activity.shape[0] == 0:
        return segments
    n_tracks, n_frames = activity.shape
    step = max(1, round(settings.step_s * fps))
    n_steps = agree.shape[1]
    still = still_tracks(face_change, settings)
    act = _smooth(activity.astype(np.float64), max(1, round(settings.smooth_s * fps)))
    steps_act = step_means(np.where(still[:, None], np.nan, act), step, n_steps)
    out = []
    for seg in segments:
        if seg.status == "none" or seg.speaker is None:
            out.append(seg)
            continue
        sl = slice(seg.start_frame // step, max(seg.start_frame // step + 1, -(-seg.end_frame // step)))
        a, moving = row_means(agree[:, sl]), row_means(steps_act[:, sl])
        talking = [
            k
            for k in range(n_tracks)
            if not still[k] and not np.isnan(a[k]) and moving[k] >= settings.activity_on
        ]
        if seg.speaker not in talking and not np.isnan(a[seg.speaker]):
            talking.append(seg.speaker)
        out.append(_judge_av(seg, sorted(((float(a[k]), k) for k in talking), reverse=True), av))
    return out


def _judge_av(seg: SpeakerSegment, ranked: list[tuple[float, int]], av: AvSettings) -> SpeakerSegment:
    """One segment judged on the agreement of its talking faces, ``ranked`` [(agreement, track)] best first."""
    if not ranked:  # the chosen face is not measured here (no agreement): the activity verdict stands
        return seg
    best, top = ranked[0]
    if best < av.off:  # moving mouths, none following the speech
        return dataclasses.replace(
            seg,
            status="none",
            speaker=None,
            runner_up=None,
            score=round(float(np.clip((av.off - best) / 0.3, 0, 1)), 3),
        )
    if len(ranked) == 1:
        return seg
    second, rival = ranked[1]
    strength = float(np.clip((best - av.on) / (2 * av.scale), 0.0, 1.0))
    lead = float(np.clip((best - second) / (2 * av.margin), 0.0, 1.0))
    score = round(0.5 * (strength + lead), 3)
    if best >= av.on and best - second >= av.margin:
        return dataclasses.replace(seg, status="speaker", speaker=top, runner_up=None, score=max(score, 0.5))
    return dataclasses.replace(seg, status="uncertain", speaker=top, runner_up=rival, score=score)


__all__ = [
    "AvSettings",
    "SpeakerSegment",
    "SpeakerSettings",
    "refine_with_agreement",
    "find_speakers",
    "row_means",
    "speech_runs",
    "step_means",
    "still_tracks",
    "viterbi",
]
