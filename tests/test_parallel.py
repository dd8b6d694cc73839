"""Sequence-parallel DiT on CPU: gloo ranks spawned once by a ShotWorker, compared with one process.

The ranks load the tiny parity DiT, receive job records from rank 0 and run forwards (1 and 2
speakers, frame counts that do not divide, fewer frames than ranks, TeaCache) or a whole streamed
shot; the parent runs the same jobs in-process and compares. Every rank must also end with the same
output as rank 0.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from model.network.parallel import (
    FAULT_ENV,
    LOCAL_SHARD,
    RankZeroCodec,
    SequenceParallel,
    UlyssesShard,
    balanced_shares,
)
from model.runtime.shot_worker import ShotWorker, ShotWorkerError, fault_point
from tests.parity.common import rel_err

PARITY = Path(__file__).parent / "fixtures" / "parity"
TOL = 1e-5
SHOT_PX = 32  # stream test frames are 32x32 pixels: a 4x4 latent, 4 tokens per latent frame

# name -> (batch, speakers, latent frames, audio_speakers, latent h, latent w)
FORWARD_CASES = {
    "one_speaker_even": (2, 1, 4, None, 4, 6),
    "two_speakers_uneven": (3, 2, 3, [2, 2, 1], 4, 6),
    "one_speaker_five_frames": (1, 1, 5, None, 4, 4),
    "fewer_frames_than_ranks": (1, 2, 1, None, 4, 4),
}


# ----------------------------------------------------------------------------------------------
# What every rank runs (module-level: spawned processes import this module)
# ----------------------------------------------------------------------------------------------


def load_parts(device: torch.device | str = "cpu"):
    """The tiny parity DiT (float32) and VAE."""
    from model.network.vae import load_vae
    from model.weights.dit_loader import load_dit

    weights = PARITY / "dit" / "weights"
    model = load_dit(weights, weights / "infinitetalk.safetensors", dtype=torch.float32).eval()
    vae = load_vae(PARITY / "vae" / "weights" / "tiny_wan_vae.pth")
    return model.to(device).requires_grad_(False), vae


def forward_inputs(model, name: str, seed: int = 0) -> dict:
    batch, speakers, frames, counts, h, w = FORWARD_CASES[name]
    c = model.config
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(3, h, w)
    masks[0, :, : w // 2] = 1  # person 1 left, person 2 right, background nowhere
    masks[1, :, w // 2 :] = 1
    f_pix = 1 + c.vae_scale * (frames - 1)
    return {
        "x": torch.randn(batch, 16, frames, h, w, generator=g),
        "t": torch.rand(batch, generator=g) * 1000,
        "context": torch.randn(batch, 7, c.text_dim, generator=g),
        "clip_fea": torch.randn(1, c.clip_tokens, c.clip_dim, generator=g),
        "y": torch.randn(1, 20, frames, h, w, generator=g),
        "audio": torch.randn(batch, speakers, f_pix, c.audio_window, 12, 768, generator=g),
        "ref_target_masks": masks,
        "audio_speakers": counts,
    }


def run_forward(model, name: str) -> torch.Tensor:
    with torch.no_grad():
        return model(**forward_inputs(model, name))


def run_teacache(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Four calls of one branch with a permissive TeaCache (some reuse the stored residual).

    -> (outputs (4, B, 16, F, h, w), computed flags (4,))."""
    from model.network.teacache import TeaCache, TeaCacheConfig

    cache = TeaCache(TeaCacheConfig(threshold=10.0, use_ret_steps=False), sample_steps=4)
    inp = forward_inputs(model, "two_speakers_uneven")
    outs = []
    with torch.no_grad():
        for t in (900.0, 890.0, 880.0, 500.0):
            outs.append(model(**{**inp, "t": torch.full((3,), t)}, teacache=cache, branch="cond"))
    return torch.stack(outs), torch.tensor([float(d.computed) for d in cache.decisions])


def run_stream(model, vae, sp: SequenceParallel | None) -> list[torch.Tensor]:
    """A 2-speaker shot of 13 frames in chunks of 9 (3 latent frames, then 2), two steps each."""
    from model.sampling.conditioning import Conditioning, speaker_masks
    from model.sampling.sampler import sampler_preset
    from model.sampling.stream import stream_generate
    from tasks.picture.color import match_and_blend

    g = torch.Generator().manual_seed(3)
    clip = torch.randn(1, 257, 1280, generator=g)
    hw = (SHOT_PX, SHOT_PX)
    cond = Conditioning(
        context=torch.randn(1, 5, 64, generator=g),
        context_null=torch.randn(1, 7, 64, generator=g),
        audio=[torch.randn(13, 12, 768, generator=g) for _ in range(2)],
        ref_target_masks=speaker_masks(None, 2, hw, hw, (SHOT_PX // 8, SHOT_PX // 8)),
        clip_fn=lambda ref: clip,
    )
    settings = sampler_preset("tiny", frame_num=9, motion_frames=1, sampling_steps=2, seed=5)

    def reference(chunk: int, start: int) -> torch.Tensor:
        yy, xx = torch.meshgrid(torch.linspace(-1, 1, SHOT_PX), torch.linspace(-1, 1, SHOT_PX), indexing="ij")
        return 0.8 * torch.stack([xx, yy, torch.sin(3 * xx * yy + 0.3 * start)])[:, None]

    codec = vae if sp is None else RankZeroCodec(sp, vae if sp.is_writer() else None)
    out = stream_generate(
        model, codec, cond=cond, settings=settings, reference_frame_fn=reference, color_fn=match_and_blend
    )
    return [out.video, *out.latents]  # (3, 13, H, W), then each chunk's latent (16, F, h, w)


def rank_setup(sp: SequenceParallel):
    torch.set_num_threads(1)
    model, vae = load_parts(sp.device)
    sp.attach(model)
    return model, vae


def rank_handle(sp: SequenceParallel, state, job: dict):
    """Run one job; rank 0 returns its outputs and the largest difference of any rank from rank 0."""
    model, vae = state
    kind = job["kind"]
    if kind == "fail":
        if sp.rank == job["rank"]:
            raise RuntimeError("requested failure")
        sp.barrier()  # the other ranks wait in a collective, as they would mid-shot
        return None
    if kind == "backend":  # a forward under another attention backend; its error comes back as text
        model.attn_backend = job["backend"]
        try:
            return {"error": None, "out": run_forward(model, job["case"])}
        except Exception as exc:  # the test checks the message
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            model.attn_backend = "auto"
    if kind == "forward":
        outs = [run_forward(model, job["case"])]
    elif kind == "teacache":
        outs = list(run_teacache(model))
    elif kind == "stream":
        outs = run_stream(model, vae, sp)
    else:
        raise ValueError(f"unknown job kind {kind!r}")
    spread = torch.zeros(1)
    for out in outs:  # every rank must hold rank 0's result
        ref = sp.broadcast(out.clone())
        spread = torch.maximum(spread, (out - ref).abs().max().reshape(1))
    dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=sp.group)
    return {"outs": outs, "spread": float(spread)}


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parts():
    return load_parts()


@pytest.fixture(scope="module")
def worker():
    with ShotWorker(2, rank_setup, rank_handle, backend="gloo", start_timeout_s=300) as w:
        yield w


# ----------------------------------------------------------------------------------------------
# Single-process pieces
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("total", "parts_"), [(21, 2), (21, 4), (21, 8), (40, 3), (3, 2), (5, 5)])
def test_balanced_shares_cover_and_differ_by_at_most_one(total, parts_):
    shares = balanced_shares(total, parts_)
    assert sum(shares) == total and len(shares) == parts_
    assert max(shares) - min(shares) <= 1 and list(shares) == sorted(shares, reverse=True)


def test_ranks_own_whole_contiguous_frames():
    """21 latent frames of 30x52 tokens on 4 ranks: frames 6/5/5/5, token ranges back to back."""
    frame_tokens = 30 * 52
    x = torch.arange(21 * frame_tokens)[None]  # (1, L) token ids
    pieces = []
    for rank in range(4):
        sp = SimpleNamespace(group=object(), rank=rank, world_size=4, writer_global_rank=0)
        shard = UlyssesShard(sp, 21, frame_tokens)
        assert shard.token_counts == [6 * frame_tokens] + [5 * frame_tokens] * 3
        assert shard.frames(torch.arange(21), 0).tolist() == list(range(shard.frame_start, shard.frame_stop))
        pieces.append(shard.tokens(x, dim=1))
        assert pieces[-1][0, 0] % frame_tokens == 0  # starts at a frame boundary
    assert torch.equal(torch.cat(pieces, dim=1), x)


def test_single_process_is_the_identity_hook(parts, monkeypatch):
    model, _ = parts
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    sp = SequenceParallel.init_from_env(backend="gloo")
    assert (sp.rank, sp.world_size, sp.is_writer()) == (0, 1, True)
    assert sp.shard((21, 30, 52)) is LOCAL_SHARD
    ref = run_forward(model, "one_speaker_even")
    try:
        sp.attach(model)
        assert torch.equal(run_forward(model, "one_speaker_even"), ref)
    finally:
        model.sp = None


def test_the_rank_fault_hook_is_inert_unless_set(monkeypatch):
    """DUBFLOW_SP_FAULT (the test hook that SIGKILLs a rank mid-job) does nothing unset; a bad value is
    one clear error (a rank reports it at start)."""
    monkeypatch.delenv(FAULT_ENV, raising=False)
    assert fault_point(0) is None and fault_point(1) is None
    monkeypatch.setenv(FAULT_ENV, "1:3:2")
    assert fault_point(1) == (3, 2) and fault_point(0) is None
    monkeypatch.setenv(FAULT_ENV, "1:x")
    with pytest.raises(ValueError, match=r"DUBFLOW_SP_FAULT='1:x': expected RANK:JOB:FORWARD"):
        fault_point(0)


# ----------------------------------------------------------------------------------------------
# Two gloo ranks against one process
# ----------------------------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_matches_single_process(worker, parts, case):
    model, _ = parts
    got = worker.run({"kind": "forward", "case": case}, timeout_s=300)
    expected = run_forward(model, case)
    assert got["spread"] == 0.0, "ranks disagree on the gathered output"
    assert got["outs"][0].shape == expected.shape
    assert rel_err(got["outs"][0], expected) < TOL


@pytest.mark.distributed
def test_teacache_decisions_and_residuals_match_single_process(worker, parts):
    model, _ = parts
    got = worker.run({"kind": "teacache"}, timeout_s=300)
    expected, computed = run_teacache(model)
    assert computed.tolist() == [1.0, 0.0, 0.0, 1.0], "the cache should reuse the middle calls"
    assert torch.equal(got["outs"][1], computed)
    assert got["spread"] == 0.0
    assert rel_err(got["outs"][0], expected) < TOL


@pytest.mark.distributed
def test_streamed_shot_matches_single_process(worker, parts):
    model, vae = parts
    got = worker.run({"kind": "stream"}, timeout_s=300)
    with torch.no_grad():
        expected = run_stream(model, vae, None)
    assert got["spread"] == 0.0, "ranks ended the shot with different frames or latents"
    assert got["outs"][0].shape == expected[0].shape == (3, 13, SHOT_PX, SHOT_PX)
    assert [x.shape[1] for x in got["outs"][1:]] == [3, 2]  # latent frames of the two chunks
    for got_latent, latent in zip(got["outs"][1:], expected[1:], strict=True):
        assert rel_err(got_latent, latent) < TOL
    # The frames pass the latents (here ~6e-7 apart) through the random tiny VAE and the Lab colour
    # transfer, which amplify a relative perturbation about 7x and 8x (measured): ~4e-5.
    assert rel_err(got["outs"][0], expected[0]) < 2e-4


@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["cudnn", "cudnn_fp8"])
def test_cudnn_backends_under_sequence_parallelism_say_what_is_missing_on_a_cpu(worker, backend):
    """The cuDNN frontend backends are selected per rank (`attn_backend`, set by the loader's fp8_attention)
    and reached by the Ulysses self-attention with the rank's head share; without CUDA and the frontend
    every rank stops there with the same clear error (so no rank waits in a collective), and the ranks
    stay usable. Their numbers under SP need two GPUs (test_cudnn_backends_under_sp_track_one_gpu)."""
    from model.network import cudnn_attention

    if cudnn_attention.available():
        pytest.skip("the cuDNN frontend is usable here: the two-GPU test below covers it")
    got = worker.run({"kind": "backend", "backend": backend, "case": "one_speaker_even"}, timeout_s=300)
    assert got["error"] is not None and "nvidia-cudnn-frontend" in got["error"], got
    again = worker.run({"kind": "forward", "case": "one_speaker_even"}, timeout_s=300)
    assert again["spread"] == 0.0


# ----------------------------------------------------------------------------------------------
# Three ranks: 4 heads split 2/1/1, and a failing rank
# ----------------------------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.slow
def test_three_ranks_with_uneven_heads_then_a_failing_rank(parts):
    model, _ = parts
    w = ShotWorker(3, rank_setup, rank_handle, backend="gloo", start_timeout_s=300).start()
    try:
        got = w.run({"kind": "forward", "case": "two_speakers_uneven"}, timeout_s=300)
        assert got["spread"] == 0.0
        assert rel_err(got["outs"][0], run_forward(model, "two_speakers_uneven")) < TOL
        with pytest.raises(ShotWorkerError, match="(?s)rank 2 failed.*requested failure"):
            w.run({"kind": "fail", "rank": 2}, timeout_s=120)
        with pytest.raises(RuntimeError, match="not started"):
            w.run({"kind": "forward", "case": "one_speaker_even"})
    finally:
        w.close()
