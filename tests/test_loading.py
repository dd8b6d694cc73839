"""`load_models` on a complete tiny weights root (official layout), its failure modes, and LoRA merging."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpoint import CheckpointError
from model.weights.layout import WeightsLayout
from model.weights.loading import LoadSpec, load_models
from model.weights.lora import LoraError, merge_lora
from model.weights.quant import DequantLinear
from model.weights.tiny import write_tiny_root, write_tiny_t5

L = WeightsLayout()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_tiny_root(tmp_path_factory.mktemp("weights") / "root", seed=0, quants=("fp8", "int8"))


@pytest.fixture(scope="module")
def models(root):
    return load_models(root, LoadSpec.cpu_float32())


def _clone(root: Path, dst: Path) -> Path:
    """Cheap copy (hard links); corrupt only files replaced via `_replace`, never in place."""
    shutil.copytree(root, dst, copy_function=os.link)
    return dst


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _shard(root: Path) -> Path:
    return sorted((root / L.wan_dir).glob("diffusion_pytorch_model-*.safetensors"))[0]


def test_tiny_root_loads_every_component_and_runs_end_to_end(models):
    m = models
    assert {
        m.dit is not None,
        m.vae is not None,
        m.t5 is not None,
        m.clip is not None,
        m.audio is not None,
    } == {True}
    c = m.dit.config
    context = m.t5.encode(["a man is talking to the camera"])[0]  # (L, text_dim)
    image = torch.rand(1, 3, 1, 32, 32) * 2 - 1
    clip_fea = m.clip.encode(image)  # (1, 257, 1280)
    wave = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    emb = m.audio.embed(wave, fps=25, n_frames=5)  # (5, 12, 768)
    idx = (torch.arange(5)[:, None] + torch.arange(-2, 3)).clamp(0, 4)
    audio = emb[idx][None]  # (1, 5 frames, 5 window, 12, 768)
    ref = m.vae.encode(image)  # (1, 16, 1, 4, 4)
    y = torch.cat([torch.ones(1, 4, 2, 4, 4), torch.cat([ref, torch.zeros_like(ref)], dim=2)], dim=1)
    x = torch.randn(1, c.out_dim, 2, 4, 4)
    with torch.no_grad():
        out = m.dit(x, torch.tensor([500.0]), context[None], clip_fea, y, audio)
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert m.vae.decode(out).shape == (1, 3, 5, 32, 32)


def test_components_subset_and_devices(root):
    m = load_models(root, LoadSpec.cpu_float32(components=("vae", "audio")))
    assert m.dit is None and m.t5 is None and m.clip is None
    assert m.vae is not None and m.audio is not None


def test_quantized_dit_from_root(root, models):
    m = load_models(root, LoadSpec.cpu_float32(quant="int8", components=("dit",)))
    assert sum(isinstance(x, DequantLinear) for x in m.dit.modules()) == sum(
        isinstance(x, torch.nn.Linear) for x in models.dit.modules()
    )
    gen = torch.Generator().manual_seed(0)
    c = m.dit.config
    args = (
        torch.randn(1, c.out_dim, 1, 4, 4, generator=gen),
        torch.tensor([900.0]),
        torch.randn(1, 7, c.text_dim, generator=gen),
        torch.randn(1, 257, c.clip_dim, generator=gen),
        torch.randn(1, c.in_dim - c.out_dim, 1, 4, 4, generator=gen),
        torch.randn(1, 1, 5, c.audio_blocks, c.audio_channels, generator=gen),
    )
    with torch.no_grad():
        q, f = m.dit(*args), models.dit(*args)
    err = float((q - f).abs().max() / f.abs().max())
    assert 0 < err < 5e-2  # int8 weights: close to, not equal to, the float model


def test_fp8_attention_is_refused_where_it_cannot_run(root):
    """`fp8_attention` on a CPU (or without the cuDNN frontend) fails at load with what is missing."""
    with pytest.raises(ValueError, match="fp8_attention needs a Hopper"):
        load_models(root, LoadSpec.cpu_float32(components=("dit",), fp8_attention=True))


def test_fp8_compute_and_compile_through_load_spec(root, models):
    """`fp8_compute` swaps the block linears for fp8 GEMMs (CPU: exact emulation) with bounded drift;
    `compile` marks every block for regional compilation (compiled lazily on first call)."""
    from model.weights.fp8 import Fp8Linear

    m = load_models(root, LoadSpec.cpu_float32(components=("dit",), fp8_compute=True, compile=True))
    n_block_linears = sum(isinstance(x, torch.nn.Linear) for x in models.dit.blocks.modules())
    assert sum(isinstance(x, Fp8Linear) for x in m.dit.blocks.modules()) == n_block_linears > 0
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in m.dit.blocks)
    gen = torch.Generator().manual_seed(1)
    c = m.dit.config
    args = (
        torch.randn(1, c.out_dim, 1, 4, 4, generator=gen),
        torch.tensor([700.0]),
        torch.randn(1, 7, c.text_dim, generator=gen),
        torch.randn(1, 257, c.clip_dim, generator=gen),
        torch.randn(1, c.in_dim - c.out_dim, 1, 4, 4, generator=gen),
        torch.randn(1, 1, 5, c.audio_blocks, c.audio_channels, generator=gen),
    )
    for b in m.dit.blocks:  # run eagerly here: compiling on CPU costs minutes (tested in test_speed_paths)
        b._compiled_call_impl = None
    with torch.no_grad():
        q, f = m.dit(*args), models.dit(*args)
    err = float((q - f).abs().max() / f.abs().max())
    assert 0 < err < 8e-2  # e4m3 weights and activations: close to, not equal to, float32


def test_truncated_shard_is_named(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    shard = _shard(r)
    _replace(shard, shard.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=shard.name):
        load_models(r, LoadSpec.cpu_float32(components=("dit",)))


def test_renamed_key_is_named(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    shard = _shard(r)
    tensors = load_file(str(shard))
    key = sorted(tensors)[0]
    tensors[key + "_renamed"] = tensors.pop(key)
    shard.unlink()
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=rf"{shard.name}.*{key}"):
        load_models(r, LoadSpec.cpu_float32(components=("dit",)))


@pytest.mark.parametrize(
    "rel",
    [
        f"{L.wan_dir}/{L.vae}",
        f"{L.wan_dir}/{L.t5}",
        f"{L.wan_dir}/{L.clip}",
        f"{L.wav2vec_dir}/model.safetensors",
        L.infinitetalk,
    ],
)
def test_missing_file_is_named(root, tmp_path, rel):
    r = _clone(root, tmp_path / "r")
    (r / rel).unlink()
    with pytest.raises(CheckpointError, match=Path(rel).name):
        load_models(r, LoadSpec.cpu_float32())


def test_wrong_shape_names_file_and_key(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    t5 = r / L.wan_dir / L.t5
    state = torch.load(t5, weights_only=True)
    state["blocks.1.norm2.weight"] = torch.ones(63)
    t5.unlink()
    torch.save(state, t5)
    with pytest.raises(CheckpointError, match=r"models_t5.*blocks\.1\.norm2\.weight has shape \(63,\)"):
        load_models(r, LoadSpec.cpu_float32(components=("t5",)))


def test_config_mismatch_is_named(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    config = r / L.wan_dir / "config.json"
    raw = json.loads(config.read_text())
    raw["num_layers"] += 1
    _replace(config, json.dumps(raw).encode())
    with pytest.raises(CheckpointError, match=r"blocks\.2\."):
        load_models(r, LoadSpec.cpu_float32(components=("dit",)))


def test_encoder_that_does_not_fit_the_dit_is_named(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    t5 = r / L.wan_dir / L.t5
    t5.unlink()
    write_tiny_t5(t5, seed=9, dim=32)  # a valid umT5 file, but the DiT expects text_dim 64
    with pytest.raises(CheckpointError, match=r"models_t5.*text_dim 64"):
        load_models(r, LoadSpec.cpu_float32(components=("dit", "t5")))


def test_quantized_file_with_missing_key_fails_loudly(root, tmp_path):
    r = _clone(root, tmp_path / "r")
    qfile = r / L.quant_file("int8")
    tensors = load_file(str(qfile))
    gone = next(k for k in sorted(tensors) if k.endswith("weight._scale"))
    del tensors[gone]
    qfile.unlink()
    save_file(tensors, str(qfile))
    with pytest.raises(CheckpointError, match=rf"{qfile.name}.*{gone}"):
        load_models(r, LoadSpec.cpu_float32(quant="int8", components=("dit",)))


# ---------------------------------------------------------------------------------------------
# LoRA


def test_lora_merge_equals_explicit_math(root, tmp_path):
    gen = torch.Generator().manual_seed(1)
    dit = load_models(root, LoadSpec.cpu_float32(components=("dit",))).dit
    before = {k: v.clone() for k, v in dit.state_dict().items()}
    q, ffn, conv = "blocks.0.self_attn.q", "blocks.1.ffn.0", "patch_embedding"
    down, up = torch.randn(4, 128, generator=gen), torch.randn(128, 4, generator=gen)
    down2, up2 = torch.randn(2, 128, generator=gen), torch.randn(256, 2, generator=gen)
    cdown = torch.randn(3, *before[f"{conv}.weight"].shape[1:], generator=gen)
    cup = torch.randn(before[f"{conv}.weight"].shape[0], 3, 1, 1, 1, generator=gen)
    diff_b = torch.randn(128, generator=gen)
    norm_diff = torch.randn(128, generator=gen)
    lora = {
        f"diffusion_model.{q}.lora_down.weight": down,
        f"diffusion_model.{q}.lora_up.weight": up,
        f"diffusion_model.{q}.alpha": torch.tensor(8.0),  # alpha / rank = 2
        f"diffusion_model.{ffn}.lora_A.weight": down2,
        f"diffusion_model.{ffn}.lora_B.weight": up2,
        f"diffusion_model.{conv}.lora_down.weight": cdown,
        f"diffusion_model.{conv}.lora_up.weight": cup,
        f"diffusion_model.{q}.diff_b": diff_b,
        "diffusion_model.blocks.0.norm3.diff": norm_diff,
    }
    save_file(lora, str(tmp_path / "lora.safetensors"))
    assert merge_lora(dit, tmp_path / "lora.safetensors", scale=0.5) == 5
    after = dit.state_dict()
    torch.testing.assert_close(after[f"{q}.weight"], before[f"{q}.weight"] + 0.5 * 2.0 * up @ down)
    torch.testing.assert_close(after[f"{q}.bias"], before[f"{q}.bias"] + 0.5 * diff_b)
    torch.testing.assert_close(after[f"{ffn}.weight"], before[f"{ffn}.weight"] + 0.5 * up2 @ down2)
    conv_delta = (cup.flatten(1) @ cdown.flatten(1)).reshape(before[f"{conv}.weight"].shape)
    torch.testing.assert_close(after[f"{conv}.weight"], before[f"{conv}.weight"] + 0.5 * conv_delta)
    torch.testing.assert_close(
        after["blocks.0.norm3.weight"], before["blocks.0.norm3.weight"] + 0.5 * norm_diff
    )
    untouched = [k for k in before if not torch.equal(before[k], after[k])]
    assert sorted(untouched) == sorted(
        [f"{q}.weight", f"{q}.bias", f"{ffn}.weight", f"{conv}.weight", "blocks.0.norm3.weight"]
    )


def test_lora_through_load_spec(root, tmp_path):
    lora = {
        "diffusion_model.head.head.diff_b": torch.full((64,), 0.25),
    }
    save_file(lora, str(tmp_path / "l.safetensors"))
    base = load_models(root, LoadSpec.cpu_float32(components=("dit",))).dit
    merged = load_models(
        root, LoadSpec.cpu_float32(components=("dit",), loras=((str(tmp_path / "l.safetensors"), 2.0),))
    ).dit
    torch.testing.assert_close(merged.head.head.bias, base.head.head.bias + 0.5)
    with pytest.raises(ValueError, match="quantized"):
        LoadSpec(quant="int8", loras=((str(tmp_path / "l.safetensors"), 1.0),))


def test_lora_errors_name_keys(root, tmp_path):
    dit = load_models(root, LoadSpec.cpu_float32(components=("dit",))).dit
    reference = {k: v.clone() for k, v in dit.state_dict().items()}
    cases = {
        "unknown": ({"diffusion_model.blocks.0.self_attn.q.lora_mid.weight": torch.zeros(1)}, "lora_mid"),
        "noprefix": ({"blocks.0.self_attn.q.diff": torch.zeros(128, 128)}, "blocks.0.self_attn.q.diff"),
        "unpaired": (
            {"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(2, 128)},
            "incomplete",
        ),
        "target": (
            {"diffusion_model.blocks.9.self_attn.q.diff": torch.zeros(128, 128)},
            "blocks.9.self_attn.q",
        ),
        "shape": (
            {"diffusion_model.blocks.0.self_attn.q.diff": torch.zeros(64, 128)},
            "blocks.0.self_attn.q.weight",
        ),
    }
    for name, (tensors, pattern) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        with pytest.raises(LoraError, match=pattern):
            merge_lora(dit, path)
    for k, v in dit.state_dict().items():  # a failed merge changes nothing
        assert torch.equal(v, reference[k]), k


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_official_dtypes_and_quantized(root):
    """GPU run with the official precisions (DiT bf16, VAE fp32, CLIP fp16, umT5 on the CPU) and both
    quantized DiTs: everything loads on the device and one denoising call is finite and consistent."""
    spec = LoadSpec(device="cuda", t5_cpu=True, t5_dtype=torch.float32)
    m = load_models(root, spec)
    assert next(m.dit.parameters()).is_cuda and next(m.t5.model.parameters()).device.type == "cpu"
    c = m.dit.config
    context = m.t5.encode(["a man is talking"], device="cuda")[0]
    image = torch.rand(1, 3, 1, 32, 32, device="cuda") * 2 - 1
    clip_fea = m.clip.encode(image)
    emb = m.audio.embed(np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1, n_frames=5)
    audio = emb[(torch.arange(5)[:, None] + torch.arange(-2, 3)).clamp(0, 4)][None].cuda()
    ref = m.vae.encode(image)
    y = torch.cat([torch.ones(1, 4, 2, 4, 4, device="cuda"), torch.cat([ref, torch.zeros_like(ref)], 2)], 1)
    x = torch.randn(1, c.out_dim, 2, 4, 4, device="cuda")
    t = torch.tensor([500.0], device="cuda")
    with torch.no_grad():
        base = m.dit(x, t, context[None], clip_fea, y, audio)
    assert torch.isfinite(base).all()
    for quant in ("fp8", "int8"):
        q = load_models(root, LoadSpec(device="cuda", quant=quant, components=("dit",))).dit
        with torch.no_grad():
            out = q(x, t, context[None], clip_fea, y, audio)
        assert torch.isfinite(out).all()
        assert float((out - base).abs().max() / base.abs().max()) < 0.1, quant
