"""The run report's words and timecodes (`tasks.timeline.run_report`): SMPTE at the film's rate from its start
timecode, drop-frame at 29.97, rates SMPTE has no timecode for; where a face is, the scores in words."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tasks.timeline.run_report import position_words, score_words, smpte, speech_words


@pytest.mark.parametrize(
    ("frame", "fps", "start", "want"),
    [
        (60, "24000/1001", None, "00:00:02:12"),  # 24 frames a timecode second
        (48, "24", "01:00:00:00", "01:00:02:00"),
        (1800, "30000/1001", None, "00:01:00;02"),  # drop-frame: frames 00 and 01 of minute 1 are skipped
        (100, "2875/100", None, "00:00:03:13"),  # a VFR film's average rate: non-drop at 29 a second
        (10, "2875/100", "01:00:00:00", "01:00:00:10"),
    ],
)
def test_smpte_at_the_films_rate_from_its_start_timecode(frame, fps, start, want):
    assert smpte(frame, Fraction(fps), start) == want


def test_a_face_is_described_by_its_place_and_its_score_in_words():
    assert position_words([10, 10, 60, 100], (180, 320)) == "left, upper third, close-up"
    assert position_words([250, 120, 270, 140], (180, 320)) == "right, lower third, wide (small face)"
    assert score_words(0.97, "speaker").endswith("(confidence high, 0.97 of 1)")
    assert score_words(0.25, "uncertain").startswith(
        "uncertain: the likeliest face"
    ) and "low" in score_words(0.25, "uncertain")
    assert score_words(0.0, "forced").startswith("forced") and "confidence" not in score_words(0.0, "forced")
    silent = speech_words({"speech_ratio": 0.83}, False)
    assert "83%" in silent and "the film has no speech here" in silent and "dub track" in silent
