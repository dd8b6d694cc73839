"""Speed paths on CPU with the tiny DiT: SDPA priority backend, regional compile (no recompiles),
batched guidance branches, and the film-throughput Prefetcher."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from model.config import DIT_PRESETS
from model.network.attention import attention
from model.network.dit import InfiniteTalkDiT
from model.network.teacache import TeaCache, TeaCacheConfig
from model.runtime.compile import compile_blocks, compiled_graph_count, reset_compiled
from model.runtime.prefetch import Prefetcher, PrefetchError
from model.sampling.sampler import SamplerSettings
from model.weights.tiny import random_dit_state
from tests.dit_inputs import chunk_inputs, run_chunk
from tests.parity.common import rel_err

CFG = DIT_PRESETS["tiny"]


def tiny_model(seed: int = 3) -> InfiniteTalkDiT:
    m = InfiniteTalkDiT(CFG)
    m.load_state_dict(random_dit_state(CFG, seed=seed), strict=True)
    return m.eval().requires_grad_(False)


def inputs(batch: int, frames: int = 2, h: int = 4, w: int = 6, speakers: int = 1, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    f_pix = 1 + CFG.vae_scale * (frames - 1)
    masks = torch.zeros(3, h, w)
    masks[0, :, : w // 2] = 1
    masks[1, :, w // 2 :] = 1
    return {
        "x": torch.randn(batch, 16, frames, h, w, generator=g),
        "t": torch.full((batch,), 700.0),
        "context": torch.randn(batch, 9, CFG.text_dim, generator=g),
        "clip_fea": torch.randn(1, CFG.clip_tokens, CFG.clip_dim, generator=g),
        "y": torch.randn(1, 20, frames, h, w, generator=g),
        "audio": torch.randn(speakers, f_pix, CFG.audio_window, 12, 768, generator=g),
        "ref_target_masks": masks,
    }


def call(model, inp, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(
            inp["x"], inp["t"], inp["context"], inp["clip_fea"], inp["y"], inp["audio"],
            inp["ref_target_masks"], **kw,
        )  # fmt: skip


def test_auto_backend_matches_reference_and_is_the_default():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 33, 4, 32, generator=g) for _ in range(3))
    assert rel_err(attention(q, k, v, backend="auto"), attention(q, k, v, backend="reference")) < 1e-5
    assert InfiniteTalkDiT(CFG).attn_backend == "auto"
    # the priority context is scoped: the global SDPA order is unchanged afterwards
    before = torch._C._get_sdp_priority_order()
    attention(q, k, v, backend="auto")
    assert torch._C._get_sdp_priority_order() == before


def test_regional_compile_one_graph_per_batch_class_and_no_recompiles():
    """All blocks share one graph; new chunk lengths/resolutions reuse it; batch 1 vs 2-3 is one more."""
    model = tiny_model()
    refs = {
        key: call(model, inputs(batch, frames, h, w, seed=i))
        for i, (key, (batch, frames, h, w)) in enumerate(
            {"a": (1, 2, 4, 6), "b": (1, 3, 6, 4), "c": (3, 2, 4, 6), "d": (2, 3, 4, 8)}.items()
        )
    }
    reset_compiled()
    start = compiled_graph_count()
    compile_blocks(model, backend="eager")
    outs = {}
    counts = []
    for i, (key, (batch, frames, h, w)) in enumerate(
        {"a": (1, 2, 4, 6), "b": (1, 3, 6, 4), "c": (3, 2, 4, 6), "d": (2, 3, 4, 8)}.items()
    ):
        outs[key] = call(model, inputs(batch, frames, h, w, seed=i))
        counts.append(compiled_graph_count() - start)
    assert counts == [1, 1, 2, 2], counts  # 2 blocks, 4 shapes -> 2 graphs (batch 1, batch >= 2)
    for key, ref in refs.items():
        assert torch.equal(outs[key], ref), key
    reset_compiled()


@pytest.mark.parametrize(
    ("speakers", "text_scale", "apg"), [(1, 5.0, False), (2, 5.0, True), (2, 1.0, False)]
)
def test_batched_branches_match_sequential_calls(speakers, text_scale, apg):
    model = tiny_model()
    inp = chunk_inputs(CFG, speakers)
    steps = 3
    outs = {}
    for batched in (False, True):
        settings = SamplerSettings(
            sampling_steps=steps, text_guide_scale=text_scale, use_apg=apg, batch_branches=batched
        )
        outs[batched] = run_chunk(model, settings, inp)
    assert rel_err(outs[True], outs[False]) < 1e-5
    assert not torch.equal(outs[True], inp["latent"])


def test_batched_branches_make_one_teacache_decision_per_step():
    model = tiny_model()
    inp = chunk_inputs(CFG, 1)
    steps = 8
    settings = SamplerSettings(sampling_steps=steps, batch_branches=True)
    cache = TeaCache(TeaCacheConfig(threshold=0.5), sample_steps=steps)
    run_chunk(model, settings, inp, teacache=cache)
    assert [d.branch for d in cache.decisions] == ["cond+drop_text+uncond"] * steps
    assert [d.computed for d in cache.decisions][:5] == [True] * 5


# --- Prefetcher ---------------------------------------------------------------------------------


def test_prefetcher_keeps_order_and_runs_off_thread():
    main = threading.get_ident()
    seen_threads = []

    def job(i: int) -> int:
        seen_threads.append(threading.get_ident())
        time.sleep(0.01 * (3 - i % 3))  # later jobs finish sooner: order must still hold
        return i * i

    with Prefetcher(depth=3, workers=3) as pf:
        results = []
        for i in range(7):
            if len(pf) == pf.depth:
                results.append(pf.next())
            pf.submit(job, i)
        results += pf.drain()
    assert results == [i * i for i in range(7)]
    assert main not in seen_threads
    assert pf.busy_seconds > 0


def test_prefetcher_bounds_look_ahead():
    release = threading.Event()
    started = []

    def job(i: int) -> int:
        started.append(i)
        release.wait(5)
        return i

    pf = Prefetcher(depth=2)
    pf.submit(job, 0)
    pf.submit(job, 1)
    blocked = threading.Thread(target=pf.submit, args=(job, 2))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive(), "a third submit must wait while two results are pending"
    release.set()
    assert pf.next() == 0
    blocked.join(5)
    assert not blocked.is_alive()
    assert pf.drain() == [1, 2]
    pf.close()


def test_prefetcher_reraises_with_job_name():
    def bad() -> None:
        raise OSError("disk full")

    with Prefetcher() as pf:
        pf.submit(bad, name="write chunk 3")
        with pytest.raises(PrefetchError, match="write chunk 3") as info:
            pf.next()
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(RuntimeError, match="closed"):
        pf.submit(bad)
