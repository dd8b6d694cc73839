"""cuDNN frontend attention backends (`cudnn`, `cudnn_fp8`): errors against a float32 reference,
graph reuse, torch.compile, and the DiT on them. CUDA + nvidia-cudnn-frontend only, except the
error-path tests."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from model.network import cudnn_attention as ca
from model.network.attention import attention, attention_context

needs_cudnn = pytest.mark.skipif(not ca.available(), reason="needs CUDA and nvidia-cudnn-frontend")
needs_fp8 = pytest.mark.skipif(not ca.fp8_supported(), reason="needs a Hopper GPU and nvidia-cudnn-frontend")


def _qkv(b, lq, lk, h=4, d=128, *, sharp=1.5, k_offset=0.0, seed=0):
    """q, k, v (B, L, H, D) bf16; k gets a per-(head, channel) offset of size `k_offset`."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(n, mult, off):
        x = torch.randn(b, n, h, d, generator=g, device="cuda") * mult
        return (x + off * torch.randn(1, 1, h, d, generator=g, device="cuda")).to(torch.bfloat16)

    return rnd(lq, sharp, 0.0), rnd(lk, sharp, k_offset), rnd(lk, 1.0, 0.0)


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_cudnn_backend_outside_cuda_says_what_is_missing():
    if ca.available():
        pytest.skip("the frontend is usable here")
    q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    with pytest.raises((RuntimeError, ValueError), match="cudnn|cuDNN|CUDA"):
        attention(q, q, q, backend="cudnn")


@pytest.mark.cuda
@needs_cudnn
def test_cudnn_bf16_matches_reference_and_reuses_its_graph():
    q, k, v = _qkv(2, 1000, 1536)
    ref = attention(q, k, v, backend="reference").float()
    runner = ca.CudnnAttention()
    with attention_context("cudnn", runner):
        out = attention(q, k, v, backend="cudnn")
        again = attention(q, k, v, backend="cudnn")
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert out.is_contiguous()  # (B, L, H, D) in memory: the DiT's reshape to (B, L, dim) is free
    sdpa = attention(q, k, v, backend="sdpa").float()
    assert _rel(out, ref) < 2 * _rel(sdpa, ref) + 1e-3  # bf16 noise, like SDPA
    assert torch.equal(out, again)
    assert len(runner) == 1  # one graph for one shape


@pytest.mark.cuda
@needs_fp8
def test_cudnn_fp8_error_is_bounded_and_key_offsets_are_removed():
    """Long keys take the fp8 kernel (rel L2 ~6e-2..1e-1 on random data, see benchmarks/RESULTS.md).
    A large per-channel offset on k, as trained DiTs have, changes no softmax; the backend removes
    it before quantizing, so the error stays where it was, while quantizing k as it is degrades it."""
    lk = ca.FP8_MIN_KEYS + 512
    scale = 1 / math.sqrt(128)
    runner = ca.CudnnAttention()
    errs = {}
    with attention_context("cudnn_fp8", runner):
        for offset in (0.0, 20.0):
            q, k, v = _qkv(1, 512, lk, k_offset=offset)
            ref = attention(q, k, v, backend="reference")
            out = attention(q, k, v, backend="cudnn_fp8")
            assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
            errs[offset] = _rel(out, ref)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, L, D); k with the offset
        (q8, dq), (k8, dk), (v8, dv) = ca.quantize_fp8(qt), ca.quantize_fp8(kt), ca.quantize_fp8(vt)
        raw = ca.cudnn_sdpa(q8, k8, v8, scale, torch.stack([dq, dk, dv])).float() * dv
    unsmoothed = _rel(raw.transpose(1, 2), ref)
    assert errs[0.0] < 0.15, errs
    assert errs[20.0] < errs[0.0] * 1.3 + 0.01, errs
    assert unsmoothed > 2 * errs[20.0], (unsmoothed, errs)
    # short keys (cross-attention) stay on the bf16 graph: same result as the `cudnn` backend
    q, k, v = _qkv(1, 512, 257)
    with attention_context("cudnn_fp8", runner):
        short = attention(q, k, v, backend="cudnn_fp8")
        bf16 = attention(q, k, v, backend="cudnn")
    assert torch.equal(short, bf16)


@pytest.mark.cuda
@needs_fp8
def test_cudnn_fp8_compiles_as_one_graph():
    from model.runtime.compile import compiled_graph_count

    q, k, v = _qkv(1, 2048, ca.FP8_MIN_KEYS)
    runner = ca.CudnnAttention()

    def f(q, k, v):
        return attention(q * 1.0, k, v, backend="cudnn_fp8", scale=1 / math.sqrt(q.shape[-1])) + 1.0

    compiled = torch.compile(f, fullgraph=True)
    with attention_context("cudnn_fp8", runner):
        eager = f(q, k, v)
        g0 = compiled_graph_count()
        out = compiled(q, k, v)
        compiled(q, k, v)
    assert compiled_graph_count() - g0 == 1
    assert _rel(out, eager) < 2e-2  # same kernel; quantization fused differently


@pytest.mark.cuda
@needs_fp8
def test_tiny_dit_on_cudnn_backends_tracks_sdpa():
    from model.config import DIT_PRESETS
    from model.network.dit import InfiniteTalkDiT

    cfg = dataclasses.replace(DIT_PRESETS["tiny"], dim=512, ffn_dim=512)  # head dim 128, as the 14B
    torch.manual_seed(0)
    model = InfiniteTalkDiT(cfg).cuda().to(torch.bfloat16).eval()
    h, w, frames = 32, 32, 21  # 21 x 16 x 16 = 5376 tokens >= FP8_MIN_KEYS: self-attention in fp8
    g = torch.Generator(device="cuda").manual_seed(1)
    f_pix = 1 + cfg.vae_scale * (frames - 1)
    inp = dict(
        x=torch.randn(1, cfg.out_dim, frames, h, w, device="cuda", generator=g),
        t=torch.full((1,), 900.0, device="cuda"),
        context=torch.randn(1, cfg.text_len, cfg.text_dim, device="cuda", generator=g).bfloat16(),
        clip_fea=torch.randn(1, cfg.clip_tokens, cfg.clip_dim, device="cuda", generator=g).bfloat16(),
        y=torch.randn(1, cfg.in_dim - cfg.out_dim, frames, h, w, device="cuda", generator=g).bfloat16(),
        audio=torch.randn(
            1, f_pix, cfg.audio_window, cfg.audio_blocks, cfg.audio_channels, device="cuda", generator=g
        ).bfloat16(),
        ref_target_masks=torch.ones(3, h, w, device="cuda"),
    )
    outs = {}
    with torch.inference_mode():
        for backend in ("auto", "cudnn", "cudnn_fp8"):
            model.attn_backend = backend
            outs[backend] = model(**inp).float()
    assert _rel(outs["cudnn"], outs["auto"]) < 2e-2
    assert _rel(outs["cudnn_fp8"], outs["auto"]) < 0.2
    assert len(model.attn_graphs) >= 2  # bf16 and fp8 graphs kept by the model for the next call


@pytest.mark.cuda
@needs_cudnn
def test_autotune_times_the_plans_and_keeps_one():
    q, k, v = _qkv(1, 1024, 1024)
    tuned, plain = ca.CudnnAttention(autotune=True), ca.CudnnAttention()
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    out, ref = tuned(qt, kt, vt, 0.1), plain(qt, kt, vt, 0.1)
    (entry,) = tuned._graphs.values()
    assert entry.plan is not None and entry.plan_times  # every built plan was timed
    assert _rel(out, ref) < 1e-2
    assert torch.equal(tuned(qt, kt, vt, 0.1), out)  # the kept plan is reused
