"""The InfiniteTalk backend: decide which shots to dub, then dub a face crop of each chunk by chunk.

This `__init__` only exposes the package's public names, imported on first use; it holds no code. Per shot
(`tasks.render.shot.render_shot_result` drives it through the `GatingBackend` protocol):

1. `prepare_shot` — the gate (`tasks.decision.shot_decision.decide_shot`): speech in the dub track's slice, then
   who on screen speaks (the face analysis the film run's planning cached in the run workspace; computed
   here only when that file is missing), then `tasks.decision.gate.decide_dub` (policy `auto|all|none`, per-shot
   overrides, regions per speaker turn). A shot that is not dubbed is copied through by the renderer; the
   model is never touched for it.
2. `open_shot` — models and per-film inputs (`backend`). Components come from `resident.RESIDENT`
   (loaded once per worker process, see `ResidentModels`); the prompt embedding (umT5) and the dub
   track's audio features (wav2vec2, windowed, 25 fps) are computed once per *film* and kept as
   safetensors files in the run's work dir (`film/`), written atomically under a file lock (`cache`), so
   every shot on every worker reuses them.
3. `dub_chunk` (`session`) — one `model.sampling.stream.stream_generate` chunk (`chunk`): the chunk's sliding
   reference frame and the shot's frames are cropped to the speaker region's box (or the official full-frame
   resize + centre crop, `region.mode: full`; `region_map`), generated at the model's bucket on the 25 fps
   timeline, colour-matched to the chunk's reference, conformed back to the source frames
   (`ShotPlan.conform_indices`) and blended into the source frames with a feathered border (pixels outside
   the box stay bit-identical). `state()` returns the sampler's `StreamState` (motion frames, RNG, colour
   reference) for the renderer's per-chunk checkpoint, so a killed worker resumes at the next chunk with
   identical results.

Audio alignment (`timeline`): feature frame i of the film sits at time `i * period`; model frame k of a
shot is conditioned on feature frame `offset + k`. Tiny mode (`infinitetalk.weights: null`; `tiny`): a
tiny random weights root is written once under `<workspace.root>/.cache` and run at 1/16 of the bucket with
few steps. Every log line, every shot reason and every dubbed frame says so: it is a pipeline check, not a
dubbing result. Options, offload and VAE tiling: `options`; stopwatches: `timing`. Layering, bottom to
top: tiny, timeline, timing, region_map, cache, options -> chunk -> resident -> session ->
backend. Every file logs to the one package logger, `tasks.infinitetalk`.
"""

import importlib
from typing import Any

# name -> the module that defines it: imported on first use (PEP 562), so `tasks.infinitetalk.settings`,
# which every config asks (`tasks.backends`), is importable without the model
_EXPORTS = {
    "InfiniteTalkBackend": "backend",
    "ensure_tiny_root": "cache",
    "VaeTiling": "options",
    "load_spec": "options",
    "offload_decision": "options",
    "resolve_options": "options",
    "ShotRegion": "region_map",
    "display_box_to_coded": "region_map",
    "ResidentModels": "resident",
    "FeatureTimeline": "timeline",
    "check_plan_agreement": "timeline",
    "shot_feature_range": "timeline",
    "TINY_BANNER": "tiny",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
