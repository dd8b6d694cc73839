"""The GPU smoke's card-sized and real-face parts (`benchmarks/gpu_smoke.py`): an allocator cap that makes
the H200 behave like a 24 / 16 GiB card, the `real` run's shot (a real talking head from tests/data at
1080p, region mode, default gate) with its dub decision taken the way a film run takes it (the planning
step's `tasks.render.shot.prepare_decision`, face analysis included, before the shot is timed), and the
model sizes the load's compile warm-up must cover. Pure helpers where possible; nothing here times.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FACE_CLIP = (
    ROOT / "tests" / "data" / "talking" / "head1.mp4"
)  # a real talking head (see tests/data/README.md)
GGUF_SMOKE_TAGS = ("Q8_0", "Q4_K")


def cap_fraction(cap_gib: float, total_bytes: int) -> float:
    """`torch.cuda.set_per_process_memory_fraction` argument that caps the allocator at `cap_gib` GiB."""
    if cap_gib <= 0:
        raise ValueError(f"--cap-gib must be positive, got {cap_gib}")
    fraction = cap_gib * 2**30 / total_bytes
    if fraction > 1:
        raise ValueError(f"--cap-gib {cap_gib} exceeds the device's {total_bytes / 2**30:.1f} GiB")
    return fraction


def apply_cap(cap_gib: float | None, device: int = 0) -> float | None:
    """Cap this process's CUDA allocator (what a smaller card allows); returns the fraction set."""
    if cap_gib is None:
        return None
    import torch

    fraction = cap_fraction(cap_gib, torch.cuda.get_device_properties(device).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def real_shot_command(
    ffmpeg: str, src: Path, out: Path, seconds: float, size: tuple[int, int] = (1920, 1080), fps: int = 24
) -> list[str]:
    """ffmpeg arguments: `src` (a square talking head) looped to `seconds`, scaled to the frame height and
    centred on a `size` frame (a 1080p talking head in region mode), H.264, no audio (the dub replaces it)."""
    w, h = size
    side = h - h % 2
    vf = f"fps={fps},scale={side}:{side}:flags=lanczos,pad={w}:{h}:{(w - side) // 2}:{(h - side) // 2}"
    return [
        ffmpeg, "-v", "error", "-y", "-stream_loop", "-1", "-i", str(src), "-t", f"{seconds:.3f}", "-vf", vf,
        "-an", "-c:v", "libx264", "-preset", "veryfast", "-crf", "18", "-pix_fmt", "yuv420p", str(out),
    ]  # fmt: skip


def make_real_shot(out: Path, seconds: float, size: tuple[int, int] = (1920, 1080)) -> Path:
    from tasks.media.ffmpeg import ffmpeg_exe

    subprocess.run(real_shot_command(ffmpeg_exe(), FACE_CLIP, out, seconds, size), check=True)
    return out


def real_overrides(common: list[str]) -> list[str]:
    """The `real` run's overrides: the common ones without the test pattern's `gate.policy=all` and
    `region.mode=full` (the default gate and region mode decide), fast preset."""
    drop = ("gate.policy=", "region.mode=")
    return [o for o in common if not o.startswith(drop)] + ["infinitetalk.preset=fast"]


def planned_sizes(job: Any, backend: Any, cfg: Any, info: Any, plan: Any, tiny: bool) -> tuple[Any, list]:
    """The planning step's decision for the shot (`prepare_decision`: face analysis + gate + region plan,
    kept where the render reads it) and the model sizes to warm at load: (decision, sizes)."""
    from tasks.infinitetalk.warmup import film_model_sizes, shot_model_hw
    from tasks.picture.geometry import ModelGeometry
    from tasks.render.shot import prepare_decision

    decision = prepare_decision(job, backend)
    geometry = ModelGeometry.for_video(info, cfg.frames.bucket)
    if decision is None or not decision.dub:
        return decision, []
    hw = shot_model_hw(
        decision, geometry, plan.num_frames, blend_frames=cfg.region.switch_blend_frames, tiny=tiny
    )
    return decision, film_model_sizes([hw])
