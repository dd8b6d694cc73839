"""`verify_weights` (header-only integrity check) and `download_weights` file selection."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from model.weights.layout import (
    INFINITETALK_HUB,
    WAN_HUB,
    WAV2VEC_HUB,
    WeightsLayout,
    download_weights,
    verify_weights,
)
from model.weights.tiny import write_tiny_root

L = WeightsLayout()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_tiny_root(tmp_path_factory.mktemp("weights") / "root", seed=0)


def _clone(root: Path, dst: Path) -> Path:
    shutil.copytree(root, dst, copy_function=os.link)  # hard links: replace files, never edit in place
    return dst


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _shard(root: Path, i: int = 0) -> Path:
    return sorted((root / L.wan_dir).glob("diffusion_pytorch_model-*.safetensors"))[i]


def test_tiny_root_passes(root):
    assert verify_weights(root) == []
    assert verify_weights(root, mode="infinitetalk-720") == []


def test_quant_files_required_only_for_quant(root):
    problems = verify_weights(root, quant="fp8")
    assert any("infinitetalk_single_fp8.safetensors: missing" in p for p in problems)
    assert any("infinitetalk_single_fp8.json: missing" in p for p in problems)
    assert not any("diffusion_pytorch_model" in p for p in problems)  # the quantized file replaces the shards


def test_truncated_shard(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    shard = _shard(r, 1)
    _replace(shard, shard.read_bytes()[:-10])
    problems = verify_weights(r)
    assert len(problems) == 1 and shard.name in problems[0] and "truncated" in problems[0]


def test_truncated_header(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    it = r / L.infinitetalk
    _replace(it, it.read_bytes()[:100])
    (problem,) = verify_weights(r)
    assert "infinitetalk.safetensors" in problem


def test_renamed_key(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    shard = _shard(r)
    tensors = load_file(str(shard))
    key = sorted(tensors)[-1]
    tensors[key + "_renamed"] = tensors.pop(key)
    shard.unlink()
    save_file(tensors, str(shard))
    problems = verify_weights(r)
    assert any(shard.name in p and key in p for p in problems), problems


@pytest.mark.parametrize(
    "rel",
    [
        f"{L.wan_dir}/{L.vae}",
        f"{L.wan_dir}/config.json",
        f"{L.wan_dir}/{L.tokenizer}/tokenizer.json",
        f"{L.wav2vec_dir}/model.safetensors",
        L.infinitetalk,
    ],
)
def test_missing_file(root, tmp_path, rel):
    r = _clone(root, tmp_path / "r")
    (r / rel).unlink()
    problems = verify_weights(r)
    assert problems and all(Path(rel).parent.name in p or Path(rel).name in p for p in problems), problems


def test_missing_shard_listed_in_index(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    shard = _shard(r, 2)
    shard.unlink()
    (problem,) = verify_weights(r)
    assert shard.name in problem and "index" in problem


def test_truncated_torch_checkpoint(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    clip = r / L.wan_dir / L.clip
    _replace(clip, clip.read_bytes()[: clip.stat().st_size // 2])
    (problem,) = verify_weights(r)
    assert L.clip in problem


def test_header_length_beyond_file(tmp_path, root):
    r = _clone(root, tmp_path / "r")
    it = r / L.infinitetalk
    data = it.read_bytes()
    _replace(it, struct.pack("<Q", len(data) * 2) + data[8:])
    (problem,) = verify_weights(r)
    assert "exceeds the file size" in problem


def test_bad_arguments(root):
    with pytest.raises(ValueError, match="mode"):
        verify_weights(root, mode="nope")
    with pytest.raises(ValueError, match="quantization"):
        verify_weights(root, quant="int4")
    assert verify_weights(root / "absent") == [f"{root / 'absent'}: weights root not found"]


def test_download_requests_pinned_files_of_the_mode(tmp_path, monkeypatch):
    """No network here: record what would be fetched (repo, file, revision, destination)."""
    import huggingface_hub

    calls = []

    def fake_file(repo_id, filename, *, revision, local_dir):
        calls.append((repo_id, filename, revision, Path(local_dir)))
        return str(Path(local_dir) / filename)

    def fake_snapshot(repo_id, *, revision, allow_patterns, local_dir):
        calls.append((repo_id, tuple(allow_patterns), revision, Path(local_dir)))
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_file)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    assert download_weights(tmp_path, "infinitetalk-480", "none") == tmp_path
    pinned = {WAN_HUB.repo_id: WAN_HUB.revision, INFINITETALK_HUB.repo_id: INFINITETALK_HUB.revision}
    for repo, what, rev, dest in calls:
        if repo in pinned:
            assert rev == pinned[repo]
        else:
            assert repo == WAV2VEC_HUB.repo_id
            assert rev == (WAV2VEC_HUB.revision if what != "model.safetensors" else "refs/pr/1")
        assert dest.parent == tmp_path
    files = {what for _, what, _, _ in calls}
    assert {L.vae, L.t5, L.clip, "config.json", "single/infinitetalk.safetensors"} <= files
    assert ("google/umt5-xxl/*", "diffusion_pytorch_model-*.safetensors") in files

    calls.clear()
    download_weights(tmp_path, "infinitetalk-480", "fp8")
    files = {what for _, what, _, _ in calls}
    assert {
        "quant_models/infinitetalk_single_fp8.safetensors",
        "quant_models/infinitetalk_single_fp8.json",
    } <= files
    assert "single/infinitetalk.safetensors" not in files
    assert ("google/umt5-xxl/*",) in files  # no DiT shards when the quantized file replaces them
    assert json.dumps(sorted(map(str, files)))  # plain strings only


# ------------------------------------------------------------------------------ GGUF roots


@pytest.fixture(scope="module")
def gguf_root(tmp_path_factory) -> Path:
    from model.weights.tiny import write_tiny_gguf

    root = write_tiny_root(tmp_path_factory.mktemp("weights") / "gguf", seed=1, multi=False)
    write_tiny_gguf(root, "Q4_K")
    write_tiny_gguf(root, "Q8_0")
    return root


Q4 = "gguf-Q4_K"


def test_gguf_root_passes_and_every_missing_file_is_named(gguf_root, tmp_path):
    assert verify_weights(gguf_root, quant=Q4) == []
    r = _clone(gguf_root, tmp_path / "r")
    dit, adapter = r / L.gguf_dit_file(Q4), r / L.dit_file(Q4)
    dit.unlink()
    adapter.unlink()
    (r / L.wan_dir / L.vae).unlink()
    problems = verify_weights(r, quant=Q4)
    assert problems == [f"{dit}: missing", f"{adapter}: missing", f"{r / L.wan_dir / L.vae}: missing"]
    assert f"{r / L.dit_file(Q4, multi=True)}: missing" in verify_weights(r, quant=Q4, multi=True)


def test_gguf_truncated_renamed_or_short_of_keys(gguf_root, tmp_path):
    from model.weights.gguf_write import write_gguf
    from model.weights.tiny import random_dit_state

    r = _clone(gguf_root, tmp_path / "r")
    dit, adapter = r / L.gguf_dit_file(Q4), r / L.dit_file(Q4)
    data = dit.read_bytes()
    _replace(dit, data[: len(data) * 2 // 3])
    (problem,) = verify_weights(r, quant=Q4)
    assert problem.startswith(f"{dit}: not a readable GGUF file")
    _replace(dit, (r / L.gguf_dit_file("gguf-Q8_0")).read_bytes())  # a Q8_0 file under the Q4_K name
    (problem,) = verify_weights(r, quant=Q4)
    assert (
        problem.startswith(f"{dit}: holds ") and "Q8_0" in problem and "no Q4_K as its name says" in problem
    )
    _replace(dit, data)
    from model.config import DIT_PRESETS
    from model.weights.gguf import Q4_K

    state = random_dit_state(DIT_PRESETS["tiny"], 0)
    audio = {k: v.numpy() for k, v in state.items() if k.startswith("audio_proj.")}  # no block audio keys
    adapter.unlink()
    write_gguf(adapter, audio, Q4_K)
    (problem,) = verify_weights(r, quant=Q4)
    assert (
        problem.startswith(f"{dit} + {adapter}: ") and "missing key(s): blocks.0.audio_cross_attn" in problem
    )


def test_weights_verify_cli_names_gguf_problems(gguf_root, tmp_path, capsys):
    from flows.cli import main

    r = _clone(gguf_root, tmp_path / "r")
    assert main(["weights", "verify", str(r), "--quant", Q4]) == 0
    assert "weights OK" in capsys.readouterr().out
    (r / L.dit_file(Q4)).unlink()
    assert main(["weights", "verify", str(r), "--quant", Q4]) == 1
    out = capsys.readouterr()
    assert f"{r / L.dit_file(Q4)}: missing" in out.out and "1 problem(s)" in out.err
    with pytest.raises(ValueError, match="not downloaded by dubflow"):
        download_weights(tmp_path / "dl", quant=Q4)
