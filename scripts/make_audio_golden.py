"""Write the parity golden `wav2vec/file_to_features`: a 44.1 kHz stereo WAV through the official
InfiniteTalk audio path, file -> features.

The official pipeline (MeiGen-AI/InfiniteTalk `generate_infinitetalk.py`, commit 0107cd9) reads the
dub with `librosa.load(path, sr=16000)` (soundfile decode, channel mean, soxr high-quality resampling),
scales it to -23 LUFS with pyloudnorm (`loudness_norm`: left alone when |loudness| > 100), then runs
`get_embedding`. This script makes those two steps with librosa and pyloudnorm themselves; the
features (`audio_emb`) come from dubflow's wav2vec2 on the tiny checkpoint of `wav2vec/tiny_wav2vec2`,
which the `wav2vec/get_embedding` golden pins to the official `get_embedding` at 1e-4.

    PYTHONPATH=. python scripts/make_audio_golden.py [tests/fixtures/parity/wav2vec/file_to_features]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import librosa
import numpy as np
import pyloudnorm
import soundfile as sf
import torch
from safetensors.torch import save_file

from model.network.wav2vec import load_wav2vec

SEED, RATE, SECONDS = 2027, 44100, 1.3


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/parity/wav2vec/file_to_features")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    t = np.arange(round(RATE * SECONDS)) / RATE
    voice = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) + 0.05 * rng.standard_normal(
        t.size
    )
    stereo = np.stack([voice, 0.6 * voice + 0.04 * rng.standard_normal(t.size)], axis=1)
    wav = out / "dub_44k1_stereo.wav"
    sf.write(str(wav), stereo, RATE, subtype="PCM_16")

    waveform, sr = librosa.load(str(wav), sr=16000)  # the official call
    loudness = pyloudnorm.Meter(sr).integrated_loudness(waveform)
    normalized = waveform if abs(loudness) > 100 else pyloudnorm.normalize.loudness(waveform, loudness, -23)
    normalized = normalized.astype(np.float32)
    enc = load_wav2vec(out.parent / "tiny_wav2vec2", dtype=torch.float32)
    emb = enc.embed(normalized, fps=25.0)
    tensors = {
        "waveform": torch.from_numpy(np.ascontiguousarray(waveform)),
        "normalized": torch.from_numpy(np.ascontiguousarray(normalized)),
        "audio_emb": emb.contiguous(),
    }
    save_file(tensors, str(out / "outputs.safetensors"))
    save_file({"sample_rate": torch.tensor([sr])}, str(out / "inputs.safetensors"))
    manifest = {
        "case": "wav2vec/file_to_features",
        "description": (
            "file -> features: librosa.load(path, sr=16000) (soundfile, channel mean, soxr_hq), official "
            "loudness_norm (pyloudnorm, -23 LUFS), then get_embedding on ../tiny_wav2vec2"
        ),
        "input_file": wav.name,
        "seed": SEED,
        "librosa_version": librosa.__version__,
        "model_dir": "../tiny_wav2vec2",
        "video_length": {"duration_s": SECONDS, "frames_float": SECONDS * 25, "seq_len": int(emb.shape[0])},
        "outputs": {
            "waveform": {"shape": list(waveform.shape), "dtype": "float32",
                         "meaning": "librosa.load(input_file, sr=16000) : [n] float32 mono at 16 kHz"},
            "normalized": {"shape": list(normalized.shape), "dtype": "float32",
                           "meaning": "official loudness_norm of waveform (pyloudnorm, -23 LUFS)"},
            "audio_emb": {"shape": list(emb.shape), "dtype": "float32",
                          "meaning": "get_embedding of normalized at 25 fps : [frames, layers, hidden]"},
        },
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(out, {k: tuple(v.shape) for k, v in tensors.items()})


if __name__ == "__main__":
    main()
