"""One face, one voice: a face named the confident speaker of two lines spoken in two different voices is not
sure of either (the missed change of speaker).

Both speaker routes (agreement, Light-ASD) judge how well lips fit the rhythm of the speech.  When a turn
follows another without a pause and the first speaker goes on moving their lips, both can give the answer to
the first face: the held-out turn-taking cases `held_out_14`, `held_out_20` and `held_out_21` (benchmarks/RESULTS.md).  What
they cannot hear is that the voice changed.  A speaker-identity embedding (`model.speaker.voice_id`, GE2E) can: each
confident segment of at least ``least`` frames is embedded, and where two segments of one face are further
apart than ``min_cos`` (cosine), both become "uncertain"; so does one segment whose speech before some point
and after it differ so (a turn change with no pause inside one line: `WINDOW_S` either side, at least
`SIDE_S` of it, every `STEP_S`).  Pure logic over segments; the embedding is passed in (``voices_of``), so
this module needs no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from tasks.perception.speaker import SpeakerSegment

# Splits inside one segment: GE2E over 2 s of speech gave one voice 0.69-0.9 and two voices 0.5 (median) on the
# 23 seeds' own recordings; at 1.2 s one voice fell to 0.45 (benchmarks/RESULTS.md), so each side is 2 s, at least 1.5 s
# (the encoder's own 75 % coverage of its last partial), tried every 0.4 s.
WINDOW_S = 2.0
SIDE_S = 1.5
STEP_S = 0.4


Span = tuple[int, int]  # (start frame, end frame) of the shot's audio
VoicesOf = Callable[[Sequence[Span]], np.ndarray]  # spans -> (len(spans), D) unit-length voice embeddings


def _splits(seg: SpeakerSegment, fps: float) -> list[tuple[Span, Span]]:
    """(before, after) spans of each point inside ``seg`` where its voice may change."""
    side, window, step = round(SIDE_S * fps), round(WINDOW_S * fps), max(1, round(STEP_S * fps))
    return [
        ((max(seg.start_frame, t - window), t), (t, min(seg.end_frame, t + window)))
        for t in range(seg.start_frame + side, seg.end_frame - side + 1, step)
    ]


def doubt_two_voices(
    segments: list[SpeakerSegment],
    voices_of: VoicesOf,
    min_cos: float,
    least: int,
    fps: float,
) -> list[SpeakerSegment]:
    """``segments`` with the confident ones of a face whose lines differ in voice made "uncertain", and those
    in which the voice changes.

    voices_of(spans) -> (len(spans), D): the unit-length voice embedding of the source's audio over each span
    of frames, all in one call (one batch through the network; a split's "after" is often a later split's
    "before"); segments shorter than ``least`` frames are not compared (too short to tell a voice).
    """
    sure = [
        s
        for s in segments
        if s.status == "speaker" and s.speaker is not None and s.end_frame - s.start_frame >= least
    ]
    splits = {id(s): _splits(s, fps) for s in sure}
    # the lines of faces with two lines or more, compared pairwise
    paired = [s for s in sure if sum(o.speaker == s.speaker for o in sure) > 1]
    wanted = {span for pairs in splits.values() for pair in pairs for span in pair}
    wanted |= {(s.start_frame, s.end_frame) for s in paired}
    if not wanted:
        return segments
    spans = sorted(wanted)
    voice = dict(zip(spans, voices_of(spans), strict=True))
    doubt = {id(s) for s in sure if any(float(voice[a] @ voice[b]) < min_cos for a, b in splits[id(s)])}
    for i, a in enumerate(paired):
        for b in paired[i + 1 :]:
            if a.speaker == b.speaker:
                va, vb = voice[(a.start_frame, a.end_frame)], voice[(b.start_frame, b.end_frame)]
                if float(va @ vb) < min_cos:
                    doubt.update((id(a), id(b)))
    return [
        dataclasses.replace(s, status="uncertain", score=round(0.5 * s.score, 3)) if id(s) in doubt else s
        for s in segments
    ]


__all__ = ["SIDE_S", "STEP_S", "WINDOW_S", "Span", "VoicesOf", "doubt_two_voices"]
