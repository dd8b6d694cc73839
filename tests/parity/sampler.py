"""Parity runner for `sampler/*` goldens: schedule, noise, guidance, APG, audio windows, masks, streaming.

Dispatches on manifest *content* (tensor names and keys), never on case folder names, so another
golden set with other shapes, seeds or chunk settings runs through the same code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from model.network.vae import load_vae
from model.sampling.chunks import chunk_audio, chunk_audio_indices, mirror_pad_length, plan_chunks_official
from model.sampling.conditioning import Conditioning, branch_inputs, official_bbox_to_xyxy, speaker_masks
from model.sampling.guidance import (
    APGState,
    adaptive_projected_guidance,
    apg_combine,
    cfg_combine,
    guidance_branches,
)
from model.sampling.sampler import SamplerSettings, add_noise, euler_update, timestep_schedule
from model.sampling.stream import stream_generate
from model.weights.dit_loader import load_dit
from tasks.picture.color import match_and_blend
from tests.parity.common import assert_close, load_tensors, rel_err

TOL_COMBINE = 1e-5
TOL_DIT_CALL = 1e-4
TOL_STREAM = 1e-3


def _tensor_file(case_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a case folder merged (names are unique across its files)."""
    out: dict[str, torch.Tensor] = {}
    for f in sorted(case_dir.glob("*.safetensors")):
        out.update(load_tensors(f))
    return out


# ---------------------------------------------------------------------------------------------


def _check_timesteps(case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor]) -> None:
    n_checked = 0
    for name, golden in tensors.items():
        m = re.fullmatch(r"shift([0-9.]+)_s(\d+)", name)
        if m:
            ours = timestep_schedule(int(m.group(2)), float(m.group(1)))
            assert_close(ours, golden, TOL_COMBINE, f"timesteps {name}")
            n_checked += 1
        m = re.fullmatch(r"raw_s(\d+)", name)
        if m:
            ours = timestep_schedule(int(m.group(1)), 1.0)  # shift 1 is the identity map
            assert_close(ours, golden, TOL_COMBINE, f"timesteps {name}")
    assert n_checked, f"{case_dir}: no shift*_s* tensors"


def _check_add_noise(case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor]) -> None:
    idx = sorted(int(k[2:]) for k in tensors if re.fullmatch(r"t_\d+", k))
    assert idx, f"{case_dir}: no t_i tensors"
    for i in idx:
        ours = add_noise(tensors["original"], tensors["noise"], tensors[f"t_{i}"])
        assert_close(ours, tensors[f"out_{i}"], TOL_COMBINE, f"add_noise t_{i}")


def _step_preds(tensors: dict[str, torch.Tensor], prefix: str, text_scale: float) -> dict[str, torch.Tensor]:
    return {b: tensors[f"{prefix}_out_{b}"] for b in guidance_branches(text_scale)}


def _check_cfg_step(case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor]) -> None:
    for step in manifest["steps"]:
        p, ts, as_ = step["prefix"], step["text_guide_scale"], step["audio_guide_scale"]
        k = step["motion_latent_frames_overwritten"]
        preds = _step_preds(tensors, p, ts)
        noise_pred = cfg_combine(preds, ts, as_)
        assert_close(noise_pred, tensors[f"{p}_noise_pred"], TOL_COMBINE, f"{p} noise_pred")
        updated = euler_update(
            tensors[f"{p}_latent_in"], noise_pred, tensors[f"{p}_t_i"], tensors[f"{p}_t_next"]
        )
        assert_close(updated, tensors[f"{p}_latent_updated"], TOL_COMBINE, f"{p} latent_updated")
        # the motion latent written before the calls is written back after the update
        nxt = updated.clone()
        nxt[:, :k] = tensors[f"{p}_latent_in"][:, :k]
        assert_close(nxt, tensors[f"{p}_latent_next"], TOL_COMBINE, f"{p} latent_next")


def _check_apg(case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor]) -> None:
    st = manifest["settings"]
    ts, as_ = st["text_guide_scale"], st["audio_guide_scale"]
    timesteps = timestep_schedule(len(manifest["runs"][0]["steps"]), st["shift"])
    for run in manifest["runs"]:
        tag, thr = run["tag"], run["norm_threshold"]
        state = APGState(momentum=st["apg_momentum"], norm_threshold=thr)
        for step in run["steps"]:
            i = step["step"]
            p = f"{tag}_step{i}"
            preds = _step_preds(tensors, p, ts)
            # the two differences one at a time (running averages + APG outputs) ...
            probe = APGState(momentum=st["apg_momentum"], norm_threshold=thr)
            if state.text.running_average is not None:
                probe.text.running_average = state.text.running_average.clone()
                probe.audio.running_average = state.audio.running_average.clone()
            pairs = [("text", "cond", "drop_text"), ("audio", "drop_text", "uncond")]
            if "drop_audio" in preds:
                pairs = [("audio", "cond", "drop_audio")]
            for which, a, b in pairs:
                buf = getattr(probe, which)
                out, norm = adaptive_projected_guidance(preds[a] - preds[b], preds["cond"], buf, thr)
                assert_close(
                    buf.running_average,
                    tensors[f"{p}_{which}_running_average"],
                    TOL_COMBINE,
                    f"{p} {which} running_average",
                )
                assert_close(out, tensors[f"{p}_{which}_apg_out"], TOL_COMBINE, f"{p} {which} apg_out")
                golden_norm = torch.tensor(step[f"{which}_diff_norm_after_momentum"], dtype=torch.float64)
                assert_close(norm.double().reshape(()), golden_norm, TOL_COMBINE, f"{p} {which} norm")
                assert bool(norm.reshape(()) > thr) == step[f"{which}_clipped"], f"{p} {which} clipped flag"
            # ... and the combined step through the sampler's own function
            velocity = apg_combine(preds, ts, as_, state)
            latent_in = tensors[f"{p}_latent_in"]
            t_i = torch.tensor([step["t"]], dtype=torch.float32)
            t_next = torch.tensor([step["t_next"]], dtype=torch.float32)
            assert_close(t_i, timesteps[i : i + 1], TOL_COMBINE, f"{p} t")
            nxt = euler_update(latent_in, velocity, t_i, t_next)
            nxt[:, :1] = latent_in[:, :1]  # clip mode: one clean motion latent frame
            assert_close(nxt, tensors[f"{p}_latent_next"], TOL_COMBINE, f"{p} latent_next")


def _plan_params(manifest: dict) -> tuple[int, int, int]:
    """(frame_num, motion_frame, max_frames_num) from settings, else from the chunk records."""
    st = manifest.get("settings", {})
    chunks = manifest["chunks"]
    frame_num = st.get("frame_num", chunks[0]["audio_end_idx"] - chunks[0]["audio_start_idx"])
    motion = st.get("motion_frame")
    if motion is None and len(chunks) > 1:
        motion = chunks[1]["motion_frames_in"]
    elif motion is None:
        motion = frame_num - chunks[0].get("next_reference_frame_request", frame_num - 1)
    max_frames = st.get("max_frames_num")
    if max_frames is None:
        m = re.search(r"max_frames_num\s*=\s*(\d+)", manifest.get("description", ""))
        max_frames = int(m.group(1)) if m else 1000
    return frame_num, motion, max_frames


def _check_chunk_bookkeeping(plan, manifest: dict, emb_len: int, what: str) -> None:
    """Chunk ranges, conditioning frames, kept frames, clamps, reference requests and padding, exactly."""
    chunks = manifest["chunks"]
    frame_num, motion, max_frames = _plan_params(manifest)
    assert len(plan) == len(chunks), f"{what}: {len(plan)} chunks planned, golden has {len(chunks)}"
    for spec, ch in zip(plan, chunks, strict=True):
        w = f"{what} chunk {spec.index}"
        assert spec.start == ch["audio_start_idx"] and spec.end == ch["audio_end_idx"], f"{w} range"
        assert (spec.index == 0) == ch["is_first_clip"], f"{w} is_first_clip"
        assert spec.motion_in == ch["motion_frames_in"], f"{w} motion_frames_in"
        assert spec.motion_latent_frames == ch["motion_latent_frames"], f"{w} motion_latent_frames"
        assert [spec.keep_start, spec.length] == list(ch["kept_frames_of_chunk"]), f"{w} kept frames"
        idx, _ = chunk_audio_indices(spec, emb_len)
        clamp_max = emb_len - 1 + (mirror_pad_length(spec.end, emb_len) if spec.mirror_pad else 0)
        assert clamp_max == ch["clamp_max"], f"{w} clamp_max"
        assert int(idx.max()) <= clamp_max, f"{w} index above clamp_max"
        if "reference_frame_requested" in ch:
            assert spec.start == ch["reference_frame_requested"], f"{w} reference frame"
        # after a chunk the official loop moves on (reads the next reference, maybe pads the audio)
        # unless that chunk was flagged last; in clip mode it does so and then stops
        nxt = plan[spec.index + 1] if spec.index + 1 < len(plan) else None
        advanced = nxt is not None or "next_reference_frame_request" in ch
        next_start = spec.start + frame_num - motion
        pad = 0
        if advanced:
            assert ch.get("next_reference_frame_request", next_start) == next_start, f"{w} next reference"
            assert nxt is None or nxt.start == next_start, f"{w} next chunk start"
            if next_start + frame_num >= min(max_frames, emb_len):
                pad = mirror_pad_length(next_start + frame_num, emb_len)
        assert pad == ch.get("flip_pad_frames_appended", 0), f"{w} flip padding"


def _official_plan_from_chunks(manifest: dict, emb_len: int):
    frame_num, motion, max_frames = _plan_params(manifest)
    return plan_chunks_official(emb_len, frame_num, motion, max_frames)


def _check_audio_windows(case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor]) -> None:
    emb_len = manifest.get("settings", {}).get("audio_frames", manifest["chunks"][0]["clamp_max"] + 1)
    plan = _official_plan_from_chunks(manifest, emb_len)
    _check_chunk_bookkeeping(plan, manifest, emb_len, "audio_windows")
    for spec in plan:
        idx, src = chunk_audio_indices(spec, emb_len)
        assert torch.equal(idx, tensors[f"chunk{spec.index}_center_indices"]), f"chunk {spec.index} indices"
        assert torch.equal(src, tensors[f"chunk{spec.index}_source_frames"]), (
            f"chunk {spec.index} source frames"
        )
    assert sum(s.n_kept for s in plan) == manifest["final_video_frames"], "final video length"
    if "extended_embedding_length" in manifest:
        assert manifest["chunks"][-1]["clamp_max"] + 1 == manifest["extended_embedding_length"]
    if "total_generated_frames_before_cut" in manifest:
        total = sum(s.length - s.keep_start for s in plan)
        assert total == manifest["total_generated_frames_before_cut"], "frames before the final cut"


def _check_two_speakers(case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor]) -> None:
    st = manifest["settings"]
    bbox = st.get("bbox")
    boxes = [official_bbox_to_xyxy(b) for b in bbox.values()] if bbox else None
    n_speakers = len(bbox) if bbox else manifest["calls"][0]["audio_batch"]
    target = tuple(st["bucket_hw"])
    golden = tensors["ref_target_masks"]
    masks = speaker_masks(boxes, n_speakers, tuple(st["source_image_hw"]), target, tuple(golden.shape[-2:]))
    assert torch.equal(masks, golden), f"masks differ at {int((masks != golden).sum())} positions"
    # call shapes: the audio each branch receives
    frame_num = st["frame_num"]
    audio = torch.zeros(n_speakers, frame_num, 5, 1, 1)
    ctx = torch.zeros(1, 3, 2)
    branches = guidance_branches(st.get("text_guide_scale", 5.0))
    calls = list(branch_inputs(branches, ctx, ctx + 1, audio).values())
    assert len(calls) == len(manifest["calls"]), "number of calls per step"
    for (_, aud), golden_call in zip(calls, manifest["calls"], strict=True):
        assert aud.shape[0] == golden_call["audio_batch"], f"call {golden_call['call']} audio batch"
        assert list(aud.shape[:3]) == golden_call["audio_shape"][:3], (
            f"call {golden_call['call']} audio shape"
        )


# ---------------------------------------------------------------------------------------------
# Streaming replay


class _Recorder:
    """Observes the real DiT: keeps every call's inputs and output in call order."""

    def __init__(self, model) -> None:
        self.model = model
        self.calls: list[dict] = []

    def __call__(self, x, **kw):
        out = self.model(x, **kw)
        self.calls.append({"x": x.detach().clone(), "out": out.detach().clone(), **kw})
        return out


def _resolve(case_dir: Path, rel: str) -> Path:
    return (case_dir / rel.split(" ")[0].rstrip(",")).resolve()


def _load_stream_components(case_dir: Path, manifest: dict, parity_root: Path):
    """Tiny DiT + VAE named by the manifest's `weights` (default: the parity set's own)."""
    dit_dir = parity_root / "dit" / "weights"
    vae_file = parity_root / "vae" / "weights" / "tiny_wan_vae.pth"
    for part in str(manifest.get("weights", "")).split(","):
        p = (case_dir / part.strip()).resolve()
        if part.strip() and p.suffix == ".pth":
            vae_file = p
        elif part.strip() and p.is_dir():
            dit_dir = p
    adapters = [f for f in dit_dir.glob("*.safetensors") if not f.name.startswith("diffusion_pytorch_model")]
    assert len(adapters) == 1, f"{dit_dir}: expected one InfiniteTalk adapter file, found {adapters}"
    model = load_dit(dit_dir, adapters[0], dtype=torch.float32).eval()
    return model, load_vae(vae_file)


def _check_stream(
    case_dir: Path, manifest: dict, tensors: dict[str, torch.Tensor], parity_root: Path
) -> None:
    st = manifest["settings"]
    inputs = load_tensors(case_dir / "inputs.safetensors")
    chunk_t = _tensor_file(case_dir)
    outputs = load_tensors(case_dir / "outputs.safetensors")
    clip_file = manifest.get("external_inputs", {}).get(
        "clip_fea", "../../dit/shared_inputs/clip_fea.safetensors"
    )
    clip_fea = load_tensors(_resolve(case_dir, clip_file))["clip_fea"]

    embs = [inputs[k] for k in sorted(k for k in inputs if k.startswith("audio_emb"))]
    emb_len = embs[0].shape[0]
    plan = _official_plan_from_chunks(manifest, emb_len)
    _check_chunk_bookkeeping(plan, manifest, emb_len, "stream")
    assert sum(s.n_kept for s in plan) == manifest["final_video_frames"], "final video length"

    settings = SamplerSettings(
        frame_num=st["frame_num"],
        motion_frames=st["motion_frame"],
        sampling_steps=st["sampling_steps"],
        shift=st["shift"],
        text_guide_scale=st["text_guide_scale"],
        audio_guide_scale=st["audio_guide_scale"],
        use_apg=st.get("use_apg", False),
        apg_momentum=st.get("apg_momentum", -0.75),
        apg_norm_threshold=st.get("apg_norm_threshold", 55.0),
        color_correction_strength=st["color_correction_strength"],
        color_reference="first",
        seed=seed["pipeline_seed_argument"] if isinstance(seed := manifest["seed"], dict) else seed,
        plan="official",
        max_frames=st.get("max_frames_num", 1000),
    )
    assert_close(
        timestep_schedule(settings.sampling_steps, settings.shift),
        torch.tensor(manifest["timesteps"]),
        TOL_COMBINE,
        "stream timesteps",
    )
    cond_image = inputs["cond_image"]  # (1, 3, 1, H, W): an image input gives the same frame every chunk
    cond_video = inputs.get("cond_video")  # (3, T, H, W) conditioning frames of a video input, if any

    def reference(k: int, start: int) -> torch.Tensor:
        if cond_video is None:
            return cond_image[0]
        return cond_video[:, min(start, cond_video.shape[1] - 1)][:, None]

    h_lat, w_lat = cond_image.shape[-2] // 8, cond_image.shape[-1] // 8
    bbox = st.get("bbox")
    boxes = [official_bbox_to_xyxy(b) for b in bbox.values()] if bbox else None
    masks = speaker_masks(
        boxes, len(embs), tuple(st["source_image_hw"]), tuple(st["bucket_hw"]), (h_lat, w_lat)
    )
    cond = Conditioning(
        context=inputs["context"],
        context_null=inputs["context_null"],
        audio=embs,
        ref_target_masks=masks,
        clip_fn=lambda ref: clip_fea,
    )
    model, vae = _load_stream_components(case_dir, manifest, parity_root)
    rec = _Recorder(model)
    with torch.no_grad():
        result = stream_generate(
            rec,
            vae,
            cond=cond,
            settings=settings,
            reference_frame_fn=reference,
            color_fn=match_and_blend,
        )

    n_calls = len(guidance_branches(settings.text_guide_scale)) * settings.sampling_steps
    assert len(rec.calls) == n_calls * len(plan), (
        f"{len(rec.calls)} DiT calls, expected {n_calls * len(plan)}"
    )
    for spec in plan:
        k = spec.index
        first = rec.calls[k * n_calls]
        assert_close(first["y"][0], chunk_t[f"chunk{k}_y"][0], TOL_DIT_CALL, f"chunk {k} y")
        _, src = chunk_audio_indices(spec, emb_len)
        assert torch.equal(src, chunk_t[f"chunk{k}_audio_window_source_frames"]), f"chunk {k} audio windows"
        assert torch.equal(first["audio"], chunk_audio(embs, spec)), f"chunk {k} audio fed to the DiT"
        assert torch.equal(first["audio"][0], embs[0][src]), f"chunk {k} speaker-1 audio windows"
        t_m = spec.motion_latent_frames
        assert_close(
            first["x"][0, :, :t_m], chunk_t[f"chunk{k}_motion_latent"], TOL_DIT_CALL, f"chunk {k} motion"
        )
        assert_close(
            first["x"][0, :, t_m:], chunk_t[f"chunk{k}_noise"][:, t_m:], TOL_DIT_CALL, f"chunk {k} noise"
        )
        for j in range(n_calls):
            call = rec.calls[k * n_calls + j]
            for what in ("x", "out"):
                golden = chunk_t[f"chunk{k}_call{j}_{what}"]
                err = rel_err(call[what][0], golden)
                assert err <= TOL_DIT_CALL, f"chunk {k} call {j} {what}: relative error {err:.3e}"
        assert_close(result.latents[k], chunk_t[f"chunk{k}_x0"], TOL_STREAM, f"chunk {k} x0")
    assert_close(result.video, outputs["video"], TOL_STREAM, "stream video")


# ---------------------------------------------------------------------------------------------


def _kind(manifest: dict, names: set[str]) -> str:
    if "chunk_tensors" in manifest or "streaming_loop" in manifest:
        return "stream"
    if any(re.fullmatch(r"shift[0-9.]+_s\d+", n) for n in names):
        return "timesteps"
    if {"original", "noise"} <= names:
        return "add_noise"
    if any(n.endswith("_apg_out") for n in names):
        return "apg"
    if any(n.endswith("_noise_pred") for n in names):
        return "cfg_step"
    if any(n.endswith("_center_indices") for n in names):
        return "audio_windows"
    if "ref_target_masks" in names:
        return "two_speakers"
    return "unknown"


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    tensors = _tensor_file(case_dir)
    kind = _kind(manifest, set(tensors))
    if kind == "stream":
        _check_stream(case_dir, manifest, tensors, parity_root)
    elif kind == "unknown":
        raise AssertionError(f"{case_dir}: unrecognised sampler manifest: {json.dumps(manifest)[:200]}")
    else:
        globals()[f"_check_{kind}"](case_dir, manifest, tensors)
