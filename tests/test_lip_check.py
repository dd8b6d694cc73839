"""The output check (tasks/perception/lip_check.py): do a rendered shot's new lips say the dub's words?
Real faces saying the dub's words pass, real faces saying other words and TINY RANDOM WEIGHTS' output are
flagged, and the flag reaches the shot's QC record (the QC sheet's banner and the shot table read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.report import lips_column
from tasks.perception.lip_check import lip_check
from tasks.render.shot import render_shot_result
from tests.speaker_cases import SR, seed_audio, seed_frames
from tests.test_content_speaker import map_without
from tests.test_infinitetalk import SHOTS, _job, resident, ws_root  # noqa: F401 (fixtures)

FACE = (40, 40, 216, 216)  # the seeds' face, roughly (256x256 frames)


def _check(face: int, voice: int):
    frames, audio = seed_frames(face), seed_audio(voice)
    n = min(len(frames), len(audio) * 25 // SR)
    return lip_check(iter(frames[:n]), n, 25.0, audio, FACE, 0.1, map_without(face, voice))


@pytest.mark.slow
@pytest.mark.parametrize("face", [6, 8])
def test_real_face_saying_the_dub_passes_and_other_words_are_flagged(face: int) -> None:
    """A real face whose lips say the dub track's words passes (map fitted without the heads judged); the same
    face under another person's words (lips moving, other words: a dub that did not take) is flagged."""
    own = _check(face, face)
    assert not own.flagged and own.fit is not None and own.fit >= 0.1, own
    other = _check(face, face + 1)
    assert other.flagged and other.fit is not None and other.fit < own.fit, other


@pytest.mark.slow
def test_tiny_random_weights_are_flagged(tmp_path: Path, ws_root: Path, resident) -> None:  # noqa: F811
    """Shot 0 of the sample film dubbed by TINY RANDOM WEIGHTS: its QC record carries the output check, which
    flags it (the crop is noise: no mouth says the dub's words), and the shot table shows REVIEW."""
    result = render_shot_result(_job(tmp_path, ws_root, 0, SHOTS[0], []))
    assert result["dubbed"] and result["tiny"]
    qc = result["qc"]
    assert qc["lip_flag"] is True, qc
    assert lips_column(qc)["lips"].endswith("REVIEW")
