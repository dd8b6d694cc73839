"""Tiny-config tests of the InfiniteTalk DiT: shapes, batching, speaker routing, precision, compile, TeaCache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import model.network.dit_blocks as dit_blocks
from model.config import DIT_PRESETS, ConfigError, DiTConfig, dit_preset
from model.network.attention import attention, attention_backends
from model.network.dit import InfiniteTalkDiT
from model.network.teacache import TeaCache, TeaCacheConfig
from model.weights.tiny import random_dit_state
from tests.parity.common import rel_err

CFG = DIT_PRESETS["tiny"]
PARITY_DIT = Path(__file__).parent / "fixtures" / "parity" / "dit"


@pytest.fixture(scope="module")
def model() -> InfiniteTalkDiT:
    m = InfiniteTalkDiT(CFG)
    m.load_state_dict(random_dit_state(CFG, seed=7), strict=True)
    return m.eval().requires_grad_(False)


def make_inputs(batch: int, speakers: int, frames: int = 2, h: int = 4, w: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    f_pix = 1 + CFG.vae_scale * (frames - 1)
    masks = torch.zeros(3, h, w)
    masks[0, :, : w // 2] = 1  # person 1: left half, person 2: right half, background: none
    masks[1, :, w // 2 :] = 1
    return {
        "x": torch.randn(batch, 16, frames, h, w, generator=g),
        "t": torch.rand(batch, generator=g) * 1000,
        "context": torch.randn(batch, 10, CFG.text_dim, generator=g),
        "clip_fea": torch.randn(1, CFG.clip_tokens, CFG.clip_dim, generator=g),
        "y": torch.randn(1, 20, frames, h, w, generator=g),
        "audio": torch.randn(batch, speakers, f_pix, CFG.audio_window, 12, 768, generator=g),
        "ref_target_masks": masks,
    }


def run(model, inp, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(
            inp["x"],
            inp["t"],
            inp["context"],
            inp["clip_fea"],
            inp["y"],
            inp["audio"],
            inp["ref_target_masks"],
            **kw,
        )


def test_output_shape_dtype(model):
    inp = make_inputs(batch=2, speakers=1, frames=3, h=6, w=4)
    out = run(model, inp)
    assert out.shape == (2, 16, 3, 6, 4)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_batch_equals_per_sample(model):
    """Guidance branches batched in one call: per-sample t, context and audio, mixed speaker counts."""
    inp = make_inputs(batch=3, speakers=2)
    inp["audio"][2] = 0  # null-audio branch: one speaker of zeros, as the official uncond call
    counts = [2, 2, 1]
    batched = run(model, inp, audio_speakers=counts)
    for i, n in enumerate(counts):
        one = dict(inp)
        for key in ("x", "t", "context"):
            one[key] = inp[key][i : i + 1]
        one["audio"] = inp["audio"][i, :n]  # the official per-sample (S, F_pix, 5, 12, 768) layout
        single = run(model, one)
        assert rel_err(batched[i : i + 1], single) < 1e-5, f"sample {i}"
    # the speaker count matters: the zero-audio sample routed as two speakers gives another result
    two = run(model, inp, audio_speakers=[2, 2, 2])
    assert rel_err(two[2], batched[2]) > 1e-3
    assert rel_err(two[:2], batched[:2]) < 1e-6


def test_single_speaker_does_not_compute_reference_map(model, monkeypatch):
    calls = []
    real = dit_blocks.reference_attention_map

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dit_blocks, "reference_attention_map", counting)
    run(model, make_inputs(batch=1, speakers=1))
    assert calls == []
    run(model, make_inputs(batch=1, speakers=2))
    assert len(calls) == CFG.num_layers


def test_two_speakers_follow_the_masks(model):
    """Swapping the person masks moves the speakers: the output changes."""
    inp = make_inputs(batch=1, speakers=2)
    out = run(model, inp)
    swapped = dict(inp, ref_target_masks=inp["ref_target_masks"][[1, 0, 2]])
    assert rel_err(run(model, swapped), out) > 1e-3
    with pytest.raises(ValueError, match="ref_target_masks"):
        run(model, dict(inp, ref_target_masks=None))


def test_context_zero_padding_is_implicit(model):
    inp = make_inputs(batch=1, speakers=1)
    padded = dict(inp, context=torch.nn.functional.pad(inp["context"], (0, 0, 0, CFG.text_len - 10)))
    assert torch.equal(run(model, inp), run(model, padded))
    with pytest.raises(ValueError, match="text_len"):
        run(model, dict(inp, context=torch.zeros(1, CFG.text_len + 1, CFG.text_dim)))


def test_bf16_close_to_fp32(model):
    inp = make_inputs(batch=1, speakers=2)
    ref = run(model, inp)
    low = InfiniteTalkDiT(CFG)
    low.load_state_dict(model.state_dict())
    low = low.to(torch.bfloat16).eval()
    out = run(low, inp)
    assert out.dtype == torch.float32
    assert rel_err(out, ref) < 2e-2  # bf16 weights + activations; measured ~5e-3


def _block_args(model):
    captured = {}
    handle = model.blocks[0].register_forward_pre_hook(lambda mod, args: captured.setdefault("args", args))
    run(model, make_inputs(batch=2, speakers=2))
    handle.remove()
    return captured["args"]


def test_block_compiles_fullgraph(model):
    """One block (incl. two-speaker routing) traces without graph breaks."""
    torch._dynamo.reset()
    args = _block_args(model)
    compiled = torch.compile(model.blocks[0], fullgraph=True, backend="eager")
    with torch.no_grad():
        assert torch.equal(compiled(*args), model.blocks[0](*args))


@pytest.mark.slow
def test_block_compiles_inductor(model):
    torch._dynamo.reset()
    args = _block_args(model)
    compiled = torch.compile(model.blocks[0], fullgraph=True)
    with torch.no_grad():
        assert rel_err(compiled(*args), model.blocks[0](*args)) < 1e-5


def test_teacache_state_is_per_branch(model):
    """Decisions of a branch do not depend on how many other branches a step calls."""
    steps = 8
    with torch.no_grad():
        ts = torch.linspace(1000, 100, steps)
        e = model.time_embedding(dit_blocks.sinusoidal_embedding(ts, CFG.freq_dim))  # (steps, dim)
        e0 = model.time_projection(e).unflatten(1, (6, CFG.dim))  # (steps, 6, dim)

    def decisions(branches, config=TeaCacheConfig(threshold=0.5)):
        cache = TeaCache(config, sample_steps=steps)
        for i in range(steps):
            for b in branches:
                if cache.should_compute(b, e[i : i + 1], e0[i : i + 1]):
                    cache.store_residual(b, torch.zeros(1, 4, CFG.dim))
        return cache

    three = decisions(["cond", "drop_text", "uncond"])
    two = decisions(["cond", "uncond"])
    flags3 = {b: [d.computed for d in three.decisions if d.branch == b] for b in ("cond", "uncond")}
    flags2 = {b: [d.computed for d in two.decisions if d.branch == b] for b in ("cond", "uncond")}
    assert flags3 == flags2
    assert flags3["cond"][:5] == [True] * 5  # ret steps always compute
    assert not all(flags3["cond"]), "smooth tiny weights should allow reuse at threshold 0.5"
    two.reset()
    assert two.decisions == [] and not two._branches
    # without ret steps: only the first and the last step are forced (official cutoff = steps - 1)
    plain = decisions(["cond"], TeaCacheConfig(threshold=1e9, use_ret_steps=False))
    assert [d.computed for d in plain.decisions] == [True] + [False] * (steps - 2) + [True]


def test_teacache_reuse_adds_stored_residual(model):
    """A reused call with the same inputs as the computing call gives the same output."""
    inp = make_inputs(batch=1, speakers=1)
    cache = TeaCache(TeaCacheConfig(threshold=1e9), sample_steps=10)
    outs = [run(model, inp, teacache=cache) for _ in range(6)]
    assert [d.computed for d in cache.decisions] == [True] * 5 + [False]
    assert rel_err(outs[5], outs[4]) < 1e-6
    moved = run(model, dict(inp, x=inp["x"] + 1), teacache=cache)  # reused, not recomputed
    assert not cache.decisions[-1].computed
    assert rel_err(moved, run(model, dict(inp, x=inp["x"] + 1))) > 1e-4


def test_attention_backends_agree():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 7, 3, 16, generator=g) for _ in range(3))
    ref = attention(q, k, v, backend="reference")
    for name in ("sdpa", "sdpa_math"):
        assert rel_err(attention(q, k, v, backend=name), ref) < 1e-5
    lens = torch.tensor([7, 4])
    masked = attention(q, k, v, k_lens=lens)
    assert rel_err(masked[1:], attention(q[1:], k[1:, :4], v[1:, :4])) < 1e-5
    assert rel_err(masked[:1], ref[:1]) < 1e-5
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(q, k, v, backend="nope")
    assert {"sdpa", "sdpa_flash", "sdpa_cudnn", "reference"} <= set(attention_backends())


def test_config_from_official():
    raw = json.loads((PARITY_DIT / "weights" / "config.json").read_text())
    cfg = DiTConfig.from_official(raw)
    assert cfg == CFG
    assert DiTConfig.from_official({"_class_name": "WanModel"}).in_dim == 16  # official WanModel default
    with pytest.raises(ConfigError, match="unknown WanModel config key"):
        DiTConfig.from_official({**raw, "hidden_size": 3})
    with pytest.raises(ConfigError, match="window_size"):
        DiTConfig.from_official({**raw, "window_size": [4, 4]})
    big = dit_preset("infinitetalk-14b")
    assert (big.dim, big.num_heads, big.num_layers, big.ffn_dim, big.in_dim) == (5120, 40, 40, 13824, 36)
    assert abs(big.per_token_linear_params() - 14.05e9) / 14.05e9 < 2e-3
    assert sum(big.rope_axis_pairs) == big.head_dim // 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_parity_and_backends(monkeypatch):
    """Golden two-speaker call on CUDA: float32 at parity tolerance, bf16 loosely, all SDPA kernels."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # exact fp32 patch-embedding conv
    from model.weights.dit_loader import load_dit
    from tests.parity.common import load_tensors

    case = PARITY_DIT / "case_b_two_speakers"
    inp = load_tensors(case / "inputs.safetensors")
    golden = load_tensors(case / "outputs.safetensors")["out"].cuda()
    clip = load_tensors(PARITY_DIT / "shared_inputs" / "clip_fea.safetensors")["clip_fea"]
    weights = PARITY_DIT / "weights"

    def call(m):
        with torch.no_grad():
            return m(
                inp["x"][None].cuda(),
                inp["t"].cuda(),
                inp["context"][None].cuda(),
                clip.cuda(),
                inp["y"].cuda(),
                inp["audio"].cuda(),
                inp["ref_target_masks"].cuda(),
            )

    m32 = load_dit(weights, weights / "infinitetalk.safetensors", dtype=torch.float32, device="cuda")
    assert rel_err(call(m32), golden) < 1e-4
    m16 = load_dit(weights, weights / "infinitetalk.safetensors", dtype=torch.bfloat16, device="cuda")
    base = call(m16)
    assert rel_err(base, golden) < 5e-2
    for backend in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient"):
        m16.attn_backend = backend
        try:
            out = call(m16)
        except RuntimeError as exc:  # a kernel not built for this GPU / torch: report, don't hide
            pytest.fail(f"{backend}: {exc}")
        assert rel_err(out, golden) < 5e-2, backend
