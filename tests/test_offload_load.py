"""Loading the DiT with block offload (`LoadSpec.offload`): host-first build, LoRA merge and fp8
conversion on the run device, blocks behind `BlockOffload`; outputs equal a resident load's.
Model-level only (no Prefect / media imports), so the CUDA test runs on a bare GPU box."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from model.config import DIT_PRESETS
from model.network.dit_blocks import DiTBlock
from model.runtime.compile import compile_blocks
from model.runtime.offload import OffloadedBlock
from model.weights.fp8 import Fp8Linear
from model.weights.loading import LoadSpec, load_models
from model.weights.tiny import write_tiny_root

# ------------------------------------------------------------------------------ loading


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_tiny_root(tmp_path_factory.mktemp("weights") / "root", seed=3, quants=("int8",))


def _args(config, device: str = "cpu", seed: int = 0) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    c = config
    out = (
        torch.randn(1, c.out_dim, 2, 4, 4, generator=gen),
        torch.tensor([600.0]),
        torch.randn(1, 7, c.text_dim, generator=gen),
        torch.randn(1, 257, c.clip_dim, generator=gen),
        torch.randn(1, c.in_dim - c.out_dim, 2, 4, 4, generator=gen),
        torch.randn(1, 5, 5, c.audio_blocks, c.audio_channels, generator=gen),
    )
    return tuple(t.to(device) for t in out)


def _lora(path: Path, dim: int) -> Path:
    gen = torch.Generator().manual_seed(7)
    save_file(
        {
            "diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.randn(4, dim, generator=gen),
            "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.randn(dim, 4, generator=gen) * 0.01,
            "diffusion_model.blocks.1.ffn.0.diff_b": torch.randn(DIT_PRESETS["tiny"].ffn_dim, generator=gen),
        },
        str(path),
    )
    return path


def _assert_offloaded(dit) -> None:
    assert all(isinstance(b, OffloadedBlock) for b in dit.blocks)
    manager = dit.blocks[0]._offload[0]
    slots = {buf.untyped_storage().data_ptr() for buf in manager.device_buffers}
    for b in dit.blocks:  # no block keeps weights of its own: they live in pinned host buffers
        assert {p.untyped_storage().data_ptr() for p in b.block.parameters()} <= slots


@pytest.mark.parametrize(
    "changes",
    [{}, {"fp8_compute": True, "lora": True}, {"quant": "int8"}],
    ids=["float32", "fp8+lora", "int8"],
)
def test_load_with_offload_equals_resident_bit_for_bit(root, tmp_path, changes):
    changes = dict(changes)
    if changes.pop("lora", False):
        changes["loras"] = ((str(_lora(tmp_path / "l.safetensors", DIT_PRESETS["tiny"].dim)), 0.7),)
    resident_dit = load_models(root, LoadSpec.cpu_float32(components=("dit",), **changes)).dit
    spec = LoadSpec.cpu_float32(components=("dit",), offload=True, offload_reason="test", **changes)
    dit = load_models(root, spec).dit
    _assert_offloaded(dit)
    if changes.get("fp8_compute"):
        assert any(isinstance(m, Fp8Linear) for m in dit.blocks.modules())
    with torch.no_grad():
        for seed in range(2):  # the second call wraps the prefetch around to block 0
            args = _args(dit.config, seed=seed)
            assert torch.equal(dit(*args), resident_dit(*args))


def test_offload_with_compile_and_the_decision_logged_once(root, caplog):
    caplog.set_level(logging.INFO, logger="model.weights.loading")
    spec = LoadSpec.cpu_float32(components=("dit",), offload=True, compile=True, offload_reason="forced")
    dit = load_models(root, spec).dit
    lines = [
        r.getMessage() for r in caplog.records if r.name == "model.weights.loading" and "offload" in r.message
    ]
    assert lines == ["DiT block offload on (forced)"]
    inner = [m for m in dit.modules() if isinstance(m, DiTBlock)]
    assert len(inner) == dit.config.num_layers
    assert all(getattr(b, "_compiled_call_impl", None) is not None for b in inner)  # compiled inside wrappers
    compile_blocks(dit, backend="eager")  # a real (cheap) compile through the wrappers still matches
    reference = load_models(root, LoadSpec.cpu_float32(components=("dit",))).dit
    args = _args(dit.config, seed=2)
    with torch.no_grad():
        assert torch.equal(dit(*args), reference(*args))
    torch._dynamo.reset()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_offloaded_load_matches_resident(root, tmp_path):
    """On the device: LoRA merged and fp8 quantized on the GPU for a host-resident DiT, blocks streamed
    on the side stream from pinned memory; outputs equal the resident load's."""
    lora = ((str(_lora(tmp_path / "l.safetensors", DIT_PRESETS["tiny"].dim)), 0.7),)
    base = {"device": "cuda", "components": ("dit",), "dtype": torch.bfloat16, "loras": lora}
    for fp8 in (False, True):
        resident_dit = load_models(root, LoadSpec(**base, fp8_compute=fp8)).dit
        dit = load_models(root, LoadSpec(**base, fp8_compute=fp8, offload=True)).dit
        _assert_offloaded(dit)
        manager = dit.blocks[0]._offload[0]
        assert manager.copy_stream is not None and manager.host[0].is_pinned()
        assert dit.patch_embedding.weight.is_cuda and dit.head.head.weight.is_cuda
        with torch.no_grad():
            for seed in range(2):
                args = _args(dit.config, device="cuda", seed=seed)
                assert torch.equal(dit(*args), resident_dit(*args)), fp8


def test_fp8_offload_quantizes_block_by_block_and_drops_the_float_layers(root, monkeypatch):
    """fp8 + offload: each block is quantized right before it is pinned (prepare runs block i, then its
    pinning, then block i+1), and no converted float Linear stays alive (the old list of targets kept
    every one moved to the device: the 24 GiB OOM); outputs equal the resident fp8 load's bit for bit."""
    import gc
    import weakref

    import model.runtime.offload as offload_mod

    events: list[tuple[str, int]] = []
    floats: list[weakref.ref] = []
    real_init = offload_mod.BlockOffload.__init__

    def spy_init(self, model, device, *, slots=2, prepare=None):
        assert prepare is not None  # fp8 with offload goes through the per-block path
        for block in model.blocks:
            floats.extend(weakref.ref(m) for m in block.modules() if type(m) is torch.nn.Linear)
        calls = iter(range(len(model.blocks)))

        def prepare_in_order(b):
            i = next(calls)
            assert all(e != ("quantized", i) for e in events)
            prepare(b)
            events.append(("quantized", i))

        real_init(self, model, device, slots=slots, prepare=prepare_in_order)

    monkeypatch.setattr(offload_mod.BlockOffload, "__init__", spy_init)
    spec = LoadSpec.cpu_float32(components=("dit",), offload=True, fp8_compute=True)
    dit = load_models(root, spec).dit
    gc.collect()
    assert events == [("quantized", i) for i in range(dit.config.num_layers)]
    assert floats and all(ref() is None for ref in floats)  # every float block Linear was freed
    inner = [b.block for b in dit.blocks]
    assert all(not any(type(m) is torch.nn.Linear for m in b.modules()) for b in inner)
    resident_dit = load_models(root, LoadSpec.cpu_float32(components=("dit",), fp8_compute=True)).dit
    with torch.no_grad():
        for seed in range(2):
            args = _args(dit.config, seed=seed)
            assert torch.equal(dit(*args), resident_dit(*args))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fp8_loads_never_hold_the_float_dit_on_the_device(root):
    """Resident fp8 and fp8 + offload: the device's peak during the load stays below the float DiT's
    bytes (the conversion sees one float layer on the device at a time)."""
    base = {"device": "cuda", "components": ("dit",), "dtype": torch.bfloat16, "fp8_compute": True}
    floats = load_models(root, LoadSpec(device="cuda", components=("dit",), dtype=torch.bfloat16)).dit
    float_bytes = sum(p.numel() * p.element_size() for p in floats.blocks.parameters())
    del floats
    for offload in (False, True):
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        dit = load_models(root, LoadSpec(**base, offload=offload)).dit
        assert torch.cuda.max_memory_allocated() - start < float_bytes, offload
        del dit
