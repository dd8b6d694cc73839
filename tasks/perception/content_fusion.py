"""Content decides: the fused rhythm verdict (`tasks.perception.asd_speaker.fuse_asd`) judged again on what each
face's mouth *says* (`tasks.perception.content`), with the voices of the shot's sound to tell turns apart.

Rhythm (agreement, Light-ASD's lead) cannot tell which of two moving mouths says the words, and a lone face has
nothing to be ranked against; mouth shapes against the sound's content can (docs/speaker.md has the settings):

- two or more scored faces: the speech is cut where the voice changes (`turn_bounds`, then `place_change`), the
  speech next to a change left uncertain, each side of it marked as such (`SpeakerSegment.change`: the gate dubs
  it on its side's turn's face under `speaker.uncertain: most_likely`); each turn (one voice) is judged once on
  its whole length (`_turn_face`): its clear best fit, if rhythm's likeliest face too or leading by
  ``overrule``, speaks every segment of it, confidently (a segment rhythm was sure of for another face:
  uncertain); across a change both turns must be said, by two faces.  Undecided turns fall back to the segment rule (each segment scored over ``min_s`` within its turn);
- a lone face fitting ``lone`` or more says the speech, confidently; fitting ``lone_off`` or less where rhythm
  is unsure, nobody on screen says it (a reaction shot);
- otherwise the verdict stands (that is what "uncertain" is for), an uncertain segment naming the
  best-fitting face when content has one.

Pure numpy; the voice embeddings are passed in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tasks.perception.content import segment_scores
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.voices import WINDOW_S, VoicesOf


@dataclass(frozen=True)
class ContentSettings:
    """Thresholds of the content route (the `speaker:` section's content_* keys)."""

    on: float  # a face's mean shape correlation at least this: its lips say the speech (with two or more faces)
    margin: float  # ... leading every other scored face by this
    lone: float  # a lone face's fit at least this: it speaks, confidently
    min_s: float  # segments are scored over at least this much of their turn, centred on them
    lone_off: float  # a lone face's fit at most this while speech is heard: nobody on screen says it
    overrule: float  # two faces: content settles a segment on another face than rhythm's likeliest only by this lead
    voice_split: float  # two faces: a change of speaker where the voices either side are below this cosine
    turn_min_s: float  # ... and leave each turn at least this long
    turn_guard_s: (
        float  # ... the speech this close to such a change is uncertain (its place is known to ~0.4 s)
    )
    lone_none: bool  # a lone face fitting at least ``lone`` also says what rhythm gave nobody
    per_turn: bool  # two faces: each turn (one voice) decided once, on its whole length, before its segments


@dataclass(frozen=True)
class ContentEvidence:
    """What the content rule reads: predicted shapes (T, F) from the shot's audio, each face's observed
    shapes (n_tracks, T, F; z-scored per track, NaN where absent or not scored), the speech mask (T,)."""

    pred: np.ndarray
    shapes: np.ndarray
    speech: np.ndarray
    fps: float
    still: (
        np.ndarray
    )  # (n_tracks,) bool: not judged (still pictures, faces too small for their mouth's shape)

    def scores(self, f0: int, f1: int, least: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """(n_tracks,) content fit over [f0, f1) widened to ``least`` frames within [lo, hi) (NaN: not
        scored there)."""
        hi = self.pred.shape[0] if hi is None else hi
        if f1 - f0 < least:
            mid = (f0 + f1) // 2
            f0, f1 = max(lo, mid - least // 2), min(hi, mid - least // 2 + least)
            f0 = max(lo, min(f0, f1 - least))
        got = segment_scores(self.pred, self.shapes, self.speech, f0, f1)
        got[self.still] = np.nan
        return got

    def spoken(self, f0: int, f1: int) -> int:
        return int(np.count_nonzero(self.speech[f0:f1]))


# frames between the candidate changes of voice (GE2E on both sides of each): 4 found the same turns as 2 on the
# 210 replayed cases and the unseen sets at half the voice encoder's cost (benchmarks/RESULTS.md)
SCAN_STEP = 4


def turn_bounds(
    ev: ContentEvidence, a: int, b: int, cs: ContentSettings, voices: VoicesOf | None
) -> list[int]:
    """Frames inside [a, b) where the voice changes: the point with the lowest cosine between the voices of
    `voices.WINDOW_S` of sound either side (every `SCAN_STEP` frames, each side at least ``turn_min_s``), if below
    ``voice_split``; each side is searched again.  Content then judges each side on its own, so a line is never
    scored across a change of speaker (content alone moved its best split by up to 0.7 s on the replay, and
    found changes inside one voice's line)."""
    m = max(8, round(cs.turn_min_s * ev.fps))
    if voices is None or b - a < 2 * m or ev.spoken(a, b) < 2 * m:
        return []
    win = round(WINDOW_S * ev.fps)
    cands = list(range(a + m, b - m + 1, SCAN_STEP))
    spans = [(max(a, s - win), s) for s in cands] + [(s, min(b, s + win)) for s in cands]
    emb = voices(spans)  # (2 * len(cands), D) unit vectors, one batch
    cos = np.einsum("nd,nd->n", emb[: len(cands)], emb[len(cands) :])
    i = int(np.argmin(cos))
    if cos[i] >= cs.voice_split:
        return []
    s = cands[i]
    return [*turn_bounds(ev, a, s, cs, voices), s, *turn_bounds(ev, s, b, cs, voices)]


# placing a change the scan found: candidates every PLACE_STEP frames within the guard band, PLACE_W_S of sound
# either side of each against the two turns' own voices (0.48 s: on the 28 turn-taking cases of the 210 with a
# change found, 23 placed within 5 frames of the truth against 6 for the scan's 2-s windows; benchmarks/RESULTS.md)
# ... within PLACE_REACH_S of the scan's change (0.4 s off at the median on the 210, 0.72 s at most)
PLACE_STEP = 2
PLACE_W_S = 0.48
PLACE_REACH_S = 0.6


def place_change(ev: ContentEvidence, b: int, lo: int, hi: int, reach: int, voices: VoicesOf) -> int:
    """The change of voice `turn_bounds` found at ``b`` (between the turns [lo, b) and [b, hi)) placed where the
    sound before a point sounds most like the first turn's voice and the sound after it most like the second's:
    each turn's voice from its speech further than ``reach`` from ``b``, the candidates within ``reach`` of it with
    speech on at least half of `PLACE_W_S` either side.  The scan compares 2 s either side, which blurs the
    place by up to 0.7 s; this compares short stretches with two known voices.  ``b`` when nothing can be
    compared."""
    w = round(PLACE_W_S * ev.fps)
    one, two = (lo, b - reach), (b + reach, hi)
    if one[1] - one[0] < w or two[1] - two[0] < w:
        return b
    cands = [
        t
        for t in range(max(lo + w, b - reach), min(hi - w, b + reach) + 1, PLACE_STEP)
        if 2 * ev.spoken(t - w, t) >= w and 2 * ev.spoken(t, t + w) >= w
    ]
    if not cands:
        return b
    emb = voices([one, two] + [(t - w, t) for t in cands] + [(t, t + w) for t in cands])  # unit vectors
    first, second = emb[0], emb[1]
    before, after = emb[2 : 2 + len(cands)], emb[2 + len(cands) :]
    fit = before @ first - before @ second + after @ second - after @ first  # (len(cands),)
    return cands[int(np.argmax(fit))]


def _leader(c: np.ndarray) -> tuple[int | None, float]:
    """The best-fitting scored face and its lead over the next (inf when it is alone)."""
    ranked = sorted(((float(c[k]), k) for k in range(len(c)) if np.isfinite(c[k])), reverse=True)
    if not ranked:
        return None, 0.0
    return ranked[0][1], (ranked[0][0] - ranked[1][0] if len(ranked) > 1 else np.inf)


def _split(segments: list[SpeakerSegment], bounds: list[int]) -> list[SpeakerSegment]:
    """The segments cut at ``bounds`` (frames)."""
    out = []
    for seg in segments:
        cuts = [f for f in bounds if seg.start_frame < f < seg.end_frame]
        edges = [seg.start_frame, *cuts, seg.end_frame]
        out += [
            dataclasses.replace(seg, start_frame=p, end_frame=q)
            for p, q in zip(edges, edges[1:], strict=False)
        ]
    return out


def judge_content(
    segments: list[SpeakerSegment],
    ev: ContentEvidence,
    cs: ContentSettings,
    voices: VoicesOf | None = None,
) -> list[SpeakerSegment]:
    """The verdict's segments judged again on content (module docstring); ``voices`` (the shot's sound's voice
    embeddings over spans of frames) lets it cut them where the voice changes (`turn_bounds`)."""
    least = round(cs.min_s * ev.fps)
    n = ev.pred.shape[0]
    spoken = [s for s in segments if s.status != "none"]
    bounds = []
    guard = round(cs.turn_guard_s * ev.fps)
    if spoken and ev.shapes.shape[0] > 1 and voices is not None:
        a, b = spoken[0].start_frame, spoken[-1].end_frame
        found = turn_bounds(ev, a, b, cs, voices)
        ends = [a, *found, b]
        reach = round(PLACE_REACH_S * ev.fps)
        bounds = sorted(place_change(ev, f, ends[i], ends[i + 2], reach, voices) for i, f in enumerate(found))
    edges = [0, *bounds, n]
    cuts = sorted({f for b in bounds for f in (b - guard, b, b + guard)})
    lone = ev.shapes.shape[0] == 1
    pieces = _split(segments, cuts)
    near = {id(p) for p in pieces if any(abs((p.start_frame + p.end_frame) / 2 - b) < guard for b in bounds)}
    turn_of = {id(p): int(np.searchsorted(edges, p.start_frame, side="right")) - 1 for p in pieces}
    decided = {}  # turn -> (face, fit): one voice, one speaker, said clearly over the whole turn
    if cs.per_turn and not lone:
        for i in range(len(edges) - 1):
            mine = [p for p in pieces if turn_of[id(p)] == i and p.status != "none" and id(p) not in near]
            if sum(p.end_frame - p.start_frame for p in mine) >= round(cs.turn_min_s * ev.fps):
                decided[i] = _turn_face(mine, ev, cs)
        # a change of voice is a change of speaker: the turns either side must both be said, by two faces
        doubt = [i for i in range(len(bounds)) if decided.get(i) is None or decided.get(i + 1) is None
                 or decided[i][0] == decided[i + 1][0]]  # fmt: skip
        for i in doubt:
            decided[i] = decided[i + 1] = None
    out = []
    for seg in pieces:
        if seg.status == "none" and not (cs.lone_none and lone):
            out.append(seg)
            continue
        if id(seg) in near:
            # next to a change of voice, where it is not known to the frame: for review; its side of the
            # change kept (`change`), so the likeliest-face policy dubs it on that side's turn's face
            at = min(bounds, key=lambda b: abs((seg.start_frame + seg.end_frame) / 2 - b))
            out.append(
                dataclasses.replace(seg, status="uncertain", score=round(0.5 * seg.score, 3), change=at)
            )
            continue
        i = turn_of[id(seg)]
        if decided.get(i) is not None:
            who, fit = decided[i]
            if seg.status == "speaker" and seg.speaker != who:  # rhythm sure of another face: for review
                seg = dataclasses.replace(seg, status="uncertain", runner_up=seg.speaker, speaker=who,
                                          score=round(0.5 * seg.score, 3))  # fmt: skip
            else:
                seg = dataclasses.replace(seg, status="speaker", speaker=who, runner_up=None,
                                          score=round(max(seg.score, 0.5 + 0.5 * fit), 3))  # fmt: skip
            out.append(seg)
            continue
        c = ev.scores(seg.start_frame, seg.end_frame, least, edges[i], edges[i + 1])
        ranked = sorted(((float(c[k]), k) for k in range(len(c)) if np.isfinite(c[k])), reverse=True)
        if not ranked:
            out.append(seg)
            continue
        best, who = ranked[0]
        strength = float(np.clip(best, 0.0, 1.0))
        if len(ranked) == 1:
            if best >= cs.lone and seg.speaker in (None, who):  # also rhythm's "nobody" (lone_none)
                seg = dataclasses.replace(seg, status="speaker", speaker=who, runner_up=None,
                                          score=round(max(seg.score, 0.5 + 0.5 * strength), 3))  # fmt: skip
            elif seg.status == "none":
                pass
            elif lone and best <= cs.lone_off and seg.status == "uncertain":  # the only face does not say it
                seg = dataclasses.replace(seg, status="none", speaker=None, runner_up=None,
                                          score=round(0.5 + 0.5 * float(np.clip(cs.lone_off - best, 0, 1)), 3))  # fmt: skip
            out.append(seg)
            continue
        second, rival = ranked[1]
        decisive = best >= cs.on and best - second >= cs.margin
        agrees = (
            seg.speaker in (None, who) or best - second >= cs.overrule
        )  # rhythm's likeliest face, or clear
        if decisive and agrees and (seg.status != "speaker" or seg.speaker == who):
            seg = dataclasses.replace(seg, status="speaker", speaker=who, runner_up=None,
                                      score=round(max(seg.score, 0.5 + 0.5 * strength), 3))  # fmt: skip
        elif seg.status == "speaker" and seg.speaker != who and best - _fit(c, seg.speaker) >= cs.margin:
            seg = dataclasses.replace(seg, status="uncertain", runner_up=seg.speaker, speaker=who,
                                      score=round(0.5 * seg.score, 3))  # fmt: skip
        elif seg.status == "uncertain" and best - second >= cs.margin / 2 and seg.speaker != who:
            seg = dataclasses.replace(seg, speaker=who, runner_up=seg.speaker)
        out.append(seg)
    return _merge(out)


def _turn_face(
    mine: list[SpeakerSegment], ev: ContentEvidence, cs: ContentSettings
) -> tuple[int, float] | None:
    """The face that says one turn's segments (``mine``, one voice): the best content fit over the whole turn,
    at least ``on``, leading every other face by ``margin``, and rhythm's likeliest face over the turn (or
    leading by ``overrule``); None when content cannot tell."""
    c = ev.scores(mine[0].start_frame, mine[-1].end_frame, 0)
    k, lead = _leader(c)
    if k is None or not np.isfinite(lead) or c[k] < cs.on or lead < cs.margin:
        return None
    votes: dict[int, int] = {}
    for p in mine:
        if p.speaker is not None:
            votes[p.speaker] = votes.get(p.speaker, 0) + p.end_frame - p.start_frame
    rhythm = max(votes, key=votes.__getitem__) if votes else None
    if rhythm not in (None, k) and lead < cs.overrule:
        return None
    return k, float(np.clip(c[k], 0.0, 1.0))


def _fit(c: np.ndarray, k: int | None) -> float:
    return float(c[k]) if k is not None and k < len(c) and np.isfinite(c[k]) else -np.inf


def _merge(segs: list[SpeakerSegment]) -> list[SpeakerSegment]:
    """Adjacent segments with one verdict joined (their score the frame-weighted mean)."""
    out: list[SpeakerSegment] = []
    for s in segs:
        p = out[-1] if out else None
        same = p is not None and (p.status, p.speaker, p.runner_up, p.change) == (
            s.status, s.speaker, s.runner_up, s.change,
        )  # fmt: skip
        if p is not None and same and p.end_frame == s.start_frame != s.change:  # never across a change
            a, b = p.end_frame - p.start_frame, s.end_frame - s.start_frame
            out[-1] = dataclasses.replace(p, end_frame=s.end_frame,
                                          score=round((p.score * a + s.score * b) / max(1, a + b), 3))  # fmt: skip
        else:
            out.append(s)
    return out


__all__ = ["ContentEvidence", "ContentSettings", "judge_content"]
