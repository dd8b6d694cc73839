"""The GPU smoke's CPU-checkable parts (benchmarks/gpu_smoke.py, smoke_real.py, real_root.py): the allocator
cap's fraction, the `real` run's shot (a real talking head, real ffmpeg) and its planned decision (real face
detection through `prepare_decision`) giving the face-crop model size the load must warm, the warm-up size
order, the run overrides, and the random GGUF root (tiny) that `load_models` and `verify_weights` accept.
The GPU runs themselves are not run here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_smoke  # noqa: E402
from real_root import write_gguf_root  # noqa: E402
from smoke_real import cap_fraction, make_real_shot, planned_sizes, real_overrides  # noqa: E402

from model.weights.gguf import GGUFLinear  # noqa: E402
from model.weights.layout import verify_weights  # noqa: E402
from model.weights.loading import LoadSpec, load_models  # noqa: E402
from model.weights.tiny import write_tiny_root  # noqa: E402
from tasks.infinitetalk.warmup import film_model_sizes  # noqa: E402

GIB = 2**30


def test_cap_fraction():
    assert cap_fraction(24, 140 * GIB) == pytest.approx(24 / 140)
    assert cap_fraction(16, 16 * GIB) == 1.0
    with pytest.raises(ValueError, match="exceeds the device's 16.0 GiB"):
        cap_fraction(24, 16 * GIB)
    with pytest.raises(ValueError, match="must be positive"):
        cap_fraction(0, 16 * GIB)


def _args(tmp_path: Path, **changes) -> argparse.Namespace:
    base = {"work": str(tmp_path), "tiny": False, "gpus_per_shot": 1, "default_steps": 2, "fast": "preset=fast",
            "set": None, "gguf": "Q4_K"}  # fmt: skip
    return argparse.Namespace(**{**base, **changes})


def test_run_overrides_of_the_real_and_gguf_runs(tmp_path):
    args = _args(tmp_path)
    real = gpu_smoke.run_overrides("real", "/w", None, args)
    assert not any(o.startswith(("gate.policy", "region.mode")) for o in real)  # the defaults decide
    assert "infinitetalk.preset=fast" in real and "infinitetalk.weights=/w" in real
    gguf = gpu_smoke.run_overrides("gguf", "/w", None, args)
    assert f"infinitetalk.weights={tmp_path}/weights-gguf" in gguf and "infinitetalk.weights=/w" not in gguf
    assert "infinitetalk.quant=gguf-Q4_K" in gguf and "infinitetalk.steps=2" in gguf
    assert real_overrides(["gate.policy=all", "region.mode=full", "x=1"]) == [
        "x=1",
        "infinitetalk.preset=fast",
    ]


def test_warm_up_sizes_most_used_first():
    sizes = [(448, 896), (768, 512), (768, 512), (640, 640), (448, 896), (768, 512)]
    assert film_model_sizes(sizes) == [(768, 512), (448, 896), (640, 640)]
    assert film_model_sizes([]) == []


def test_real_shot_is_planned_with_its_face_crop_size(tmp_path):
    """The `real` run's preparation on the CPU: a real talking head at 640x360, the default gate and region
    mode; the planning step's decision dubs it in a face crop whose model size differs from the full
    frame's, and that is the size warmed at load."""
    from bench_shot import make_dub

    from tasks import infinitetalk as it
    from tasks.config.pipeline import load_config
    from tasks.infinitetalk.tiny import tiny_hw
    from tasks.media.audio import prepare_dialogue
    from tasks.media.probe import probe
    from tasks.picture.geometry import ModelGeometry
    from tasks.render.shot import ShotJob
    from tasks.timeline.plan import plan_shot
    from tasks.timeline.shots import Shot

    shot = make_real_shot(tmp_path / "real.mp4", 2.0, (640, 360))
    info = probe(shot)
    assert (info.width, info.height) == (640, 360) and 46 <= info.frame_count <= 50 and not info.audio
    make_dub(tmp_path / "dub.wav", 2.0)
    common = [f"workspace.root={tmp_path}/ws", "gate.policy=all", "region.mode=full", "qc.enabled=false",
              "audio.length_policy=fit", "infinitetalk.device=cpu"]  # fmt: skip
    cfg = load_config(overrides=[o for o in real_overrides(common) if "preset" not in o])
    assert cfg.gate.policy == "auto" and cfg.region.mode == "region"
    backend = it.InfiniteTalkBackend({}, config=cfg)
    track = prepare_dialogue(tmp_path / "dub.wav", frame_count=info.frame_count, fps=info.fps, cfg=cfg.audio,
                             out_wav=tmp_path / "d.wav")  # fmt: skip
    plan = plan_shot(Shot(0, 0, info.frame_count), info.fps, cfg.plan)
    run_dir = tmp_path / "run"
    job = ShotJob(info.to_dict(), plan.to_dict(), track.to_dict(), (0, track.n_samples), str(run_dir / "out.mkv"),
                  cfg.to_dict(), work_dir=str(run_dir))  # fmt: skip
    decision, sizes = planned_sizes(job, backend, cfg, info, plan, tiny=True)
    assert decision is not None and decision.dub, decision
    full = tiny_hw(ModelGeometry.for_video(info, cfg.frames.bucket).model_hw)
    (hw,) = sizes
    assert hw != full  # the face crop's bucket, not the full frame's: the size a film run would compile
    assert (run_dir / "out.chunks" / "decision.json").is_file()  # kept where the render reads it


def test_random_gguf_root_loads_and_verifies(tmp_path):
    base = write_tiny_root(tmp_path / "base", seed=2, multi=False)
    meta = write_gguf_root(tmp_path / "gguf", base, "Q8_0", tiny=True)
    assert meta["bytes"] > 0
    root = Path(meta["root"])
    assert verify_weights(root, quant="gguf-Q8_0") == []
    dit = load_models(root, LoadSpec.cpu_float32(components=("dit",), quant="gguf-Q8_0")).dit
    assert any(isinstance(m, GGUFLinear) for m in dit.modules())
    c = dit.config
    gen = torch.Generator().manual_seed(0)
    args = (
        torch.randn(1, c.out_dim, 2, 4, 4, generator=gen), torch.tensor([600.0]),
        torch.randn(1, 7, c.text_dim, generator=gen), torch.randn(1, 257, c.clip_dim, generator=gen),
        torch.randn(1, c.in_dim - c.out_dim, 2, 4, 4, generator=gen),
        torch.randn(1, 5, 5, c.audio_blocks, c.audio_channels, generator=gen),
    )  # fmt: skip
    with torch.no_grad():
        out = dit(*args)
    assert torch.isfinite(out).all() and 0.01 < out.std() < 100
