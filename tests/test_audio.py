"""Dialogue audio: decoding any format, the length policy, per-shot slicing, errors."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tasks.config.pipeline import load_config
from tasks.errors import AudioLengthError, DecodeError, MediaError, NoAudioStream
from tasks.media.audio import (
    DialogueTrack,
    check_length,
    decode_audio,
    prepare_dialogue,
    read_samples,
    sample_at_frame,
    slice_bounds,
)
from tests.media import make_audio, make_clip

FPS = Fraction(24000, 1001)


@pytest.mark.parametrize(
    ("suffix", "rate", "channels", "codec", "slack_s"),
    [
        (".wav", 44100, 2, None, 0.0),
        (".flac", 22050, 1, None, 0.0),
        (".mp3", 48000, 2, "libmp3lame", 0.06),
        (".m4a", 32000, 6, "aac", 0.06),
    ],
)
def test_decode_any_format_rate_channels(tmp_path: Path, suffix, rate, channels, codec, slack_s):
    src = make_audio(tmp_path / f"a{suffix}", 1.5, rate=rate, channels=channels, codec=codec)
    x = decode_audio(src, sample_rate=16000, channels=1)
    assert x.dtype == np.float32 and x.shape[1] == 1
    assert abs(x.shape[0] - 24000) <= slack_s * 16000
    assert 0.1 < np.abs(x).max() <= 1.0  # real signal, not silence
    stereo = decode_audio(src, sample_rate=8000, channels=2)
    assert stereo.shape[1] == 2 and abs(stereo.shape[0] - 12000) <= slack_s * 8000 + 1


def test_sample_positions_use_the_rational_rate():
    # 1001 frames at 24000/1001 fps are exactly 41.708333 s... = 1001*1001/24000 s
    assert sample_at_frame(24, FPS, 48000) == 48048
    assert sample_at_frame(1, Fraction(30000, 1001), 16000) == 534  # 533.866 rounds up
    assert sample_at_frame(3, Fraction(25), 16000) == 1920


def test_slice_bounds_tile_the_track_exactly():
    edges = [0, 60, 130, 142, 210, 288]
    for total in (192192, 192192 - 300, 192192 + 300):  # exact, a bit short, a bit long
        b = slice_bounds(edges, FPS, 16000, total)
        assert b[0][0] == 0 and b[-1][1] == total
        assert all(b0[1] == b1[0] for b0, b1 in zip(b, b[1:], strict=False))
        assert sum(e - s for s, e in b) == total
    assert slice_bounds(edges, FPS, 16000, 192192)[1] == (40040, 86753)


def test_length_policy():
    n = 288
    exact = sample_at_frame(n, FPS, 16000)
    frame = 16000 * FPS.denominator // FPS.numerator  # 667 samples
    assert check_length(exact + frame, 16000, n, FPS, "error", path="d.wav").action == "ok"
    assert check_length(exact - frame, 16000, n, FPS, "error", path="d.wav").action == "ok"
    with pytest.raises(
        AudioLengthError, match=r"d\.wav: audio is .* shorter than the picture .*length_policy=pad"
    ):
        check_length(exact - 2 * frame, 16000, n, FPS, "error", path="d.wav")
    with pytest.raises(AudioLengthError, match="longer"):
        check_length(exact + 2 * frame, 16000, n, FPS, "pad", path="d.wav")
    with pytest.raises(AudioLengthError, match="shorter"):
        check_length(exact - 2 * frame, 16000, n, FPS, "trim", path="d.wav")
    pad = check_length(exact - 2 * frame, 16000, n, FPS, "pad", path="d.wav")
    trim = check_length(exact + 5 * frame, 16000, n, FPS, "fit", path="d.wav")
    assert (pad.action, pad.target_samples, trim.action, trim.target_samples) == ("pad", exact, "trim", exact)


def test_prepare_dialogue_pads_with_warning_and_reads_slices(tmp_path: Path, caplog):
    src = make_audio(tmp_path / "short.wav", 10.0, rate=22050)
    cfg = load_config(overrides=["audio.length_policy=pad"]).audio
    with caplog.at_level("WARNING"):
        track = prepare_dialogue(src, frame_count=288, fps=FPS, cfg=cfg, out_wav=tmp_path / "w" / "d.wav")
    assert "padding with silence" in caplog.text
    assert track.action == "pad" and track.n_samples == sample_at_frame(288, FPS, 16000)
    data, sr = sf.read(track.path, dtype="float32")
    assert sr == 16000 and data.shape[0] == track.n_samples and np.all(data[160_001:] == 0)
    assert DialogueTrack.from_dict(track.to_dict()) == track
    part = read_samples(track, 1000, 1500)
    assert part.shape == (500, 1) and np.array_equal(part[:, 0], data[1000:1500])
    with pytest.raises(AudioLengthError):
        prepare_dialogue(src, frame_count=288, fps=FPS, cfg=load_config().audio, out_wav=tmp_path / "e.wav")
    assert not (tmp_path / "e.wav").exists()


def test_audio_errors_name_the_file(tmp_path: Path):
    with pytest.raises(MediaError, match="nope.wav: no such file"):
        decode_audio(tmp_path / "nope.wav", sample_rate=16000, channels=1)
    with pytest.raises(NoAudioStream, match="silent.mp4: no audio stream"):
        decode_audio(make_clip(tmp_path / "silent.mp4", audio_channels=None), sample_rate=16000, channels=1)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros((0, 1), np.float32), 16000)
    with pytest.raises(MediaError, match="empty.wav: audio stream contains no samples"):
        decode_audio(empty, sample_rate=16000, channels=1)
    broken = tmp_path / "broken.flac"
    good = make_audio(tmp_path / "good.flac", 2.0).read_bytes()
    broken.write_bytes(good[:200] + bytes(len(good) - 200))
    with pytest.raises((DecodeError, MediaError), match="broken.flac"):
        decode_audio(broken, sample_rate=16000, channels=1)


def test_the_model_hears_the_dub_as_librosa_load_does():
    """The dialogue decode (`audio.resampler: soxr_hq`) is `librosa.load(path, sr=16000)` to the sample on the
    file of the parity golden (44.1 kHz stereo); ffmpeg's -ac 1 -ar 16000 is +3 dB (its stereo down-mix) and
    ~39 dB SNR away (its resampler) from it."""
    import librosa

    from tasks.config.pipeline import load_config
    from tasks.media.audio import decode_audio

    wav = (
        Path(__file__).parent / "fixtures" / "parity" / "wav2vec" / "file_to_features" / "dub_44k1_stereo.wav"
    )
    cfg = load_config().audio
    assert cfg.resampler == "soxr_hq"
    ours = decode_audio(wav, sample_rate=16000, channels=1, resampler=cfg.resampler)[:, 0]
    official, _ = librosa.load(str(wav), sr=16000)
    assert ours.dtype == official.dtype and np.array_equal(ours, official)
    old = decode_audio(wav, sample_rate=16000, channels=1, resampler="ffmpeg")[:, 0]
    gain = float(old @ official) / float(old @ old)
    snr = 10 * np.log10(float(official @ official) / float(((gain * old - official) ** 2).sum()))
    assert abs(20 * np.log10(1 / gain) - 3.01) < 0.05 and 30 < snr < 45
