"""The content stage's decision rules on real composed cases through the product path (encode, `decide_shot`, the
gate's turns), truth by construction (tests/av_cases.py), each judged by a content map fitted without the case's
own seeds (the shipped prior has seen every committed head): tasks/perception/content_fusion.py.

The replay of the 210 cases (benchmarks/RESULTS.md, 2026-12-06, "the content stage decides") says which rule each
case needs: rhythm alone and the per-segment content rule leave all three of these uncertain.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.config.pipeline import load_config
from tasks.decision.gate import speaker_turns
from tasks.perception import face_analysis
from tests.av_cases import SETS, av_case, judged_decision
from tests.test_content_speaker import map_without


def _without_seeds(monkeypatch: pytest.MonkeyPatch, split: str) -> None:
    m = SETS[split]
    held = map_without(m.a, m.b, m.c)
    monkeypatch.setattr(face_analysis, "load_prior", lambda: held)


@pytest.mark.slow
def test_reaction_shot_is_nobody(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone face mouthing (seed 7, its talking played backwards) under an off-screen voice (seed 8): its lips
    do not say the words heard, so nobody on screen speaks, confidently (`content_lone_off`)."""
    _without_seeds(monkeypatch, "held_out_7")
    _, verdict = judged_decision(av_case("held_out_7/reaction"), load_config(), tmp_path / "r.mp4")
    assert verdict.result == "right", verdict.why


@pytest.mark.slow
def test_one_voice_one_speaker_over_the_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three faces, the middle one saying the line, both others moving their lips: one voice throughout, so the
    turn is judged once on its whole length (`content_per_turn`), and the middle face is the speaker, confidently
    (segment by segment, content leaves parts of it uncertain)."""
    _without_seeds(monkeypatch, "held_out_7")
    _, verdict = judged_decision(av_case("held_out_7/three_faces"), load_config(), tmp_path / "t.mp4")
    assert verdict.result == "right", verdict.why


@pytest.mark.slow
def test_change_of_voice_splits_the_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn-taking (seed 1 talks while seed 3 mouths, then seed 3 answers in its own voice at frame 62): the voice
    change is found near frame 62, the speech next to it is left for review, and each turn away from it is given
    to its own face, confidently; no frame is confidently given to the wrong face."""
    _without_seeds(monkeypatch, "held_out_4")
    case = av_case("held_out_4/turn_taking")
    cfg = load_config()
    faces, verdict = judged_decision(case, cfg, tmp_path / "tt.mp4")
    assert verdict.result != "wrong", verdict.why
    sure = np.full(case.frames.shape[0], -1)
    for t in speaker_turns(faces, cfg.speaker.uncertain, cfg.speaker.min_score):
        if t.status != "uncertain" and t.track is not None:
            sure[t.start : t.end] = case.who(faces.track(t.track).boxes[0])
    (a0, a1, first), (b0, b1, second) = case.truth
    assert np.mean(sure[a0:a1] == first) >= 0.6 and np.mean(sure[b0:b1] == second) >= 0.6, sure.tolist()
    # the band left uncertain sits around the true change (within the 0.6-s guard and its error)
    unsure = np.flatnonzero(sure[a1 - 25 : a1 + 25] == -1) + a1 - 25
    assert len(unsure) and abs(float(np.median(unsure)) - a1) <= 15, unsure.tolist()
