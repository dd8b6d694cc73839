"""Content decides: the fused rhythm verdict (`tasks.perception.asd_speaker.fuse_asd`) judged again on what each
face's mouth *says* (`tasks.perception.content`).

Rhythm (agreement, Light-ASD's lead) cannot tell which of two moving mouths says the words, and a lone face
alone has nothing to be ranked against; mouth shapes against the sound's content can.  Per segment of the
verdict (scored over at least ``min_s``, centred on it, so a short line is judged on its neighbourhood too)
each scored face gets its content fit (`tasks.perception.content.segment_scores`):

- two or more faces: the best face at ``on`` or above, leading every other by ``margin``, settles an
  uncertain segment (it is the speaker, confidently) and confirms a confident one; a confident speaker that
  another face out-says by ``margin`` is uncertain (both named): content and rhythm disagreeing is a review;
- a lone face at ``lone`` or above says the speech: confident (the simplest shot of any film);
- otherwise the verdict stands (content cannot separate them: that is what "uncertain" is for), an
  uncertain segment naming the best-fitting face when content has one.

"none" segments are left alone (no face on screen says the line).  Pure numpy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tasks.perception.content import segment_scores
from tasks.perception.speaker import SpeakerSegment


@dataclass(frozen=True)
class ContentSettings:
    """Thresholds of the content route (the `speaker:` section's content_* keys)."""

    on: float  # a face's mean shape correlation at least this: its lips say the speech (with two or more faces)
    margin: float  # ... leading every other scored face by this
    lone: float  # a lone face's fit at least this: it speaks, confidently
    min_s: float  # segments are scored over at least this much of the shot, centred on them


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

    def scores(self, f0: int, f1: int, least: int) -> np.ndarray:
        """(n_tracks,) content fit over [f0, f1) widened to ``least`` frames (NaN: not scored there)."""
        n = self.pred.shape[0]
        if f1 - f0 < least:
            mid = (f0 + f1) // 2
            f0, f1 = max(0, mid - least // 2), min(n, mid - least // 2 + least)
            f0 = max(0, min(f0, f1 - least))
        got = segment_scores(self.pred, self.shapes, self.speech, f0, f1)
        got[self.still] = np.nan
        return got


def judge_content(
    segments: list[SpeakerSegment], ev: ContentEvidence, cs: ContentSettings
) -> list[SpeakerSegment]:
    """The verdict's segments judged again on content (module docstring)."""
    least = round(cs.min_s * ev.fps)
    out = []
    for seg in segments:
        if seg.status == "none":
            out.append(seg)
            continue
        c = ev.scores(seg.start_frame, seg.end_frame, least)
        ranked = sorted(((float(c[k]), k) for k in range(len(c)) if np.isfinite(c[k])), reverse=True)
        if not ranked:
            out.append(seg)
            continue
        best, who = ranked[0]
        strength = float(np.clip(best, 0.0, 1.0))
        if len(ranked) == 1:
            if best >= cs.lone and seg.speaker in (None, who):
                seg = dataclasses.replace(seg, status="speaker", speaker=who, runner_up=None,
                                          score=round(max(seg.score, 0.5 + 0.5 * strength), 3))  # fmt: skip
            out.append(seg)
            continue
        second, rival = ranked[1]
        decisive = best >= cs.on and best - second >= cs.margin
        if decisive and (seg.status != "speaker" or seg.speaker == who):
            seg = dataclasses.replace(seg, status="speaker", speaker=who, runner_up=None,
                                      score=round(max(seg.score, 0.5 + 0.5 * strength), 3))  # fmt: skip
        elif seg.status == "speaker" and seg.speaker != who and best - _fit(c, seg.speaker) >= cs.margin:
            seg = dataclasses.replace(seg, status="uncertain", runner_up=seg.speaker, speaker=who,
                                      score=round(0.5 * seg.score, 3))  # fmt: skip
        elif seg.status == "uncertain" and best - second >= cs.margin / 2 and seg.speaker != who:
            seg = dataclasses.replace(seg, speaker=who, runner_up=seg.speaker)
        out.append(seg)
    return _merge(out)


def _fit(c: np.ndarray, k: int | None) -> float:
    return float(c[k]) if k is not None and k < len(c) and np.isfinite(c[k]) else -np.inf


def _merge(segs: list[SpeakerSegment]) -> list[SpeakerSegment]:
    """Adjacent segments with one verdict joined (their score the frame-weighted mean)."""
    out: list[SpeakerSegment] = []
    for s in segs:
        p = out[-1] if out else None
        if p is not None and p.end_frame == s.start_frame and (p.status, p.speaker, p.runner_up) == (
            s.status, s.speaker, s.runner_up,
        ):  # fmt: skip
            a, b = p.end_frame - p.start_frame, s.end_frame - s.start_frame
            out[-1] = dataclasses.replace(p, end_frame=s.end_frame,
                                          score=round((p.score * a + s.score * b) / max(1, a + b), 3))  # fmt: skip
        else:
            out.append(s)
    return out


__all__ = ["ContentEvidence", "ContentSettings", "judge_content"]
