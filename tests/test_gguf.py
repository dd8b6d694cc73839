"""GGUF DiT weights (`model.weights.gguf`): the torch dequantizers equal the `gguf` package's numpy ones bit for
bit, tiny GGUF files written with the `gguf` writer in the published Wan layout load through
`load_models` (strict keys, types as published) with per-type tolerances against the float model,
block offload streams them unchanged (mixed-type files too), and damaged files fail naming the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from model.checkpoint import CheckpointError
from model.config import DIT_PRESETS
from model.runtime.offload import OffloadedBlock
from model.weights.dit_loader import load_dit
from model.weights.gguf import BF16, F32, Q4_K, Q5_K, Q6_K, Q8_0, GGUFLinear, dequantize, read_gguf
from model.weights.gguf_write import quantize, random_quantized, write_gguf
from model.weights.layout import WeightsLayout
from model.weights.loading import LoadSpec, load_models
from model.weights.tiny import write_tiny_dit, write_tiny_gguf
from tests.test_offload_load import _args

LAYOUT = WeightsLayout()
# dim / ffn_dim multiples of 256, so every block Linear's rows are whole K-quant super-blocks
CONFIG = dataclasses.replace(DIT_PRESETS["tiny"], dim=256, ffn_dim=512, num_heads=4)
# max |gguf - float| / max |float| of the DiT output on random inputs (tiny model, seeds 0-1), measured:
# Q8_0 3.4e-3 / 5.5e-3, Q6_K 1.1e-2 / 1.7e-2, Q5_K 3.5e-2 / 4.9e-2, Q4_K 7.5e-2 / 8.1e-2,
# F16 (F16 head / embeddings) 2.1e-4 / 3.8e-4, BF16 2.2e-3 / 3.1e-3; the tolerances are ~2x those
TOLERANCE = {"Q8_0": 1.2e-2, "Q6_K": 4e-2, "Q5_K": 1e-1, "Q4_K": 1.6e-1, "F16": 1e-3, "BF16": 7e-3}


@pytest.mark.parametrize("qtype", [Q8_0, Q4_K, Q5_K, Q6_K])
def test_torch_dequantization_equals_the_gguf_package(qtype):
    rng = np.random.default_rng(qtype)
    x = (rng.standard_normal((32, 512)) * rng.uniform(0.01, 2.0, (32, 1))).astype(np.float32)
    for raw in (quantize(x, qtype), random_quantized((32, 512), qtype, 0.05, rng)):
        reference = quants.dequantize(raw, GGMLQuantizationType(qtype))
        mine = dequantize(torch.from_numpy(raw), qtype, (32, 512), torch.float32).numpy()
        assert np.array_equal(mine, reference)
    # this project's writer: round-to-nearest per sub-block; relative RMS error per type
    back = quants.dequantize(quantize(x, qtype), GGMLQuantizationType(qtype))
    rel = np.sqrt(((back - x) ** 2).mean(axis=1)) / x.std(axis=1)
    assert rel.max() < {Q8_0: 0.01, Q6_K: 0.03, Q5_K: 0.06, Q4_K: 0.12}[qtype]
    random = quants.dequantize(random_quantized((64, 512), qtype, 0.05, rng), GGMLQuantizationType(qtype))
    assert 0.04 < random.std() < 0.06  # random real-size roots get weights of the asked scale


@pytest.fixture(scope="module")
def float_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf") / "root"
    write_tiny_dit(root / LAYOUT.wan_dir, root / LAYOUT.infinitetalk, CONFIG, seed=5)
    return root


def _gguf_dit(root: Path, tag: str, **changes):
    spec = LoadSpec.cpu_float32(components=("dit",), quant=f"gguf-{tag}", **changes)
    return load_models(root, spec).dit


@pytest.mark.parametrize("tag", ["Q8_0", "Q6_K", "Q5_K", "Q4_K", "F16", "BF16"])
def test_tiny_gguf_dit_matches_the_float_model(float_root, tag):
    source = "F16" if tag == "F16" else "BF16"  # the precision the unquantized tensors keep
    write_tiny_gguf(float_root, tag, float_type=source)
    _, tensors = read_gguf(float_root / LAYOUT.gguf_dit_file(f"gguf-{tag}"))
    kinds = {k: t.qtype for k, t in tensors.items()}
    # the published layout: 5-D F32 patch embedding, F32 modulation and 1-D tensors, head at source precision
    assert tensors["patch_embedding.weight"].shape == (CONFIG.dim, CONFIG.in_dim, 1, 2, 2)
    assert kinds["patch_embedding.weight"] == F32 and kinds["blocks.0.modulation"] == F32
    assert kinds["blocks.0.norm3.bias"] == F32 and kinds["head.head.weight"] == (
        1 if source == "F16" else BF16
    )
    want = {"Q8_0": Q8_0, "Q6_K": Q6_K, "Q5_K": Q5_K, "Q4_K": Q4_K, "F16": 1, "BF16": BF16}[tag]
    assert kinds["blocks.1.ffn.2.weight"] == want and kinds["blocks.0.self_attn.q.weight"] == want
    reference = load_dit(float_root / LAYOUT.wan_dir, float_root / LAYOUT.infinitetalk, dtype=torch.float32)
    dit = _gguf_dit(float_root, tag)
    linears = [m for m in dit.modules() if isinstance(m, GGUFLinear)]
    assert bool(linears) is (tag not in ("F16", "BF16"))
    with torch.no_grad():
        for seed in range(2):
            args = _args(CONFIG, seed=seed)
            ref = reference(*args)
            err = ((dit(*args) - ref).abs().max() / ref.abs().max()).item()
            assert err < TOLERANCE[tag], (tag, err)
            assert err > 0  # the weights really went through the file's precision


def test_gguf_with_offload_equals_resident_and_mixed_types_stream(float_root):
    """Block offload moves the quantized bytes (dequantized in the slot), bit-equal to a resident load;
    a Q4_K_M-style file mixing Q4_K and Q6_K blocks (per-block layouts) streams the same way."""
    write_tiny_gguf(float_root, "Q4_K")
    resident = _gguf_dit(float_root, "Q4_K")
    dit = _gguf_dit(float_root, "Q4_K", offload=True, offload_reason="test")
    assert all(isinstance(b, OffloadedBlock) for b in dit.blocks)
    assert any(isinstance(m, GGUFLinear) for m in dit.blocks[0].block.modules())
    args = _args(CONFIG, seed=3)
    with torch.no_grad():
        assert torch.equal(dit(*args), resident(*args))
        assert torch.equal(dit(*args), resident(*args))  # the second call wraps the prefetch around
    # mixed: block 1's ffn.2 in Q6_K (as llama.cpp's _M mixes do), written under the Q4_K_M tag
    path = float_root / LAYOUT.gguf_dit_file("gguf-Q4_K")
    _, tensors = read_gguf(path)
    state = {k: dequantize_any(t) for k, t in tensors.items()}
    special = {"blocks.1.ffn.2.weight": (Q6_K, quantize(state.pop("blocks.1.ffn.2.weight"), Q6_K))}
    write_gguf(float_root / LAYOUT.gguf_dit_file("gguf-Q4_K_M"), state, Q4_K, raw=special)
    adapter = read_gguf(float_root / LAYOUT.dit_file("gguf-Q4_K"))[1]
    write_gguf(
        float_root / LAYOUT.dit_file("gguf-Q4_K_M"), {k: dequantize_any(t) for k, t in adapter.items()}, Q4_K
    )
    mixed_resident = _gguf_dit(float_root, "Q4_K_M")
    mixed = _gguf_dit(float_root, "Q4_K_M", offload=True)
    assert mixed.blocks[1].block.ffn[2].qtype == Q6_K and mixed.blocks[0].block.ffn[2].qtype == Q4_K
    with torch.no_grad():
        assert torch.equal(mixed(*args), mixed_resident(*args))


def dequantize_any(t) -> np.ndarray:
    """A read tensor back to float32 in its torch shape (any type)."""
    return (
        quants.dequantize(np.asarray(t.data), GGMLQuantizationType(t.qtype))
        .reshape(t.shape)
        .astype(np.float32)
    )


def test_damaged_or_foreign_gguf_files_fail_naming_the_file(float_root, tmp_path):
    write_tiny_gguf(float_root, "Q8_0")
    dit_file = float_root / LAYOUT.gguf_dit_file("gguf-Q8_0")
    _, tensors = read_gguf(dit_file)
    state = {k: dequantize_any(t) for k, t in tensors.items()}
    # a missing tensor: the error names the files and the key
    broken = dict(state)
    broken.pop("blocks.0.self_attn.k.weight")
    write_gguf(dit_file, broken, Q8_0)
    with pytest.raises(CheckpointError, match=r"missing key\(s\): blocks\.0\.self_attn\.k\.weight") as err:
        _gguf_dit(float_root, "Q8_0")
    assert str(dit_file) in str(err.value)
    # a truncated file
    write_gguf(dit_file, state, Q8_0)
    data = dit_file.read_bytes()
    dit_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable GGUF file") as err:
        _gguf_dit(float_root, "Q8_0")
    assert str(dit_file) in str(err.value)
    # another architecture
    from gguf import GGUFWriter

    writer = GGUFWriter(str(dit_file), arch="flux")
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match="architecture 'flux', expected 'wan'"):
        _gguf_dit(float_root, "Q8_0")
    # no adapter file
    write_gguf(dit_file, state, Q8_0)
    (float_root / LAYOUT.dit_file("gguf-Q8_0")).unlink()
    with pytest.raises(CheckpointError, match="file not found"):
        _gguf_dit(float_root, "Q8_0")
    with pytest.raises(ValueError, match="LoRAs cannot be merged"):
        LoadSpec.cpu_float32(quant="gguf-Q8_0", loras=(("x.safetensors", 1.0),))


def test_gguf_linear_compiles_with_inductor_and_fp8_is_off_for_gguf():
    """The per-call dequantization traces into one graph (inductor, as `compile_blocks` compiles a block):
    same output as eager. The fp8 GEMMs stay off for a GGUF DiT (they would re-expand its blocks)."""
    from tasks.config.pipeline import load_config
    from tasks.infinitetalk.options import fp8_flags
    from tasks.infinitetalk.settings import section_config

    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    lin = GGUFLinear(torch.from_numpy(quantize(x, Q4_K)), Q4_K, 256, torch.zeros(64), torch.float32)
    inp = torch.randn(3, 256)
    compiled = torch.compile(lin, backend="inductor", fullgraph=True)
    assert torch.equal(compiled(inp), lin(inp))
    torch._dynamo.reset()
    opts = dataclasses.replace(section_config(load_config()), mode="infinitetalk-480", fp8_compute=True)
    assert fp8_flags(dataclasses.replace(opts, quant="gguf-Q4_K"), "cuda:0")[0] is False
    assert fp8_flags(opts, "cuda:0")[0] is True


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gguf_dequantizes_on_the_device_and_streams(float_root):
    """On the GPU: the quantized bytes live on the device (or its offload slots) and dequantize there; the
    bf16 outputs agree with the CPU float32 load within bf16 rounding, offloaded equal resident."""
    write_tiny_gguf(float_root, "Q4_K")
    base = {"device": "cuda", "components": ("dit",), "dtype": torch.bfloat16, "quant": "gguf-Q4_K"}
    resident = load_models(float_root, LoadSpec(**base)).dit
    assert all(m.qweight.is_cuda for m in resident.modules() if isinstance(m, GGUFLinear))
    offloaded = load_models(float_root, LoadSpec(**base, offload=True)).dit
    cpu = _gguf_dit(float_root, "Q4_K")
    args = _args(CONFIG, seed=1)
    with torch.no_grad():
        ref = cpu(*args)
        out = resident(*[a.cuda() for a in args]).float().cpu()
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 5e-2
        assert torch.equal(offloaded(*[a.cuda() for a in args]), resident(*[a.cuda() for a in args]))
