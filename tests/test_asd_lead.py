"""The learned route's sync lead and its face cap (tasks/perception/asd.sync_lead, face_analysis.scored_tracks),
on the real talking heads of tests/data/talking with the real network: a face saying the audio leads, the same
face saying other words under it does not; a crowd is scored only up to `speaker.asd_max_faces`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from model.speaker.light_asd import load_light_asd
from tasks.config.pipeline import load_config
from tasks.decision.shot_decision import decide_shot
from tasks.media.probe import probe
from tasks.perception.asd import FaceCrops, asd_scores
from tasks.perception.face_analysis import analyse_frames, scored_tracks, speaker_settings
from tasks.perception.faces import FaceDetector
from tests.av_cases import av_case, backwards, canvas, talking
from tests.speaker_cases import SR, encode, seed_audio, seed_frames

FPS = 25.0
CFG = load_config().speaker


@pytest.fixture(scope="module")
def net():
    return load_light_asd()


def _lead(net, face_seed: int, voice_seed: int, n: int = 100) -> float:
    """Mean sync lead of seed ``face_seed``'s talking face under seed ``voice_seed``'s voice."""
    frames = seed_frames(face_seed)[:n]
    box = np.array(FaceDetector(0.6, 10)(frames[0])[0].box)
    crops = FaceCrops(n, FPS)
    for t, f in enumerate(frames):
        crops.feed(t, f, {0: (np.zeros((5, 2)), box)})
    m = n * SR // 25
    voice = np.pad(seed_audio(voice_seed), (0, m))[:m]
    _, lead = asd_scores(net, crops, [0], voice, SR)
    return float(np.mean(lead))


@pytest.mark.parametrize(("face", "other"), [(2, 4), (4, 2), (3, 5)])
def test_a_face_leads_with_its_own_voice_and_not_under_another_persons_words(net, face, other):
    own, foreign = _lead(net, face, face), _lead(net, face, other)
    assert own >= CFG.asd_sync_min > foreign, (own, foreign)  # the line the decision draws


def test_the_cap_scores_the_best_agreeing_faces_first_then_the_most_active():
    act = np.array([[0.9, 0.9], [0.1, 0.1], [0.5, 0.5]])  # (tracks, frames) mouth activity
    change = np.ones((3, 2))  # every face moves: none is a still picture
    agree = np.array([[0.0, 0.1], [0.4, 0.3], [np.nan, np.nan]])  # (tracks, steps); track 2: none measured
    settings = speaker_settings(CFG)
    assert scored_tracks(act, change, np.ones(2), settings, 2, agree) == [0, 1]
    assert scored_tracks(act, change, np.ones(2), settings, 1, agree) == [1]  # agreement before activity
    assert scored_tracks(act, change, np.ones(2), settings, 1) == [0]  # no agreement: activity


def test_in_a_three_face_shot_the_speaker_is_among_the_scored_faces(tmp_path):
    """`held_out_7/three_faces` through the shot decision: the middle face speaks, both listeners' mouths move
    more than its (one mouths backwards, one talks other words); ranked by activity the speaker was left
    out and a listener dubbed, ranked by agreement it is scored and named."""
    case = av_case("held_out_7/three_faces")
    info = probe(encode(tmp_path / "c.mp4", case.frames, case.audio))
    d = decide_shot(0, 0, info.frame_count, info, case.audio, SR, load_config())
    scored = [
        case.who(d.faces.track(k).boxes[0])
        for k, row in enumerate(d.faces.asd)
        if any(v is not None for v in row)
    ]
    assert 1 in scored, scored
    named = {case.who(d.faces.track(s.speaker).boxes[0]) for s in d.faces.segments if s.status == "speaker"}
    assert named <= {1}, named  # never a listener confidently


def test_a_crowd_is_scored_only_up_to_asd_max_faces_the_most_active_mouths_first():
    n = 60
    clips = [backwards(1, n), talking(2, n), talking(3, n, 5)]
    frames, _ = canvas(clips, (360, 900), [0.9, 0.9, 0.9])
    audio = np.pad(seed_audio(2), (0, n * SR // 25))[: n * SR // 25]
    probs = np.ones(n)
    two = analyse_frames(
        iter(frames), n, probs, FPS, dataclasses.replace(CFG, asd_max_faces=2), (360, 900), audio=audio
    )
    scored = [any(v is not None for v in row) for row in two.asd]
    assert len(two.tracks) == 3 and sum(scored) == 2, scored
    act = [np.mean([v for v in row if v is not None]) for row in two.activity]
    left_out = scored.index(False)
    assert act[left_out] == min(act), act  # the stillest mouth is the one not scored
    every = analyse_frames(
        iter(frames), n, probs, FPS, dataclasses.replace(CFG, asd_max_faces=3), (360, 900), audio=audio
    )
    assert all(any(v is not None for v in row) for row in every.asd)
