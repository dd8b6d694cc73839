"""The model load's compile warm-up: two synthetic chunks at a shot's shapes through `generate_chunk`,
so that `torch.compile`'s tracing and code generation, cuDNN's plan building and the first-call costs of
the VAE and CLIP are paid when the models are loaded, not inside a shot's first chunk.

`warm_up` runs once per resident model set and model size (`resident.RESIDENT.warm` remembers which). A
group's model load warms every size its shots were planned at before the first shot (`planned_warm_ups`
over the planning's `shot_model_hw`, run by the backend's `warm_up_planned`); the session calls it too,
under its own "warm_up" stage, for a size no load covered, so a shot that finds the models resident and
warm pays nothing. It runs where the DiT is compiled (CUDA by default; `infinitetalk.warm_up` says
otherwise): an eager model has little worth warming.
What it generates is thrown away: its noise comes from its own CPU generator and its inputs are zeros,
so no shot's output depends on whether (or how often) it ran. On CUDA it also turns on cuDNN's
autotuner (`torch.backends.cudnn.benchmark`), whose trials the synthetic chunks pay for the shot's shapes.
No shot state here, no files.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from model.sampling.conditioning import speaker_masks
from tasks.infinitetalk import resident
from tasks.infinitetalk.chunk import ChunkJob, ChunkModels, generate_chunk
from tasks.infinitetalk.options import TiledVAE, resolve_device
from tasks.picture.color import match_and_blend

log = logging.getLogger(__package__)  # the package's one logger, "tasks.infinitetalk"

AUDIO_BLOCKS, AUDIO_CHANNELS = 12, 768  # wav2vec2 features per frame (the DiT checks its own config)


def warm_up(
    backend: Any, model_hw: tuple[int, int], settings: Any, *, force: bool = False, multi: bool = False
) -> float | None:
    """Warm the resident models of `backend` (an `InfiniteTalkBackend`) for `model_hw` (H, W) and the shot
    sampler `settings` (its chunking and guidance; one step from pure noise is run) unless done already:
    seconds spent, None if skipped (see `warm_key`)."""
    key = warm_key(backend, model_hw, settings, force=force, multi=multi)
    if key is None:
        return None
    device = resolve_device(backend.opts.device)
    spec = backend.load_spec(device)

    def run() -> float:
        if device.startswith("cuda"):  # cuDNN's autotuner for the VAE's convolutions: the warm-up's
            import torch  # synthetic chunks pay its trials; a process-wide torch flag

            torch.backends.cudnn.benchmark = True
        t0 = time.perf_counter()
        _two_chunks(backend, model_hw, _one_step(settings), device, spec.dtype)
        seconds = time.perf_counter() - t0
        log.info("compile warm-up at %dx%d: %.1f s (two synthetic chunks, 1 step)", *model_hw[::-1], seconds)
        return seconds

    return resident.RESIDENT.warm(key, run)


def warm_key(
    backend: Any, model_hw: tuple[int, int], settings: Any, *, force: bool = False, multi: bool = False
) -> tuple[Any, ...] | None:
    """What the resident set remembers a warm-up at `model_hw` by (weights root, load spec, size, chunking,
    batched guidance), or None where none runs: the DiT not compiled and `infinitetalk.warm_up` not true
    (`force`: tests run it eagerly on the tiny model), `warm_up: false`, `gpus_per_shot > 1` (the ranks
    hold the models; their first chunk still compiles), and a two-speaker shot (``multi``: the multi DiT
    with two audio streams; warming the single DiT would swap it in for nothing, so the shot's first chunk
    compiles)."""
    if multi:
        return None
    spec = backend.load_spec(resolve_device(backend.opts.device))
    mode = backend.opts.warm_up
    if backend.opts.gpus_per_shot > 1 or not (force or (mode is not False and (spec.compile or mode))):
        return None
    settings = _one_step(settings)
    root = str(backend.weights_root())
    return (
        root,
        repr(spec),
        tuple(model_hw),
        settings.frame_num,
        settings.motion_frames,
        settings.batch_branches,
    )


def _one_step(settings: Any) -> Any:
    return dataclasses.replace(settings, sampling_steps=1, step_subset=None, denoise_strength=1.0)


def _two_chunks(backend: Any, model_hw: tuple[int, int], settings: Any, device: str, dtype: Any) -> None:
    """Chunk 0 and a continuation chunk (motion frames encoded) of a zero shot; outputs dropped."""
    import torch

    m = backend.models("dit", "vae", "clip")
    dit, vae, clip = m["dit"], m["vae"], m["clip"]
    c = dit.config
    h, w = model_hw
    n_frames = 2 * settings.frame_num - settings.motion_frames  # exactly two full chunks
    models = ChunkModels(dit, TiledVAE(vae, backend.vae_tiling, log), clip.encode, match_and_blend, device)
    job = ChunkJob(
        settings=settings,
        context=torch.zeros(c.text_len, c.text_dim, dtype=torch.float32, device=device),
        context_null=torch.zeros(c.text_len, c.text_dim, dtype=torch.float32, device=device),
        audio=torch.zeros(n_frames, AUDIO_BLOCKS, AUDIO_CHANNELS, dtype=dtype),  # as the features file
        masks=speaker_masks(None, 1, model_hw, model_hw, (h // 8, w // 8)),
        n_frames=n_frames,
        reference=torch.zeros(3, 1, h, w),
        source=None,
        state=None,
        teacache=backend.opts.teacache,
        teacache_preset="infinitetalk-720" if backend.opts.mode == "infinitetalk-720" else "infinitetalk-480",
    )
    with torch.no_grad():
        out = generate_chunk(models, job)
        generate_chunk(models, dataclasses.replace(job, state=out.state))
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def shot_model_hw(
    decision: Any, geometry: Any, num_frames: int, *, blend_frames: int = 0, tiny: bool = False
) -> tuple[int, int]:
    """The model size (H, W) a shot with this dub `decision` (`tasks.decision.record.ShotDecision`) is
    generated at: its combined region plan's bucket, or the full frame's (`ModelGeometry`), as the session
    maps it. Pure: the planning step knows every shot's decision, so it knows every size a film uses."""
    from tasks.infinitetalk.tiny import tiny_hw
    from tasks.picture.region import combine_regions

    parts = [(r.start_frame, r.end_frame, r.plan) for r in decision.regions]
    rplan = combine_regions(parts, num_frames, blend_frames)[0] if parts else None
    bucket = geometry.model_hw if rplan is None or rplan.mode == "full" else rplan.bucket
    return tiny_hw(bucket) if tiny else tuple(bucket)


def film_model_sizes(sizes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The distinct model sizes of a film's dubbed shots, most used first (ties: larger first), i.e. the
    order to warm them in at load so the first shots never compile."""
    counts: dict[tuple[int, int], int] = {}
    for hw in sizes:
        counts[tuple(hw)] = counts.get(tuple(hw), 0) + 1
    return sorted(counts, key=lambda hw: (-counts[hw], -hw[0] * hw[1], hw))


def decision_model_hw(config: Any, decision: Any, geometry: Any, num_frames: int) -> tuple[int, int] | None:
    """The backend's `model_size` hook (`tasks.render.backend.backend_model_size`): the size (H, W) a shot
    with the planning's `decision` generates at under its `config` (a `PipelineConfig`), for the group's
    warm-up at load; None for a shot that is not dubbed or has two speakers at once (not warmed at load)."""
    from tasks.infinitetalk.multi import two_speakers
    from tasks.infinitetalk.options import resolve_options

    if not decision.dub or two_speakers(decision) is not None:
        return None
    tiny = resolve_options(config, config.backend.options, need_weights=False).mode == "tiny"
    blend = config.region.switch_blend_frames
    return shot_model_hw(decision, geometry, num_frames, blend_frames=blend, tiny=tiny)


def planned_warm_ups(shots: list[Any]) -> list[tuple[tuple[int, int], Any]]:
    """The sizes to warm at a group's load and the shot each is warmed for: the distinct model sizes of
    `shots` (`tasks.render.backend.PlannedShot`; those without one add nothing) in `film_model_sizes`
    order, each with its first shot (whose config and chunking the warm-up uses)."""
    first: dict[tuple[int, int], Any] = {}
    for shot in shots:
        if shot.model_hw is not None:
            first.setdefault(tuple(shot.model_hw), shot)
    sizes = film_model_sizes([tuple(s.model_hw) for s in shots if s.model_hw is not None])
    return [(hw, first[hw]) for hw in sizes]


def warm_up_sizes(backend: Any, sizes: list[tuple[int, int]], settings: Any, **kwargs: Any) -> float:
    """`warm_up` at every model size of `sizes` (see `film_model_sizes`): the load's compile warm-up for a
    whole film, one pair of synthetic chunks per new size (~11 s each for the 14B fast preset compiled on
    an H200: the face-crop bucket compiled inside the shot took 11.3 s). Returns the seconds spent."""
    return sum(warm_up(backend, hw, settings, **kwargs) or 0.0 for hw in sizes)
