"""One chunk's generation, the one code path of it: the job record (`ChunkJob`, picklable), the models it
runs on (`ChunkModels`), `generate_chunk` (one `model.sampling.stream.stream_generate` chunk), and the setup and
job handler of a `model.runtime.shot_worker.ShotWorker` rank, which run that same function with `gpus_per_shot > 1`.

No shot state and no model holder here: the session fills the job per chunk, `resident` keeps the models
and the worker between shots.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from model.network.parallel import RankZeroCodec
from model.network.teacache import TeaCache, TeaCacheConfig
from model.sampling.conditioning import Conditioning
from model.sampling.stream import stream_generate
from model.weights.loading import load_models
from tasks.infinitetalk.options import TiledVAE, VaeTiling
from tasks.infinitetalk.region_map import to_uint8
from tasks.picture.color import match_and_blend

if TYPE_CHECKING:
    import torch

    from model.weights.loading import LoadSpec

log = logging.getLogger(__package__)  # the package's one logger, "tasks.infinitetalk"


@dataclass
class ChunkJob:
    """Everything one chunk's generation needs besides the models. Picklable: with `gpus_per_shot > 1`
    it is the job record a `ShotWorker` broadcasts to its ranks (tensors on the host)."""

    settings: Any  # model.sampling.sampler.SamplerSettings
    context: torch.Tensor  # (Lt, Dt) umT5 prompt embedding
    context_null: torch.Tensor  # (Lt, Dt)
    # (L, 12, 768) the shot's wav2vec2 features; two speakers (`multi`): one per person, in mask order
    audio: torch.Tensor | list[torch.Tensor]
    masks: torch.Tensor  # (3, h, w) speaker masks
    n_frames: int  # model frames of the shot
    reference: torch.Tensor  # (3, 1, H, W) in [-1, 1]: the chunk's reference frame
    source: torch.Tensor | None  # (3, T, H, W) the chunk's source model frames (video-to-video only)
    state: Any | None  # model.sampling.stream.StreamState after the previous chunk; None = chunk 0
    teacache: float | None  # TeaCache threshold
    teacache_preset: str


@dataclass
class ChunkModels:
    """The generation models as `generate_chunk` calls them (timed in-process; SP-wrapped in a rank)."""

    dit: Callable[..., Any]
    vae: Any  # encode / decode
    clip_fn: Callable[[torch.Tensor], torch.Tensor]
    color_fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None
    device: str


def generate_chunk(models: ChunkModels, job: ChunkJob) -> Any:
    """One `stream_generate(max_chunks=1)` call -> its `model.sampling.stream.ChunkOutput` (kept frames, state).

    The one code path of the generation: the calling process runs it with `gpus_per_shot: 1`, every rank
    of the ShotWorker with more. Noise comes from a CPU generator seeded for chunk 0 and restored from the
    state afterwards, so the result does not depend on where or in which process a chunk runs.
    """
    import torch

    source = job.source
    cond = Conditioning(
        context=job.context.to(models.device),
        context_null=job.context_null.to(models.device),
        audio=list(job.audio) if isinstance(job.audio, list) else [job.audio],
        ref_target_masks=job.masks,
        clip_fn=models.clip_fn,
        n_frames=job.n_frames,
        source_video_fn=None if source is None else (lambda start, stop: source[:, : stop - start]),
    )
    generator = torch.Generator("cpu")
    if job.state is None:
        generator.manual_seed(job.settings.seed)
    teacache = None
    if job.teacache is not None:
        steps = job.settings.steps_run - job.settings.start_step
        teacache = TeaCache(TeaCacheConfig(threshold=job.teacache, preset=job.teacache_preset), steps)
    outputs: list[Any] = []
    stream_generate(
        models.dit,
        models.vae,
        cond=cond,
        settings=job.settings,
        reference_frame_fn=lambda index, start: job.reference,
        color_fn=models.color_fn,
        state=job.state,
        on_chunk=outputs.append,
        generator=generator,
        teacache=teacache,
        collect=False,
        max_chunks=1,
    )
    (out,) = outputs
    return out


def rank_setup(root: str, spec: LoadSpec, tiling: VaeTiling, sp: Any) -> dict[str, Any]:
    """ShotWorker setup of one rank: the DiT (sequence-parallel) everywhere, VAE (tiled per `tiling`) and
    CLIP on rank 0 only."""

    components = ("dit", "vae", "clip") if sp.is_writer() else ("dit",)
    models = load_models(root, dataclasses.replace(spec, device=str(sp.device), components=components))
    sp.attach(models.dit)
    tiled = None if models.vae is None else TiledVAE(models.vae, tiling, log)
    vae = RankZeroCodec(sp, tiled)  # decoded video / latents broadcast: identical on every rank
    clip = RankZeroCodec(sp, models.clip)  # CLIP features likewise
    chunk_models = ChunkModels(models.dit, vae, clip.encode, match_and_blend, str(sp.device))
    return {"models": chunk_models, "jobs": 0}


def rank_handle(sp: Any, rank: dict[str, Any], job: dict[str, Any]) -> dict[str, Any] | None:
    """ShotWorker job of one rank: {"describe": True} -> the DiT config; {"chunk": ChunkJob} -> rank 0's
    kept frames (uint8 (n, H, W, 3)) and the state after the chunk (host tensors)."""
    rank["jobs"] += 1
    if job.get("describe"):
        result: Any = rank["models"].dit.config
    else:
        out = generate_chunk(rank["models"], job["chunk"])
        result = {"index": out.spec.index, "frames": to_uint8(out.frames), "state": out.state.state_dict()}
    if not sp.is_writer():
        return None
    return {"result": result, "pid": os.getpid(), "jobs": rank["jobs"]}
