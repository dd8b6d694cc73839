"""Parity runner for `wav2vec/*` goldens: `get_embedding` cases and loudness normalisation.

Dispatch on content: a case naming an `input_file` is file -> features (the dialogue decode with
librosa.load semantics, loudness normalisation, embedding); a case with a waveform input and a [frames, layers, hidden] output is an
embedding case (frame rate = frames_float / duration_s from `video_length`, default 25; the HF
model folder from `model_dir`, else the one folder with a config.json); a case with `normalized`
style outputs and LUFS fields is loudness normalisation. Intermediate outputs (normalised input,
conv features, interpolated features) are checked when present, recognised by shape.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from model.network.wav2vec import TARGET_LUFS, AudioEncoder, load_wav2vec, loudness_normalize
from tests.parity.common import assert_close, load_tensors

TOL = 1e-4


def _model_dir(case_dir: Path, manifest: dict, parity_root: Path) -> Path:
    ref = manifest.get("model_dir")
    if isinstance(ref, str) and (case_dir / ref.split()[0] / "config.json").is_file():
        return (case_dir / ref.split()[0]).resolve()
    found = sorted((parity_root / case_dir.relative_to(parity_root).parts[0]).rglob("config.json"))
    assert len(found) == 1, f"{case_dir}: expected one wav2vec2 model folder, found {found}"
    return found[0].parent


def _run_embedding(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    enc: AudioEncoder = load_wav2vec(_model_dir(case_dir, manifest, parity_root), dtype=torch.float32)
    inputs = load_tensors(case_dir / "inputs.safetensors")
    goldens = load_tensors(case_dir / "outputs.safetensors")
    wave = (inputs["waveform"] if "waveform" in inputs else next(iter(inputs.values()))).numpy()
    vl = manifest.get("video_length", {})
    fps = vl["frames_float"] / vl["duration_s"] if {"frames_float", "duration_s"} <= set(vl) else 25.0

    x = enc.normalize(wave)
    emb = enc.embed(wave, fps=fps)  # (frames, layers, hidden)
    if "seq_len" in vl:
        assert emb.shape[0] == vl["seq_len"], f"{emb.shape[0]} frames != manifest seq_len {vl['seq_len']}"
    n = emb.shape[0]
    stats = enc.track_stats(x)
    n_conv = (x.numel() - enc.receptive_field) // enc.stride + 1
    candidates = {  # what each recognised output can be, by shape (and by name when shapes tie)
        "audio_emb": emb,  # (frames, layers, hidden)
        "input_values": x,  # feature-extractor output (normalised waveform)
        "interpolated": enc.frame_features(x, n, 0, n, stats)[None],  # (1, frames, C)
        "conv": enc.conv_features(x, 0, n_conv, stats).T[None],  # (1, C, T_conv)
    }
    checked = 0
    for name, golden in goldens.items():
        meaning = str(manifest.get("outputs", {}).get(name, {}).get("meaning", "")).lower()
        fits = [k for k, v in candidates.items() if tuple(v.shape) == tuple(golden.shape)]
        if len(fits) > 1:
            fits = [k for k in fits if k in name.lower() or k in meaning] or fits
        if not fits:
            continue
        assert len(fits) == 1, f"{name}: ambiguous output {fits}"
        assert_close(candidates[fits[0]], golden, TOL, f"{case_dir.name}/{name}")
        checked += 1
    assert checked, f"{case_dir}: no outputs recognised"


def _run_loudness(case_dir: Path, manifest: dict) -> None:
    inputs = load_tensors(case_dir / "inputs.safetensors")
    goldens = load_tensors(case_dir / "outputs.safetensors")
    wave = next(iter(inputs.values())).numpy()
    target = float(manifest.get("target_lufs", TARGET_LUFS))
    ours = loudness_normalize(wave, 16000, target)
    golden = next(iter(goldens.values()))
    assert_close(
        torch.from_numpy(np.asarray(ours, dtype=np.float32)), golden, TOL, f"{case_dir.name}/loudness"
    )
    quiet = manifest.get("quiet_case", {})
    if quiet.get("returned_unchanged"):
        small = wave * np.float32(1e-6)
        assert np.array_equal(loudness_normalize(small, 16000, target), small), (
            "silent input must come back unchanged"
        )
    # too short for a loudness block: returned as is (the official code would raise here)
    short = wave[:1000]
    assert np.array_equal(loudness_normalize(short, 16000, target), short)


def _run_file(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    """file -> features: dubflow's dialogue decode (`audio.resampler` soxr_hq, what `prepare_dialogue`
    uses), loudness normalisation and embedding against the official path's tensors."""
    from tasks.config.pipeline import load_config
    from tasks.media.audio import decode_audio

    cfg = load_config().audio
    goldens = load_tensors(case_dir / "outputs.safetensors")
    path = case_dir / manifest["input_file"]
    wave = decode_audio(path, sample_rate=cfg.sample_rate, channels=cfg.channels, resampler=cfg.resampler)[
        :, 0
    ]
    assert_close(torch.from_numpy(wave), goldens["waveform"], 1e-6, f"{case_dir.name}/waveform")
    normalized = loudness_normalize(wave, cfg.sample_rate)
    assert_close(torch.from_numpy(normalized), goldens["normalized"], 1e-6, f"{case_dir.name}/normalized")
    enc: AudioEncoder = load_wav2vec(_model_dir(case_dir, manifest, parity_root), dtype=torch.float32)
    vl = manifest.get("video_length", {})
    fps = vl["frames_float"] / vl["duration_s"] if {"frames_float", "duration_s"} <= set(vl) else 25.0
    assert_close(enc.embed(normalized, fps=fps), goldens["audio_emb"], TOL, f"{case_dir.name}/audio_emb")


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    text = " ".join(str(v) for v in (manifest.get("description", ""), *manifest.get("semantics", [])))
    if "input_file" in manifest:
        _run_file(case_dir, manifest, parity_root)
    elif any("LUFS" in k for k in manifest) or "loudness" in text.lower() and "get_embedding" not in text:
        _run_loudness(case_dir, manifest)
    elif (case_dir / "outputs.safetensors").is_file():
        _run_embedding(case_dir, manifest, parity_root)
    else:
        raise AssertionError(f"{case_dir}: unrecognised wav2vec manifest (keys {sorted(manifest)})")
