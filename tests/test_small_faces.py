"""A speaker small in a 1080p wide shot (issue 24's small face) is found, scored and dubbed at the default
analysis size (`speaker.detect_max_side`), on the real talking heads through the shot decision and gate."""

from __future__ import annotations

from tasks.config.pipeline import load_config
from tests.av_cases import SETS, judged_decision, small_face


def test_a_speaker_60_px_tall_in_a_1080p_wide_shot_is_found_and_dubbed(tmp_path):
    m = SETS["tune"]
    # the speaker beside a listener mouthing backwards, both 60 px tall
    case = small_face("tune", m.a, m.b, 60, m.b_phase)
    faces, verdict = judged_decision(case, load_config(), tmp_path / "wide.mp4")
    # at 640 px analysis frames (20 px faces) the speaker was not found
    assert {case.who(t.boxes[0]) for t in faces.tracks} >= {0, 1}, faces.tracks
    assert verdict.result == "right", (verdict.why, faces.segments)
