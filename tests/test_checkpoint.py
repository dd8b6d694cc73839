"""DiT checkpoint loading: tiny official-layout writer -> loader round trip, and the error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import CheckpointError, check_keys, read_safetensors_index, safetensors_keys
from model.config import DIT_PRESETS
from model.weights.dit_loader import load_dit
from model.weights.tiny import is_audio_key, write_tiny_dit

CFG = DIT_PRESETS["tiny"]
STEM = "diffusion_pytorch_model"


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    wan, it = tmp_path / "wan", tmp_path / "infinitetalk.safetensors"
    state = write_tiny_dit(wan, it, CFG, seed=11, n_shards=3)
    return wan, it, state


def test_round_trip(tiny):
    wan, it, state = tiny
    shards = sorted(p.name for p in wan.glob(f"{STEM}-*.safetensors"))
    assert shards == [f"{STEM}-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert set(safetensors_keys(it)) == {k for k in state if is_audio_key(k)}
    model = load_dit(wan, it, dtype=torch.float32)
    loaded = model.state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert model.config == CFG
    assert not any(p.requires_grad for p in model.parameters())
    assert not any(p.is_meta for p in model.parameters())
    low = load_dit(wan, it, dtype=torch.bfloat16)
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}


def test_writer_is_deterministic(tmp_path):
    a = write_tiny_dit(tmp_path / "a", tmp_path / "a.safetensors", CFG, seed=5, n_shards=2)
    b = write_tiny_dit(tmp_path / "b", tmp_path / "b.safetensors", CFG, seed=5, n_shards=2)
    c = write_tiny_dit(tmp_path / "c", tmp_path / "c.safetensors", CFG, seed=6, n_shards=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["head.head.weight"], c["head.head.weight"])
    for name in (f"{STEM}-00001-of-00002.safetensors", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_shards_come_from_the_index(tmp_path):
    """Any shard count works, and a single un-indexed file too."""
    wan, it = tmp_path / "wan", tmp_path / "it.safetensors"
    state = write_tiny_dit(wan, it, CFG, seed=1, n_shards=5)
    assert len(set(read_safetensors_index(wan, STEM).values())) == 5
    load_dit(wan, it, dtype=torch.float32)
    merged = {}
    for shard in sorted(wan.glob(f"{STEM}-*.safetensors")):
        merged.update(load_file(shard))
        shard.unlink()
    (wan / f"{STEM}.safetensors.index.json").unlink()
    save_file(merged, str(wan / f"{STEM}.safetensors"))
    model = load_dit(wan, it, dtype=torch.float32)
    assert torch.equal(model.state_dict()["patch_embedding.weight"], state["patch_embedding.weight"])


def test_truncated_shard_names_the_file(tiny):
    wan, it, _ = tiny
    shard = wan / f"{STEM}-00002-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=shard.name):
        load_dit(wan, it)


def test_renamed_key_names_missing_and_unexpected(tiny):
    wan, it, _ = tiny
    audio = load_file(it)
    audio["blocks.1.norm_x.wieght"] = audio.pop("blocks.1.norm_x.weight")
    save_file(audio, str(it))
    with pytest.raises(CheckpointError) as err:
        load_dit(wan, it)
    msg = str(err.value)
    assert "missing key(s): blocks.1.norm_x.weight" in msg
    assert "unexpected key(s): blocks.1.norm_x.wieght" in msg
    assert it.name in msg


def test_missing_files_are_named(tiny):
    wan, it, _ = tiny
    with pytest.raises(CheckpointError, match="nope.safetensors: file not found"):
        load_dit(wan, it.with_name("nope.safetensors"))
    shard = wan / f"{STEM}-00003-of-00003.safetensors"
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shard file\\(s\\) not found: .*{shard.name}"):
        load_dit(wan, it)
    (wan / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: file not found"):
        load_dit(wan, it)


def test_wrong_shape_names_file_and_key(tiny):
    wan, it, _ = tiny
    index = json.loads((wan / f"{STEM}.safetensors.index.json").read_text())
    shard = wan / index["weight_map"]["head.head.weight"]
    tensors = load_file(shard)
    tensors["head.head.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=f"{shard.name}: head.head.weight has shape \\(3, 3\\)"):
        load_dit(wan, it)


def test_index_pointing_at_the_wrong_shard(tiny):
    wan, it, _ = tiny
    path = wan / f"{STEM}.safetensors.index.json"
    index = json.loads(path.read_text())
    first, last = f"{STEM}-00001-of-00003.safetensors", f"{STEM}-00003-of-00003.safetensors"
    key = next(k for k, v in index["weight_map"].items() if v == first)
    index["weight_map"][key] = last
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"{last}: missing tensor\\(s\\) listed for this file: {key}"):
        load_dit(wan, it)


def test_bad_config_is_named(tiny):
    wan, it, _ = tiny
    raw = json.loads((wan / "config.json").read_text())
    (wan / "config.json").write_text(json.dumps({**raw, "num_experts": 8}))
    with pytest.raises(CheckpointError, match="config.json: unknown WanModel config key.*num_experts"):
        load_dit(wan, it)


def test_check_keys_lists_everything():
    with pytest.raises(CheckpointError) as err:
        check_keys(["a", "b", "c"], ["a", "x", "y"], "src.safetensors")
    assert str(err.value) == ("src.safetensors: 2 missing key(s): b, c; 2 unexpected key(s): x, y")
