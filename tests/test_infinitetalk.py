"""The InfiniteTalk backend on a CPU with tiny random weights: the sample film end to end, the gate, region
geometry, one model load per process, per-film caches, and a worker killed mid-shot resuming at its chunk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import tasks.infinitetalk.resident as it
from tasks.config.pipeline import load_config
from tasks.decision.shot_decision import decide_shot
from tasks.errors import ConfigError
from tasks.infinitetalk import (
    TINY_BANNER,
    ResidentModels,
    ShotRegion,
    check_plan_agreement,
    display_box_to_coded,
    resolve_options,
)
from tasks.media.audio import prepare_dialogue, slice_bounds
from tasks.media.frames import iter_frames
from tasks.media.probe import probe
from tasks.picture.geometry import CropGeometry, ModelGeometry
from tasks.picture.region import RegionPlan
from tasks.render.backend import get_backend
from tasks.render.shot import ShotJob, render_shot, render_shot_result
from tasks.timeline.plan import plan_shot
from tasks.timeline.shots import Shot
from tests.media import decode_all
from tests.tiny_weights import seed_cache

REPO = Path(__file__).resolve().parents[1]
FILM, DUB = REPO / "data" / "sample_film.mp4", REPO / "data" / "sample_dub.wav"
SHOTS = [(0, 60), (60, 130), (130, 142), (142, 210), (210, 288)]  # data/sample_film.json
SHORT_CHUNKS = ["plan.frame_num=9", "plan.motion_frames=5"]  # 3 chunks for 16 source frames


@pytest.fixture(scope="module")
def ws_root(tmp_path_factory: pytest.TempPathFactory, tiny_weights: Path) -> Path:
    """A workspace root whose .cache holds the tiny weights root (the session's, copied)."""
    root = tmp_path_factory.mktemp("ws")
    seed_cache(tiny_weights, root / ".cache")
    return root


@pytest.fixture
def resident(monkeypatch: pytest.MonkeyPatch) -> ResidentModels:
    """A fresh resident-model holder for one test (its `loads` start at zero)."""
    fresh = ResidentModels()
    monkeypatch.setattr(it, "RESIDENT", fresh)
    return fresh


def _job(
    tmp: Path, ws_root: Path, index: int, span: tuple[int, int], overrides: list[str], name: str = "shot"
) -> ShotJob:
    cfg = load_config(overrides=["backend.name=infinitetalk", f"workspace.root={ws_root}", *overrides])
    info = probe(FILM)
    work = tmp / "work"
    track = prepare_dialogue(
        DUB, frame_count=info.frame_count, fps=info.fps, cfg=cfg.audio, out_wav=work / "dialogue.wav"
    )
    start, end = span
    plan = plan_shot(Shot(index, start, end), info.fps, cfg.plan)
    edges = sorted({0, start, end, info.frame_count})
    bounds = dict(zip(edges, slice_bounds(edges, info.fps, track.sample_rate, track.n_samples), strict=False))
    return ShotJob(
        info.to_dict(), plan.to_dict(), track.to_dict(), bounds[start], str(tmp / f"{name}.mkv"),
        cfg.to_dict(), work_dir=str(work),
    )  # fmt: skip


def _source(span: tuple[int, int]) -> np.ndarray:
    return np.stack(list(iter_frames(probe(FILM), *span)))


# ----------------------------------------------------------------------------------------- end to end


def test_sample_film_end_to_end_inline(tmp_path: Path, ws_root: Path, resident: ResidentModels, backend_log):
    """run_pipeline inline (no Prefect) with the tiny model: frames and rate kept, shot 0 dubbed in its face
    crop (one chunk, shorter than a full one), faceless shot 1 and silent shot 2 copied through."""
    from flows.dub_film import dub_film_inline

    out = tmp_path / "dubbed.mp4"
    config = {
        "backend": {"name": "infinitetalk"},
        "workspace": {"root": str(ws_root)},
        "gate": {"overrides": {3: "skip", 4: "skip"}},  # keeps the CPU test short: one dubbed shot
    }
    dub_film_inline(str(FILM), str(DUB), str(out), config=config)
    src, got = probe(FILM), probe(out)
    assert (got.frame_count, got.fps, got.width, got.height) == (
        src.frame_count,
        src.fps,
        src.width,
        src.height,
    )
    a, b = decode_all(FILM).astype(np.int16), decode_all(out).astype(np.int16)
    x0, _, x1, _ = _speaker_box(0)  # shot 0's speaker crop
    for index, (s, e) in enumerate(SHOTS):
        inside = np.abs(a[s:e, :, x0 + 16 : x1 - 16] - b[s:e, :, x0 + 16 : x1 - 16]).mean()
        outside = np.abs(a[s:e, :, : x0 - 4] - b[s:e, :, : x0 - 4]).mean()
        if index == 0:  # random weights: the crop is noise, the rest of the frame the source (after x264)
            assert inside > 20 and outside < 3, (index, inside, outside)
        else:
            assert inside < 3 and outside < 3, (index, inside, outside)
    assert resident.loads["dit"] == 1
    assert any("shot 0000: generating chunk 1/1" in line for line in backend_log)
    assert all(TINY_BANNER in line for line in backend_log)


def test_faceless_and_silent_shots_pass_through_bit_identical(
    tmp_path: Path, ws_root: Path, resident: ResidentModels
):
    """The gate skips shot 1 (no face) and shot 2 (no speech in its dub slice): the frames are copied exactly
    as the passthrough backend copies them, and no model is loaded."""
    for index, reason in ((1, "no face found"), (2, "no speech in dub track")):
        job = _job(tmp_path, ws_root, index, SHOTS[index], [], name=f"gate{index}")
        result = render_shot_result(job)
        assert not result["dubbed"] and reason in result["reason"], result
        assert result["qc"] is None and result["chunks"] == 0 and result["backend"] == "infinitetalk"
        dry = _job(tmp_path, ws_root, index, SHOTS[index], ["backend.name=passthrough"], name=f"dry{index}")
        copied, passthrough = decode_all(result["path"]), decode_all(render_shot(dry))
        assert np.array_equal(copied, passthrough) and np.array_equal(copied, _source(SHOTS[index]))
    assert sum(resident.loads.values()) == 0


def test_one_model_load_for_several_shots_from_a_root_in_the_official_layout(
    tmp_path: Path, ws_root: Path, resident: ResidentModels
):
    """backend.options.weights=<tiny root> goes through the same loader as a real root; four shots in one
    process (one of them video-to-video) load every component once and share the film's prompt and
    audio-feature caches."""
    root = ws_root / ".cache" / "tiny-weights-seed0"
    over = [f"backend.options.weights={root}", "gate.policy=all", *SHORT_CHUNKS]
    results = [
        render_shot_result(_job(tmp_path, ws_root, i, span, over, name=f"s{i}"))
        for i, span in ((0, (0, 5)), (4, (210, 215)), (1, (60, 64)))
    ]
    # video-to-video (denoise 0.5: the source crop noised half-way) with the same resident models
    v2v = render_shot_result(
        _job(tmp_path, ws_root, 0, (0, 5), [*over, "backend.options.denoise_strength=0.5"], "v2v")
    )
    assert v2v["dubbed"] and not np.array_equal(decode_all(v2v["path"]), decode_all(results[0]["path"]))
    assert all(r["dubbed"] and r["tiny"] and r["chunks"] == 1 for r in results)
    assert resident.loads == Counter({"t5": 1, "audio": 1, "dit": 1, "vae": 1, "clip": 1})
    assert resident._key is not None and resident._key[0] == str(root.resolve())
    film = sorted(p.name.split("-")[0] for p in (tmp_path / "work" / "film").glob("*.safetensors"))
    assert film == ["audio_features", "prompt"]
    assert "encoders" in results[0]["timings_s"] and "encoders" not in results[1]["timings_s"]
    for r in results:  # QC artefacts of every dubbed shot
        assert (
            Path(r["qc"]["preview"]).stat().st_size > 0 and Path(r["qc"]["contact_sheet"]).stat().st_size > 0
        )
    # a no-face shot forced by policy: the full-frame box, same frame count, outside pixels untouched
    faceless = decode_all(results[2]["path"])
    assert faceless.shape == _source((60, 64)).shape
    json.dumps(results)  # the flow ships them as JSON


_CHILD = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
from tasks.render.shot import render_shot_result
render_shot_result(json.load(open(sys.argv[1])))
"""


def test_killed_worker_resumes_at_the_chunk_it_was_in(
    tmp_path: Path, ws_root: Path, resident: ResidentModels, backend_log
):
    """SIGKILL a worker while it generates chunk 2 of 3: the re-run starts at chunk 2 (chunk 1 is neither
    generated nor its DiT steps run again) and its output is bit-identical to an uninterrupted run."""
    job = _job(tmp_path, ws_root, 0, (0, 16), SHORT_CHUNKS, name="killed")
    assert len(job.plan["chunks"]) == 3
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job.to_dict()))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(spec)], cwd=REPO, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    seen = []
    try:
        deadline = time.monotonic() + 240
        for line in child.stderr:
            seen.append(line)
            if "generating chunk 2/3" in line:
                # chunk 1 is finished on the writer thread while chunk 2 generates (tasks.render.overlap): kill
                # once its checkpoint is on disk, so the kill lands inside chunk 2's generation
                done_1 = tmp_path / "killed.chunks" / "chunk_0000.done"
                while not done_1.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                child.send_signal(signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(seen[-20:])
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL, "".join(seen[-20:])
    chunks = tmp_path / "killed.chunks"
    assert (chunks / "chunk_0000.done").exists() and not (chunks / "chunk_0001.done").exists()
    assert not Path(job.out_path).exists()

    backend = get_backend("infinitetalk", {}, config=load_config(overrides=[f"workspace.root={ws_root}"]))
    dit = backend.models("dit")["dit"]
    calls = []
    hook = dit.register_forward_pre_hook(lambda module, args: calls.append(1))
    backend_log.clear()
    try:
        resumed = render_shot_result(job, backend=backend)
        per_chunk = 3 * 3  # tiny preset: 3 steps x 3 guidance branches
        assert resumed["chunks_resumed"] == 1 and resumed["dubbed"] and len(calls) == 2 * per_chunk
        generated = [line for line in backend_log if "generating chunk" in line]
        assert [g.split("generating ")[1] for g in generated] == ["chunk 2/3", "chunk 3/3"]
        calls.clear()
        whole = render_shot_result(
            _job(tmp_path, ws_root, 0, (0, 16), SHORT_CHUNKS, name="whole"), backend=backend
        )
        assert whole["chunks_resumed"] == 0 and len(calls) == 3 * per_chunk
    finally:
        hook.remove()
    assert np.array_equal(decode_all(resumed["path"]), decode_all(whole["path"]))
    assert resident.loads["dit"] == 1


# ------------------------------------------------------------------------------------------- pieces


def _geometry(coded_hw: tuple[int, int], rotation: int, display_hw: tuple[int, int]) -> ModelGeometry:
    return ModelGeometry(coded_hw, rotation, display_hw, "1.00", CropGeometry.cover(display_hw, (64, 64)))


@pytest.mark.parametrize("rotation", [0, 90, 180, 270])
def test_display_boxes_map_to_the_coded_pixels_they_show(rotation: int):
    """A display box maps to the coded box whose pixels `to_display` puts there (rotation and SAR)."""
    coded_hw = (90, 240)  # anamorphic: 240 coded columns show as 320 square pixels
    upright = (90, 320)
    display_hw = upright if rotation in (0, 180) else upright[::-1]
    geometry = _geometry(coded_hw, rotation, display_hw)
    rng = np.random.default_rng(rotation)
    for _ in range(20):
        h, w = display_hw
        x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        box = (x0, y0, int(rng.integers(x0 + 4, w)), int(rng.integers(y0 + 4, h)))
        marker = np.zeros((*display_hw, 3), np.uint8)
        marker[box[1] : box[3], box[0] : box[2]] = 255
        pre = np.rot90(marker, -(rotation // 90))  # back to the coded orientation, square pixels
        rows, cols = np.flatnonzero(pre[..., 0].any(1)), np.flatnonzero(pre[..., 0].any(0))
        sy, sx = coded_hw[0] / pre.shape[0], coded_hw[1] / pre.shape[1]
        want = (
            round(cols[0] * sx),
            round(rows[0] * sy),
            round((cols[-1] + 1) * sx),
            round((rows[-1] + 1) * sy),
        )
        assert display_box_to_coded(box, geometry) == want


@pytest.mark.parametrize("rotation", [0, 90])
def test_region_paste_changes_only_the_box(rotation: int):
    coded_hw = (120, 200)
    display_hw = coded_hw if rotation == 0 else coded_hw[::-1]
    geometry = _geometry(coded_hw, rotation, display_hw)
    plan = RegionPlan("region", (20, 30, 84, 94), (640, 640), True, 5, "test", display_hw, 4)
    region = ShotRegion(geometry, plan, (32, 32), feather_px=6)
    rng = np.random.default_rng(1)
    source = rng.integers(0, 256, (*coded_hw, 3), dtype=np.uint8)
    model_in = region.to_model(source, 0)
    assert model_in.shape == (32, 32, 3)
    out = region.paste(np.full((32, 32, 3), 7, np.uint8), source, 0)
    x0, y0, x1, y1 = region.coded_box(0)
    mask = np.zeros(coded_hw, bool)
    mask[y0:y1, x0:x1] = True
    assert np.array_equal(out[~mask], source[~mask]) and not np.array_equal(out[mask], source[mask])
    assert np.all(out[(y0 + y1) // 2, (x0 + x1) // 2] == 7)  # the centre is the generated pixel
    full = ShotRegion(geometry, None, (32, 48), feather_px=6)  # official resize + centre crop
    assert full.to_model(source, 0).shape == (32, 48, 3)


def test_options_come_from_the_section_with_backend_options_on_top():
    cfg = load_config()
    opts = resolve_options(cfg, {"steps": 2, "weights": "/w"})
    assert (opts.steps, opts.weights, opts.mode) == (2, "/w", "tiny")
    with pytest.raises(ConfigError, match="unknown infinitetalk option stepz"):
        resolve_options(cfg, {"stepz": 2})
    with pytest.raises(ConfigError, match="infinitetalk.steps: expected an integer"):
        resolve_options(cfg, {"steps": "many"})
    with pytest.raises(ConfigError, match="mode infinitetalk-480 needs a weights root"):
        resolve_options(cfg, {"mode": "infinitetalk-480"})
    with pytest.raises(ConfigError, match="set frames.bucket=720"):
        resolve_options(cfg, {"mode": "infinitetalk-720", "weights": "/w"})
    with pytest.raises(ConfigError, match="quantized DiT"):
        resolve_options(cfg, {"quant": "int8", "loras": [{"path": "l.safetensors", "scale": 1.0}]})
    with pytest.raises(ConfigError, match="entry 0 must be"):
        resolve_options(cfg, {"loras": [{"scale": 1.0}]})


def _speaker_box(index: int) -> tuple[int, int, int, int]:
    """The dub crop the gate plans for a sample-film shot (display = coded pixels here)."""
    from tasks.media.audio import decode_audio

    info, (s, e) = probe(FILM), SHOTS[index]
    audio = decode_audio(DUB, sample_rate=16000, channels=1)
    a, b = slice_bounds([s, e], info.fps, 16000, audio.shape[0])[0]
    (region,) = decide_shot(index, s, e, info, audio[a:b], 16000, load_config()).regions
    return region.plan.box


def test_the_gate_analyses_faces_only_when_the_decision_can_depend_on_them(tmp_path: Path):
    import soundfile as sf

    speech, sr = sf.read(REPO / "tests" / "data" / "speech.wav", dtype="float32", always_2d=True)
    silent = np.zeros_like(speech)
    info = probe(FILM)
    cache = tmp_path / "faces.json"

    def decide(audio, *settings: str, index: int = 0):
        return decide_shot(index, 0, 48, info, audio, sr, load_config(overrides=list(settings)), cache)

    d = decide(silent)
    assert not d.dub and d.reason.startswith("no speech") and d.faces is None
    assert decide(speech, "gate.overrides={3: skip}", index=3).reason == "skipped by override"
    assert decide(speech, "gate.policy=none").reason == "policy: dub no shots"
    assert not cache.exists()  # none of these looked at the picture
    d = decide(speech)
    assert cache.exists() and d.faces.tracks  # the talking head of shot 0
    forced = decide(silent, "gate.overrides={0: dub}")
    assert forced.dub and forced.reason == "forced by override" and forced.regions[0].speaker == 0
    with pytest.raises(ConfigError, match="must be 'dub' or 'skip'"):
        decide(speech, "gate.overrides={0: maybe}")


def test_chunk_plans_agree_with_the_sampler():
    from fractions import Fraction

    from tasks.config.media import PlanConfig
    from tasks.timeline.plan import ShotPlan

    for fps in (Fraction(24000, 1001), Fraction(25), Fraction(30000, 1001)):
        for frame_num, motion in ((81, 9), (13, 5), (9, 1)):
            for n in range(1, 260, 7):
                check_plan_agreement(plan_shot(Shot(0, 0, n), fps, PlanConfig(25, frame_num, motion)))
    plan = plan_shot(Shot(0, 0, 200), Fraction(25), PlanConfig(25, 81, 9))
    bad = ShotPlan.from_dict(
        {**plan.to_dict(), "chunks": [{**c.__dict__, "num_frames": 77} for c in plan.chunks]}
    )
    with pytest.raises(RuntimeError, match="chunk plans disagree"):
        check_plan_agreement(bad)
