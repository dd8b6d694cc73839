"""Where a change of voice is placed: real recorded voices (the committed talking heads) joined at a known
frame, through the content stage's scan (`turn_bounds`) and its placing (`place_change`), GE2E as shipped."""

from __future__ import annotations

import itertools

import numpy as np

from tasks.config.pipeline import load_config
from tasks.perception.content_fusion import ContentEvidence, place_change, turn_bounds
from tasks.perception.face_analysis import _voices_of
from tasks.perception.vad import at_frames, speech_probs
from tasks.perception.verdict import content_settings
from tests.speaker_cases import FPS, SR, seed_audio

CFG = load_config()
CUT, N = 62, 120  # the second voice from frame 62 of 120 (4.8 s), as in the composed turn-taking cases


def _joined(a: int, b: int) -> tuple[ContentEvidence, np.ndarray]:
    """Seed ``a``'s own voice for CUT frames, then seed ``b``'s from its start: the evidence the placing reads
    (the speech mask; no faces needed) and the sound."""
    cut = round(CUT / FPS * SR)
    audio = np.concatenate([seed_audio(a)[:cut], seed_audio(b)[: round(N / FPS * SR) - cut]])
    audio = audio.astype(np.float32)
    speech = at_frames(speech_probs(audio), N, FPS) >= 0.5
    ev = ContentEvidence(np.zeros((N, 1)), np.zeros((2, N, 1)), speech, float(FPS), np.zeros(2, bool))
    return ev, audio


def _off_by(ev: ContentEvidence, f: int) -> int:
    """Frames between ``f`` and the true change: the join, or the pause around it (either voice's silence)."""
    lo = hi = CUT
    while lo > 0 and not ev.speech[lo - 1]:
        lo -= 1
    while hi < N - 1 and (not ev.speech[hi] or (hi < CUT + 2 and not ev.speech[hi + 1])):
        hi += 1
    return max(0, lo - f, f - hi)


def test_changes_of_voice_are_placed_near_the_truth():
    """Every ordered pair of five committed heads (one's line, then the other's from its start): the scan
    (2 s either side) finds the change; placing it on short stretches against both turns' voices puts it within
    0.2 s (5 frames, the issue's target for a switch) of the true change in at least three pairs of four (16 of
    the 19 found when written), where the scan alone managed 8 of 19."""
    cs = content_settings(CFG.speaker)
    scan, placed = [], []
    for a, b in itertools.permutations(range(1, 6), 2):
        ev, audio = _joined(a, b)
        voices = _voices_of(audio, float(FPS))
        spoken = np.flatnonzero(ev.speech)
        lo, hi = int(spoken[0]), int(spoken[-1]) + 1
        found = turn_bounds(ev, lo, hi, cs, voices)
        if len(found) != 1:
            continue
        scan.append(_off_by(ev, found[0]))
        placed.append(_off_by(ev, place_change(ev, found[0], lo, hi, round(0.6 * FPS), voices)))
    assert len(placed) >= 18, (scan, placed)  # the scan finds the change (19 of 20 when written)
    near = np.mean(np.array(placed) <= 5)
    assert near >= 0.75 and near > np.mean(np.array(scan) <= 5), (scan, placed)
    assert np.median(placed) < np.median(scan), (scan, placed)
