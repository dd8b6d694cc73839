"""Where the learned route alone must not be sure (tasks/perception/asd_speaker.fuse_asd): the three held-out
dialogue cases it got confidently wrong, through the real shot decision and gate on the real talking heads,
and the two rules behind them on hand-made segments."""

from __future__ import annotations

import pytest

from tasks.config import load_config
from tasks.perception.asd_speaker import doubt_unconfirmed_switches
from tasks.perception.speaker import SpeakerSegment
from tests.av_cases import av_cases, judged_decision


@pytest.mark.parametrize(
    "name",
    [
        "held_out_5/turn_taking",  # the answer's face given 1.5 s of the first speaker's line
        "held_out_7/moving_listener",  # a listener mouthing backwards given 1.8 s of a weakly synced speaker
        "held_out_8/out_of_sync",  # the speaker's first 1.2 s called "nobody on screen"
    ],
)
def test_the_cases_the_fusion_got_confidently_wrong_are_not_any_more(tmp_path, name):
    case = av_cases((name.split("/")[0],))[name]
    faces, verdict = judged_decision(case, load_config(), tmp_path / "c.mp4")
    assert verdict.result != "wrong", (verdict.why, faces.segments)


def _seg(a: int, b: int, status: str, who: int | None) -> SpeakerSegment:
    return SpeakerSegment(a, b, status, who, 0.9)


def test_a_change_of_speaker_only_the_network_saw_is_uncertain():
    fused = [_seg(0, 40, "speaker", 0), _seg(50, 100, "speaker", 1)]
    # agreement named face 0 itself: it stays; face 1, 10 frames after it, only the network named
    out = doubt_unconfirmed_switches(fused, [_seg(0, 40, "speaker", 0), _seg(50, 100, "uncertain", 1)], 40)
    assert [(s.status, s.speaker) for s in out] == [("speaker", 0), ("uncertain", 1)]
    both = doubt_unconfirmed_switches(fused, [], 40)
    assert [s.status for s in both] == ["uncertain", "uncertain"]
    assert doubt_unconfirmed_switches(fused, [], 10) == fused  # the turns further apart than the reach
    same = [_seg(0, 40, "speaker", 0), _seg(50, 100, "speaker", 0)]
    assert doubt_unconfirmed_switches(same, [], 40) == same  # no change of speaker
