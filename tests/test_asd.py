"""Learned active-speaker scores (tasks/perception/asd.py) and the decision on them
(tasks/perception/speaker.find_asd_speakers, fuse_asd): crops and the 25 fps clock, the real network on the real
talking heads with their own voice / silence, the judging rules on constructed scores, the record and the sheet."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flows.report import speaker_columns
from model.speaker.light_asd import load_light_asd
from tasks.config.pipeline import load_config
from tasks.perception.asd import PAD_GREY, FaceCrops, asd_scores, clock, crop_face
from tasks.perception.asd_speaker import AsdSettings, SyncEvidence, find_asd_speakers, fuse_asd
from tasks.perception.face_analysis import ShotFaces, TrackInfo, analyse_frames
from tasks.perception.faces import FaceDetector
from tasks.perception.speaker import SpeakerSegment, SpeakerSettings
from tasks.render.qc_overlay import SpeakerOverlay
from tests.speaker_cases import SR, cases, seed_audio, seed_frames

FPS = 25.0
SETTINGS = SpeakerSettings(0.145, 0.05, 0.6, 0.2, 3.0, 0.135)
ASD = AsdSettings(
    on=0.0, band=0.5, margin=1.0, scale=2.0, switch_penalty=3.0, min_s=0.6, sync_min=0.15, sync_sure=0.55
)


def test_the_crop_is_the_face_box_square_and_grey_outside_the_frame():
    gray = np.zeros((100, 200), np.uint8)
    gray[20:60, 50:90] = 255  # a 40 px "face"
    crop = crop_face(gray, np.array([50, 20, 90, 60]))
    assert crop.shape == (112, 112) and crop[5:-5, 5:-5].min() > 200  # the box fills the crop
    edge = crop_face(gray, np.array([-40, 20, 0, 60]))  # a box left of the frame: padding grey
    assert (edge[:, :50] == PAD_GREY).all()


def test_the_clock_picks_the_frame_nearest_each_tick():
    assert (clock(10, 25.0) == np.arange(10)).all()
    assert (clock(20, 50.0) == np.arange(0, 20, 2) + 1).all()  # the frame around each tick's middle
    ticks = clock(24, 24.0)
    assert len(ticks) == 25 and ticks[-1] == 23 and (np.diff(ticks) >= 0).all()


@pytest.fixture(scope="module")
def net():
    return load_light_asd()


@pytest.mark.parametrize("seed", [2, 4])
def test_a_real_talking_head_scores_as_speaking_with_its_voice_not_with_silence(net, seed):
    frames = seed_frames(seed)[:100]
    box = np.array(FaceDetector(0.6, 10)(frames[0])[0].box)
    crops = FaceCrops(len(frames), FPS)
    for t, f in enumerate(frames):
        crops.feed(t, f, {0: (np.zeros((5, 2)), box)})
    n = len(frames) * SR // 25
    voice = np.pad(seed_audio(seed), (0, n))[:n]
    score, lead = asd_scores(net, crops, [0], voice, SR)
    quiet, _ = asd_scores(net, crops, [0], np.zeros(n, np.float32), SR)
    assert score.shape == lead.shape == (1, len(frames)) and not np.isnan(score).any()
    assert np.mean(score) > 0.5 and np.mean(quiet) < np.mean(score) - 2.0, (np.mean(score), np.mean(quiet))
    assert np.mean(lead) > 0.0  # its own voice in place beats the same voice moved
    missing, _ = asd_scores(net, crops, [1], voice, SR)  # a track without crops: not scored
    assert np.isnan(missing).all()


def _decide(scores: list[float], leads: list[float], speech: slice = slice(0, 100)):
    n = 100
    asd = np.array([np.full(n, s) for s in scores])
    lead = np.array([np.full(n, v) for v in leads])
    prob = np.zeros(n)
    prob[speech] = 1.0
    return find_asd_speakers(asd, lead, asd * 0 + 0.3, prob, FPS, SETTINGS, ASD)


def test_one_face_clearly_speaking_is_the_speaker_two_are_uncertain_none_is_nobody():
    (seg,) = _decide([2.5, -0.5], [0.4, 0.0])
    assert (seg.status, seg.speaker) == ("speaker", 0) and seg.score > 0.5
    (seg,) = _decide([-0.4, 2.6], [0.0, 0.4])  # a listener scoring low never blocks the speaker
    assert (seg.status, seg.speaker) == ("speaker", 1)
    (seg,) = _decide([2.0, 1.6], [0.4, 0.4])  # two faces speaking alike: two speakers?
    assert (seg.status, seg.speaker, seg.runner_up) == ("uncertain", 0, 1)
    (seg,) = _decide([2.8, 1.2], [0.4, 0.0])  # the second moves, the first leads by more than the margin
    assert (seg.status, seg.speaker) == ("speaker", 0)
    (seg,) = _decide([-1.5, -2.0], [0.0, 0.0])
    assert (seg.status, seg.speaker) == ("none", None)
    (seg,) = _decide([0.2, -2.0], [0.3, 0.0])  # barely above the line
    assert seg.status == "uncertain"


def test_lips_that_do_not_follow_the_speech_are_never_a_confident_speaker():
    (seg,) = _decide([2.5, -1.0], [0.02, 0.0])  # scores high, but moving the audio changes nothing
    assert (seg.status, seg.speaker) == ("uncertain", 0)
    segs = _decide([2.5, -1.0], [0.4, 0.0], speech=slice(80, 90))  # a 0.4 s line alone: too short
    assert [s.status for s in segs] == ["uncertain"]


def test_fusion_settles_uncertain_agreement_and_never_overrules_none():
    learned = [SpeakerSegment(0, 50, "speaker", 1, 0.9), SpeakerSegment(50, 100, "speaker", 0, 0.8)]
    agreed = [SpeakerSegment(0, 50, "uncertain", 0, 0.3, 1), SpeakerSegment(50, 100, "none", None, 0.6)]
    out = fuse_asd(agreed, learned, 100)
    assert [(s.start_frame, s.end_frame, s.status, s.speaker) for s in out] == [
        (0, 50, "speaker", 1),
        (50, 100, "none", None),
    ]
    out = fuse_asd(
        [SpeakerSegment(0, 100, "speaker", 0, 0.7)], [SpeakerSegment(40, 100, "speaker", 1, 0.9)], 100
    )
    assert [(s.start_frame, s.status, s.speaker, s.runner_up) for s in out] == [
        (0, "speaker", 0, None),
        (40, "uncertain", 0, 1),
    ]
    same = [SpeakerSegment(0, 100, "speaker", 0, 0.7)]
    assert fuse_asd(same, [SpeakerSegment(0, 100, "uncertain", 1, 0.2, 0)], 100) == same
    (out,) = fuse_asd(same, [SpeakerSegment(0, 100, "none", None, 0.6)], 100)  # sure nobody on screen says it
    assert (out.status, out.speaker) == ("uncertain", 0)


def test_a_lone_face_needs_a_strong_lead_to_be_a_confident_speaker():
    """A reaction shot's lone face talking other words under an off-screen voice scores as speaking, with a
    weak lead: with no other face to rank it against, only `sync_sure` makes it confident."""
    (seg,) = _decide([2.5], [0.4])
    assert (seg.status, seg.speaker) == ("uncertain", 0)
    (seg,) = _decide([2.5], [0.8])
    assert (seg.status, seg.speaker) == ("speaker", 0)
    (seg,) = _decide([2.5, -2.0], [0.4, 0.0])  # beside another face the usual bar holds
    assert (seg.status, seg.speaker) == ("speaker", 0)


def test_fusion_with_leads_turns_contradicted_verdicts_uncertain():
    """With the sync leads: agreement's "none" gives way where the network names a face leading by
    `sync_sure`; a confident agreement speaker is uncertain where the network's best is another face in sync."""
    n = 100
    lead = np.zeros((2, n))
    none = [SpeakerSegment(0, n, "none", None, 0.6)]
    learned = [SpeakerSegment(0, n, "speaker", 1, 0.9)]
    sync = SyncEvidence(lead, ASD, FPS)
    lead[1] = 0.3
    assert fuse_asd(none, learned, n, sync) == none  # a weak lead: agreement's none stays
    lead[1] = 0.8
    (out,) = fuse_asd(none, learned, n, sync)
    assert (out.status, out.speaker) == ("uncertain", 1)
    sure = [SpeakerSegment(0, n, "speaker", 0, 0.7)]
    doubt = [SpeakerSegment(0, n, "uncertain", 1, 0.2, 0)]
    lead[1] = 0.0
    assert fuse_asd(sure, doubt, n, sync) == sure  # the network's other face is not in sync
    lead[1] = 0.3
    (out,) = fuse_asd(sure, doubt, n, sync)
    assert (out.status, out.speaker, out.runner_up) == ("uncertain", 0, 1)
    blip = [SpeakerSegment(0, 90, "speaker", 0, 0.9), SpeakerSegment(90, 100, "uncertain", 1, 0.2, 0)]
    assert fuse_asd(sure, blip, n, sync) == sure  # 0.4 s of doubt: shorter than min_s, no contradiction


def test_agreement_none_inside_a_line_the_fusion_gives_its_face_is_uncertain():
    """The network's one speaker segment over a line: where agreement heard nobody in part of it (a speaker
    whose lips follow the voice weakly at the start) and names that face over the rest, the part is uncertain;
    a line agreement gives nobody throughout keeps its "none" (a listener's parted lips under a voice-over)."""
    n = 100
    sync = SyncEvidence(np.zeros((2, n)), ASD, FPS)  # no lead: the sync_sure rule plays no part
    learned = [SpeakerSegment(0, n, "speaker", 0, 0.9)]
    agreed = [SpeakerSegment(0, 30, "none", None, 0.5), SpeakerSegment(30, n, "uncertain", 0, 0.3, 1)]
    out = fuse_asd(agreed, learned, n, sync)
    assert [(s.start_frame, s.status, s.speaker) for s in out] == [(0, "uncertain", 0), (30, "speaker", 0)]
    none = [SpeakerSegment(0, n, "none", None, 0.6)]
    assert fuse_asd(none, learned, n, sync) == none


def test_the_asd_score_survives_the_record_and_shows_in_the_sheet_and_the_table():
    track = TrackInfo(0, 0, 10, 50.0, False, (0, 9), ((10, 10, 60, 60), (10, 10, 60, 60)))
    faces = ShotFaces(10, 25.0, (100, 100), (100, 100), True, (track,), (), (1.0, 0.0), ((0.2, 0.3),), 5, 0.1,
                      ((0.42, None),), ((1.93, -2.0),))  # fmt: skip
    back = ShotFaces.from_dict(faces.to_dict())
    assert back == faces and back.mean_asd() == {0: 1.93}  # the speech steps only
    assert SpeakerOverlay(faces, [])._agreement_label(0, 2) == " av +0.42 asd +1.9"
    assert SpeakerOverlay(faces, [])._agreement_label(0, 7) == " asd -2.0"
    row = speaker_columns({"regions": [], "agreement": {"0": 0.42}, "asd": {"0": 1.93, "1": -1.04}})
    assert row["agreement"] == "0 +0.42 asd +1.9, 1 asd -1.0"


def test_speaker_asd_off_leaves_the_analysis_as_it_was():
    case = cases()["speaker_left"]
    n = 50
    frames, audio = case.frames[:n], case.audio[: n * SR // 25]
    probs = np.ones(n)
    cfg = load_config().speaker
    off = dataclasses.replace(cfg, asd="off")
    plain = analyse_frames(iter(frames), n, probs, FPS, off, (360, 640))
    with_audio_off = analyse_frames(iter(frames), n, probs, FPS, off, (360, 640), audio=audio)
    on = analyse_frames(iter(frames), n, probs, FPS, cfg, (360, 640), audio=audio)
    assert with_audio_off.asd == () and with_audio_off.segments == plain.segments
    assert len(on.asd) == len(on.tracks) == 2 and any(v is not None for row in on.asd for v in row)
