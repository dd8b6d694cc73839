"""One face, one voice (tasks/perception/voices.py, model/speaker/voice_id.py): the GE2E encoder against embeddings the
reference implementation computed (Resemblyzer 0.1.4's own `embed_utterance` on the committed heads' speech,
tests/fixtures/voice/ge2e_golden.npz), its separation of voices on the real heads, and the rule on real
dialogue audio composed so the truth is known: two lines of two seeds given to one face."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model.checkpoint import CheckpointError
from model.speaker.voice_id import RATE, embed, embed_many, load_voice_encoder, mel_frames, partial_starts
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.voices import doubt_two_voices
from tests.speaker_cases import seed_audio

GOLDEN = Path(__file__).parent / "fixtures" / "voice" / "ge2e_golden.npz"
FPS = 25.0


def _speech(i: int, a: float, b: float) -> np.ndarray:
    return seed_audio(i).astype(np.float32)[round(a * RATE) : round(b * RATE)]


def test_the_encoder_gives_the_reference_embeddings():
    golden = np.load(GOLDEN)
    encoder = load_voice_encoder()
    for seed, a, b, ref in zip(
        golden["seeds"], golden["start_s"], golden["end_s"], golden["embedding"], strict=True
    ):
        got = embed(encoder, _speech(int(seed), float(a), float(b)))
        assert got.shape == (256,) and abs(float(np.linalg.norm(got)) - 1) < 1e-5
        # float16 weights (model/speaker/assets): the reference ran the float32 originals
        assert float(got @ ref) > 0.99999 and np.abs(got - ref).max() < 2e-3, (seed, a, b)


def test_the_mel_frames_are_librosas():
    """The encoder was trained on librosa.feature.melspectrogram (n_fft 400, hop 160, 40 bands); ours is numpy."""
    librosa = pytest.importorskip("librosa")
    wav = _speech(3, 0.3, 2.31)  # a length that is no multiple of the hop
    ref = librosa.feature.melspectrogram(y=wav, sr=RATE, n_fft=400, hop_length=160, n_mels=40).T
    got = mel_frames(wav)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-5 * ref.max()


def test_stretches_embedded_in_one_batch_are_each_their_own_embedding():
    encoder = load_voice_encoder()
    stretches = [_speech(1, 0.0, 2.0), _speech(2, 0.5, 1.2), _speech(3, 0.0, 4.4)]  # 2, 1 and 4 partials
    batch = embed_many(encoder, stretches)
    assert batch.shape == (3, 256)
    for got, wav in zip(batch, stretches, strict=True):
        alone = embed_many(encoder, [wav])[0]
        assert np.abs(got - alone).max() < 1e-5
    assert float(batch[0] @ batch[1]) < 0.99  # not one stretch's embedding copied to all


def test_partials_cover_the_utterance_as_the_reference_cuts_it():
    assert partial_starts(RATE) == [0]  # 1 s: one partial, padded
    assert partial_starts(2 * RATE) == [0, 77]  # 1.3 partials a second, 77 mel frames apart
    assert partial_starts(round(1.7 * RATE)) == [0]  # a second partial 58 % covered is dropped


def test_one_voice_scores_above_the_line_and_two_voices_below():
    """Two seconds each side, as the rule compares: the first 2 s of each committed seed (1-9) against its own next
    2 s (measured 0.74-0.83) and against every other seed's (median 0.52, 86 % below 0.6, at most 0.64)."""
    encoder = load_voice_encoder()
    seeds = range(1, 10)
    first = {i: embed(encoder, _speech(i, 0.0, 2.0)) for i in seeds}
    second = {i: embed(encoder, _speech(i, 2.0, 4.0)) for i in seeds}
    same = [float(first[i] @ second[i]) for i in seeds]
    other = [float(first[i] @ second[j]) for i in seeds for j in seeds if i != j]
    assert min(same) > 0.6, same
    assert np.median(other) < 0.6 and np.mean(np.array(other) < 0.6) > 0.8, sorted(other)


def _seg(a: int, b: int, status: str, who: int | None) -> SpeakerSegment:
    return SpeakerSegment(a, b, status, who, 0.9)


def _voices(audio: np.ndarray):
    encoder = load_voice_encoder()
    return lambda spans: embed_many(
        encoder, [audio[round(a / FPS * RATE) : round(b / FPS * RATE)] for a, b in spans]
    )


def test_one_face_given_two_voices_is_uncertain():
    # seed 2 speaks 0-2.4 s, then seed 1 (a turn with no pause), as tests/av_cases.py's turn-taking composes it
    two = np.concatenate([_speech(2, 0.0, 2.48), _speech(1, 0.0, 2.32)])
    lines = [_seg(0, 55, "speaker", 0), _seg(65, 120, "speaker", 0)]  # both given to face 0
    out = doubt_two_voices(lines, _voices(two), 0.6, 25, FPS)
    assert [s.status for s in out] == ["uncertain", "uncertain"]
    whole = [_seg(0, 120, "speaker", 0)]  # one line across the change of voice
    assert [s.status for s in doubt_two_voices(whole, _voices(two), 0.6, 25, FPS)] == ["uncertain"]
    split = [_seg(0, 55, "speaker", 0), _seg(65, 120, "speaker", 1)]  # each voice its own face: kept
    assert doubt_two_voices(split, _voices(two), 0.6, 25, FPS) == split


def test_one_voice_on_one_face_stays_sure():
    one = _speech(2, 0.0, 4.8)
    lines = [_seg(0, 55, "speaker", 0), _seg(65, 120, "speaker", 0)]
    assert doubt_two_voices(lines, _voices(one), 0.6, 25, FPS) == lines
    whole = [_seg(0, 120, "speaker", 0)]
    assert doubt_two_voices(whole, _voices(one), 0.6, 25, FPS) == whole
    unsure = [_seg(0, 55, "uncertain", 0), _seg(65, 120, "speaker", 0)]  # nothing confident to compare
    assert doubt_two_voices(unsure, _voices(np.zeros(5 * RATE, np.float32)), 0.6, 25, FPS) == unsure


def test_a_foreign_weights_file_is_named(tmp_path):
    bad = tmp_path / "voice.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="voice.safetensors"):
        load_voice_encoder(bad)
