"""Speech gate on synthetic signals and on real (espeak-ng) speech."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scipy.signal import lfilter

from tasks.speech import SpeechConfig, SpeechInfo, detect_speech, frame_features

SR = 16000
SPEECH_WAV = Path(__file__).parent / "data" / "speech.wav"


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    audio, sr = sf.read(SPEECH_WAV, dtype="float32")
    assert sr == SR and audio.ndim == 1
    return audio


def tone(freqs, seconds=2.0, amp=0.3, sr=SR):
    t = np.arange(int(seconds * sr)) / sr
    return (amp * sum(np.sin(2 * np.pi * f * t) for f in freqs) / len(freqs)).astype(np.float32)


def noise(level_db, seconds=2.0, sr=SR, seed=0):
    rng = np.random.default_rng(seed)
    return (10 ** (level_db / 20) * rng.standard_normal(int(seconds * sr))).astype(np.float32)


def vowels(seconds=2.0, sr=SR, f0=130.0, syllables_hz=3.5, seed=0):
    """Formant-filtered glottal pulse train with a gliding pitch and a syllable-rate envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    pitch = f0 * (1 + 0.12 * np.sin(2 * np.pi * 0.8 * t)) * (1 + 0.01 * rng.standard_normal(len(t)))
    phase = 2 * np.pi * np.cumsum(pitch) / sr
    source = sum(np.cos(k * phase) / k for k in range(1, 40))
    out = np.zeros_like(source)
    for formant, bw in ((650, 100), (1150, 120), (2500, 170)):
        r, th = np.exp(-np.pi * bw / sr), 2 * np.pi * formant / sr
        out += lfilter([1 - r], [1, -2 * r * np.cos(th), r * r], source)
    envelope = np.clip(np.sin(2 * np.pi * syllables_hz * t), 0, None) ** 0.6
    out = out * envelope
    return (0.4 * out / np.abs(out).max()).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "signal"),
    [
        ("digital silence", np.zeros(2 * SR, np.float32)),
        ("low-level white noise", noise(-60)),
        ("loud white noise", noise(-20)),
        ("1 kHz tone", tone([1000])),
        ("held chord", tone([440, 554, 659])),
        ("mains hum", tone([50, 100, 150, 200])),
        ("beeping tone", tone([440]) * (np.sin(2 * np.pi * 2 * np.arange(2 * SR) / SR) > 0)),
    ],
)
def test_non_speech_is_rejected(name, signal):
    info = detect_speech(signal.astype(np.float32), SR)
    assert not info.has_speech, (name, info)
    assert info.reason.startswith("no speech in dub track"), info.reason
    assert info.speech_ratio < 0.05


def test_silence_reason_names_the_level():
    info = detect_speech(noise(-70), SR)
    assert not info.has_speech and "silent" in info.reason and info.speech_segments_s == ()


def test_real_speech_is_found(speech):
    info = detect_speech(speech, SR)
    assert info.has_speech and info.reason.startswith("speech ")
    assert info.speech_ratio > 0.6  # espeak talks almost all the time


def test_speech_segments_are_located_in_time(speech):
    gap = np.zeros(SR, np.float32)
    audio = np.concatenate([gap, speech, gap, gap])
    info = detect_speech(audio, SR)
    assert info.has_speech
    start, end = info.speech_segments_s[0][0], info.speech_segments_s[-1][1]
    voice_end = 1.0 + len(speech) / SR
    assert 0.95 <= start <= 1.2, info.speech_segments_s
    assert voice_end - 0.5 <= end <= voice_end + 0.3, info.speech_segments_s
    total = sum(b - a for a, b in info.speech_segments_s)
    assert info.speech_ratio == pytest.approx(total / (len(audio) / SR), abs=1e-3)
    assert 0.25 < info.speech_ratio < 0.55


def test_speech_over_background_noise_is_found(speech):
    audio = np.concatenate([np.zeros(SR, np.float32), speech, np.zeros(SR, np.float32)])
    audio = audio + noise(-45, seconds=len(audio) / SR, seed=2)[: len(audio)]
    info = detect_speech(audio, SR)
    assert info.has_speech and info.speech_segments_s[0][0] >= 0.9


@pytest.mark.parametrize("sr", [16000, 22050, 48000])
def test_synthetic_vowels_count_as_speech_at_any_rate(sr):
    info = detect_speech(vowels(sr=sr), sr)
    assert info.has_speech and info.speech_ratio > 0.5, info


def test_quiet_but_normal_speech_level_is_found():
    audio = vowels() * 10 ** (-14 / 20)  # about -40 dBFS RMS
    level = 10 * np.log10(np.mean(audio.astype(np.float64) ** 2))
    assert -45 < level < -35
    assert detect_speech(audio, SR).has_speech


def test_a_click_of_speech_is_not_enough(speech):
    short = np.concatenate([np.zeros(SR, np.float32), speech[int(0.05 * SR) : int(0.15 * SR)], np.zeros(SR)])
    info = detect_speech(short.astype(np.float32), SR)
    assert not info.has_speech


def test_features_separate_noise_tone_and_voice():
    cfg = SpeechConfig()
    f_noise = frame_features(noise(-20), SR, cfg)
    f_tone = frame_features(tone([1000]), SR, cfg)
    f_voice = frame_features(vowels(syllables_hz=0.25), SR, cfg)  # first second: rising syllable
    voiced = slice(20, 90)
    assert np.median(f_noise.flatness) > cfg.max_flatness
    assert np.median(f_tone.peak_ratio) > cfg.max_peak_ratio
    assert np.all(f_voice.flatness[voiced] < cfg.max_flatness)
    assert np.all(f_voice.peak_ratio[voiced] < cfg.max_peak_ratio)
    assert np.all(f_voice.band_ratio[voiced] > cfg.min_band_ratio)
    assert f_tone.level_db.max() == pytest.approx(20 * np.log10(0.3 / np.sqrt(2)), abs=0.1)


def test_short_and_empty_slices_and_bad_input():
    assert not detect_speech(np.zeros(0, np.float32), SR).has_speech
    assert not detect_speech(np.zeros(100, np.float32), SR).has_speech  # shorter than one frame
    with pytest.raises(ValueError, match="mono"):
        detect_speech(np.zeros((SR, 2), np.float32), SR)
    with pytest.raises(ValueError, match="sample rate"):
        detect_speech(np.zeros(SR, np.float32), 0)


def test_speech_info_json_round_trip(speech):
    info = detect_speech(speech, SR)
    again = SpeechInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert again == info
