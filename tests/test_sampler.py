"""Sampler tests on CPU with the tiny parity DiT and VAE at 16x16 pixels (one DiT token per frame)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from model.sampling.chunks import ChunkSpec, chunk_audio_indices, plan_chunks, plan_chunks_official
from model.sampling.conditioning import Conditioning, branch_inputs, official_bbox_to_xyxy, speaker_masks
from model.sampling.guidance import APGState, adaptive_projected_guidance, apg_combine
from model.sampling.sampler import SamplerSettings, add_noise, sampler_preset, timestep_schedule
from model.sampling.stream import StreamState, stream_generate

PARITY = Path(__file__).parent / "fixtures" / "parity"
H = W = 16  # pixels; latent 2x2


@pytest.fixture(scope="module")
def parts():
    """The real tiny DiT, VAE and colour correction from the parity fixtures."""
    from model.network.vae import load_vae
    from model.weights.dit_loader import load_dit
    from tasks.picture.color import match_and_blend

    weights = PARITY / "dit" / "weights"
    model = load_dit(weights, weights / "infinitetalk.safetensors", dtype=torch.float32).eval()
    vae = load_vae(PARITY / "vae" / "weights" / "tiny_wan_vae.pth")
    return model, vae, match_and_blend


class Recorder:
    """Observes the real model's calls (branch, t, shapes, inputs)."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []

    def __call__(self, x, **kw):
        self.calls.append({"x": x.clone(), **kw})
        return self.model(x, **kw)


def make_cond(
    n_audio: int, speakers: int = 1, seed: int = 0, source: torch.Tensor | None = None
) -> Conditioning:
    g = torch.Generator().manual_seed(seed)
    clip = torch.randn(1, 257, 1280, generator=g)
    return Conditioning(
        context=torch.randn(1, 5, 64, generator=g),
        context_null=torch.randn(1, 7, 64, generator=g),
        audio=[torch.randn(n_audio, 12, 768, generator=g) for _ in range(speakers)],
        ref_target_masks=speaker_masks(None, speakers, (H, W), (H, W), (H // 8, W // 8)),
        clip_fn=lambda ref: clip,
        source_video_fn=None if source is None else (lambda a, b: source[:, a:b]),
    )


def reference_frame(chunk: int, start: int) -> torch.Tensor:
    """A different (3, 1, H, W) frame for every start, in [-1, 1]."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W), indexing="ij")
    rgb = torch.stack([xx, yy, torch.sin(3 * xx * yy + 0.3 * start)])
    return (0.8 * rgb)[:, None]


def tiny_settings(**kw) -> SamplerSettings:
    return sampler_preset(
        "tiny", **{"frame_num": 5, "motion_frames": 1, "sampling_steps": 1, "seed": 7, **kw}
    )


# --- plans -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    n_frames=st.integers(1, 700),
    k=st.integers(1, 25),
    motion=st.integers(1, 100),
)
def test_plan_chunks_covers_every_frame_once(n_frames: int, k: int, motion: int) -> None:
    frame_num = 4 * k + 1
    motion = 1 + (motion - 1) % (frame_num - 1)
    plan = plan_chunks(n_frames, frame_num, motion)
    covered = []
    for i, c in enumerate(plan):
        assert c.index == i
        assert (c.length - 1) % 4 == 0 and c.length <= frame_num
        assert c.n_kept >= 1 and c.keep_end <= c.length and c.length - c.keep_end <= 3
        assert c.out_start == len(covered)
        covered.extend(range(c.start + c.keep_start, c.start + c.keep_end))
        if i:
            prev = plan[i - 1]
            assert c.motion_in == c.keep_start == motion
            assert c.start + motion == prev.end and prev.length == frame_num  # motion = previous tail
    assert covered == list(range(n_frames))


def test_short_shot_plan_is_one_shorter_chunk() -> None:
    assert plan_chunks(6, 13, 5) == [ChunkSpec(0, 0, 9, 1, 0, 6, 0)]
    assert plan_chunks(13, 13, 5) == [ChunkSpec(0, 0, 13, 1, 0, 13, 0)]
    last = plan_chunks(15, 13, 5)[-1]  # 2 frames missing after chunk 0: 5 motion + 2 -> 9 frames
    assert (last.start, last.length, last.keep_start, last.keep_end) == (8, 9, 5, 7)


@pytest.mark.parametrize(
    "n_audio,frame_num,motion,max_frames",
    [(22, 13, 5, 1000), (200, 81, 9, 1000), (300, 81, 9, 150), (40, 13, 5, 13)],
)
def test_official_plan_outputs_min_of_audio_and_max_frames(n_audio, frame_num, motion, max_frames) -> None:
    plan = plan_chunks_official(n_audio, frame_num, motion, max_frames)
    expected = min(max_frames, n_audio) if max_frames > frame_num else min(max_frames, frame_num)
    assert sum(c.n_kept for c in plan) == expected
    assert all(c.length == frame_num for c in plan)
    assert [c.mirror_pad for c in plan[:-1]] == [False] * (len(plan) - 1)
    with pytest.raises(ValueError, match="longer than frame_num"):
        plan_chunks_official(frame_num, frame_num, motion, max_frames)


def test_audio_windows_clamp_and_mirror() -> None:
    idx, src = chunk_audio_indices(ChunkSpec(0, 0, 5, 1, 0, 5, 0), emb_len=10)
    assert idx[0].tolist() == [0, 0, 0, 1, 2] and torch.equal(idx, src)
    # a padded last chunk reads mirrored frames past the end: frame j >= L is 2L-1-j
    idx, src = chunk_audio_indices(ChunkSpec(1, 6, 5, 5, 5, 5, 5, mirror_pad=True), emb_len=10)
    assert idx[-1].tolist() == [8, 9, 10, 11, 12] and src[-1].tolist() == [8, 9, 9, 8, 7]
    idx, src = chunk_audio_indices(ChunkSpec(1, 6, 5, 5, 5, 5, 5), emb_len=10)
    assert src[-1].tolist() == [8, 9, 9, 9, 9]


# --- guidance and masks ------------------------------------------------------------------------


def test_apg_is_orthogonal_to_cond_and_clipped() -> None:
    g = torch.Generator().manual_seed(1)
    cond, diff = torch.randn(2, 16, 3, 4, 4, generator=g), torch.randn(2, 16, 3, 4, 4, generator=g)
    out, norm = adaptive_projected_guidance(diff, cond, None, norm_threshold=1e9)
    inner = (out.double() * cond.double()).sum(dim=(1, 2, 3, 4))
    assert inner.abs().max() < 1e-4 * norm.max()
    assert not torch.allclose(out, diff)
    small, _ = adaptive_projected_guidance(diff, cond, None, norm_threshold=0.5)
    assert torch.linalg.vector_norm(small[0]) <= 0.5 + 1e-5
    # momentum: second update is diff2 + momentum * diff1
    state = APGState(momentum=-0.75, norm_threshold=0.0)
    preds = {"cond": cond, "drop_audio": cond - diff}
    apg_combine(preds, 1.0, 4.0, state)
    apg_combine(preds, 1.0, 4.0, state)
    torch.testing.assert_close(state.audio.running_average, diff * 0.25)


def test_speaker_masks_use_column_row_boxes() -> None:
    boxes = [(0, 0, 32, 64), (32, 0, 64, 64)]  # left half, right half as [x0, y0, x1, y1]
    m = speaker_masks(boxes, 2, (64, 64), (64, 64), (8, 8))
    assert m[0, :, :4].all() and not m[0, :, 4:].any()
    assert m[1, :, 4:].all() and not m[1, :, :4].any()
    assert not m[2].any()
    # the official bbox's x pair indexes rows: [x_min, y_min, x_max, y_max] = rows 0..64, cols 0..32
    official = [(0, 0, 64, 32), (0, 32, 64, 64)]
    assert torch.equal(
        speaker_masks([official_bbox_to_xyxy(b) for b in official], 2, (64, 64), (64, 64), (8, 8)), m
    )
    ones = speaker_masks(None, 1, (40, 60), (32, 48), (4, 6))
    assert ones.shape == (3, 4, 6) and ones.all()


def test_null_audio_calls_use_batch_one() -> None:
    audio = torch.randn(2, 9, 5, 12, 768)
    ctx, ctx_null = torch.zeros(1, 3, 64), torch.ones(1, 4, 64)
    calls = branch_inputs(("cond", "drop_text", "uncond"), ctx, ctx_null, audio)
    assert calls["cond"][1] is audio and calls["drop_text"][0] is ctx_null
    assert calls["uncond"][1].shape == (1, 9, 5, 12, 768) and not calls["uncond"][1].any()


def test_schedule_and_add_noise_endpoints() -> None:
    ts = timestep_schedule(5, 7.0)
    assert ts[0] == 1000 and ts[-1] == 0 and (ts[1:] < ts[:-1]).all()
    x, n = torch.randn(16, 2, 2, 2), torch.randn(16, 2, 2, 2)
    assert torch.equal(add_noise(x, n, ts[:1]), n) and torch.equal(add_noise(x, n, ts[-1:]), x)


# --- streaming ---------------------------------------------------------------------------------
# frame_num 5 / motion 1 / 1 step keeps the VAE and DiT work small; sampler/stream parity covers
# the 13-frame / motion-5 / 3-step configuration with the same components.

N_FULL = 13  # chunks [0, 5), [4, 9), [8, 13)


@pytest.fixture(scope="module")
def full_run(parts):
    """An uninterrupted 3-chunk run, its model calls and its settings."""
    model, vae, color = parts
    s = tiny_settings(color_reference="first")
    rec, seen = Recorder(model), []
    with torch.no_grad():
        out = stream_generate(
            rec,
            vae,
            cond=make_cond(N_FULL),
            settings=s,
            reference_frame_fn=reference_frame,
            color_fn=color,
            on_chunk=seen.append,
        )
    return out, rec.calls, s, seen


def test_full_run_starts_from_seeded_noise(full_run) -> None:
    out, calls, s, seen = full_run
    assert out.video.shape == (3, N_FULL, H, W) and out.done and [c.index for c in out.chunks] == [0, 1, 2]
    assert len(calls) == 3 * 3 and [c["branch"] for c in calls[:3]] == ["cond", "drop_text", "uncond"]
    noise = torch.randn(1, 16, 2, 2, 2, generator=torch.Generator().manual_seed(s.seed))
    assert torch.equal(calls[0]["t"], torch.tensor([1000.0]))
    assert torch.equal(calls[0]["x"][:, :, 1:], noise[:, :, 1:])  # frame 0 holds the reference latent
    # on_chunk sees every chunk's kept frames and the state to checkpoint after it
    assert [c.state.next_chunk for c in seen] == [1, 2, 3]
    assert [c.state.frames_emitted for c in seen] == [5, 9, 13]
    assert torch.equal(torch.cat([c.frames for c in seen], dim=1), out.video)
    assert (
        seen[0].state.motion_frames.shape == (1, 3, s.motion_frames, H, W)
        and seen[-1].state.motion_frames is None
    )


def test_resume_after_chunk_matches_uninterrupted_run(parts, full_run, tmp_path) -> None:
    model, vae, color = parts
    full, _, s, _ = full_run
    kw = dict(cond=make_cond(N_FULL), settings=s, reference_frame_fn=reference_frame, color_fn=color)
    with torch.no_grad():
        first = stream_generate(model, vae, **kw, max_chunks=1)
        assert not first.done and first.video.shape[1] == 5 and first.state.next_chunk == 1
        sd = first.state.state_dict()
        save_file(sd, tmp_path / "state.safetensors")
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        from_torch = torch.load(buf, weights_only=True)
        assert from_torch.keys() == sd.keys() and all(torch.equal(from_torch[k], sd[k]) for k in sd)
        resumed = StreamState.from_state_dict(load_file(tmp_path / "state.safetensors"))
        rest = stream_generate(model, vae, **kw, state=resumed)
    assert rest.done and [c.index for c in rest.chunks] == [1, 2] and rest.state.frames_emitted == N_FULL
    assert torch.equal(torch.cat([first.video, rest.video], dim=1), full.video)
    with pytest.raises(ValueError, match="planned for"):
        stream_generate(model, vae, **{**kw, "cond": make_cond(N_FULL + 4)}, state=resumed)


def test_teacache_sees_named_branches_and_changes_nothing_when_computing(parts, full_run) -> None:
    from model.network.teacache import TeaCache, TeaCacheConfig

    model, vae, color = parts
    full, _, s, _ = full_run
    cache = TeaCache(TeaCacheConfig(), sample_steps=s.sampling_steps)
    with torch.no_grad():
        cached = stream_generate(
            model,
            vae,
            cond=make_cond(N_FULL),
            settings=s,
            reference_frame_fn=reference_frame,
            color_fn=color,
            teacache=cache,
            max_chunks=2,
        )
    # reset at every chunk start: the log holds the last chunk's calls only
    assert [d.branch for d in cache.decisions] == ["cond", "drop_text", "uncond"] * s.sampling_steps
    assert all(d.computed for d in cache.decisions)  # fewer than 5 steps: never reused
    assert torch.equal(full.video[:, : cached.video.shape[1]], cached.video)


def test_short_shot_runs_one_short_chunk(parts) -> None:
    model, vae, color = parts
    rec = Recorder(model)
    with torch.no_grad():
        out = stream_generate(
            rec,
            vae,
            cond=make_cond(3),
            settings=tiny_settings(frame_num=9),
            reference_frame_fn=reference_frame,
            color_fn=color,
        )
    assert out.video.shape == (3, 3, H, W) and len(rec.calls) == 3
    assert rec.calls[0]["x"].shape == (1, 16, 2, 2, 2)  # 5 frames -> 2 latent frames
    assert rec.calls[0]["audio"].shape == (1, 5, 5, 12, 768)


def test_text_scale_one_makes_two_calls_per_step(parts) -> None:
    model, vae, _ = parts
    rec = Recorder(model)
    cond = make_cond(5, speakers=2)
    with torch.no_grad():
        stream_generate(
            rec,
            vae,
            cond=cond,
            settings=tiny_settings(sampling_steps=2, text_guide_scale=1.0),
            reference_frame_fn=reference_frame,
        )
    assert [c["branch"] for c in rec.calls] == ["cond", "drop_audio"] * 2
    cond_call, drop = rec.calls[0], rec.calls[1]
    assert torch.equal(drop["context"], cond.context) and torch.equal(drop["x"], cond_call["x"])
    assert cond_call["audio"].shape[0] == 2 and drop["audio"].shape[0] == 1 and not drop["audio"].any()


def test_denoise_strength_starts_at_its_timestep(parts) -> None:
    model, vae, _ = parts
    source = reference_frame(0, 3).expand(-1, 5, -1, -1) * torch.linspace(1, 0.5, 5)[None, :, None, None]
    s = tiny_settings(sampling_steps=4, denoise_strength=0.5)
    rec = Recorder(model)
    with torch.no_grad():
        stream_generate(
            rec, vae, cond=make_cond(5, source=source), settings=s, reference_frame_fn=reference_frame
        )
        ts = timestep_schedule(4, s.shift)
        assert s.start_step == 2 and len(rec.calls) == 2 * 3
        assert torch.equal(rec.calls[0]["t"], ts[2:3]) and torch.equal(rec.calls[3]["t"], ts[3:4])
        noise = torch.randn(1, 16, 2, 2, 2, generator=torch.Generator().manual_seed(s.seed))
        expected = add_noise(vae.encode(source[None]), noise, ts[2:3])
    torch.testing.assert_close(rec.calls[0]["x"][:, :, 1:], expected[:, :, 1:], rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_run_matches_cpu_run_with_a_cpu_generator(full_run, monkeypatch) -> None:
    from model.network.vae import load_vae
    from model.weights.dit_loader import load_dit
    from tasks.picture.color import match_and_blend

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    full, _, s, _ = full_run
    weights = PARITY / "dit" / "weights"
    model = load_dit(weights, weights / "infinitetalk.safetensors", dtype=torch.float32, device="cuda").eval()
    vae = load_vae(PARITY / "vae" / "weights" / "tiny_wan_vae.pth", device="cuda")
    cpu = make_cond(N_FULL)
    clip = cpu.clip_fn(None).cuda()
    cond = Conditioning(
        context=cpu.context.cuda(),
        context_null=cpu.context_null.cuda(),
        audio=[a.cuda() for a in cpu.audio],
        ref_target_masks=cpu.ref_target_masks.cuda(),
        clip_fn=lambda ref: clip,
    )
    out = stream_generate(
        model,
        vae,
        cond=cond,
        settings=s,
        reference_frame_fn=reference_frame,
        color_fn=match_and_blend,
        generator=torch.Generator().manual_seed(s.seed),
    )
    err = (out.video - full.video).abs().max() / full.video.abs().max()
    assert out.video.device.type == "cpu" and err < 1e-3, f"CUDA vs CPU relative error {err:.2e}"


def test_both_scales_one_makes_one_call_per_step_and_equals_two_call_result():
    """Distilled-LoRA settings (text = audio = 1): guidance vanishes, so one `cond` call per step
    gives what the 2-call combination gives, up to float rounding."""
    from model.sampling.guidance import cfg_combine, guidance_branches

    assert guidance_branches(1.0, 1.0) == ("cond",)
    assert guidance_branches(1.0, 4.0) == ("cond", "drop_audio")
    assert guidance_branches(1.0) == ("cond", "drop_audio")  # official rule without the audio scale
    assert guidance_branches(5.0, 1.0) == ("cond", "drop_text", "uncond")
    g = torch.Generator().manual_seed(0)
    cond, drop_audio = torch.randn(2, 1, 16, 3, 4, 4, generator=g)
    one = cfg_combine({"cond": cond}, 1.0, 1.0)
    two = cfg_combine({"cond": cond, "drop_audio": drop_audio}, 1.0, 1.0)
    assert torch.equal(one, cond)
    torch.testing.assert_close(one, two, rtol=0, atol=1e-6)
