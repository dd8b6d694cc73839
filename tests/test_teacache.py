"""TeaCache with a prepared schedule: the same decisions as the per-call path, and no host sync in
the step loop (CPU, tiny DiT; the official goldens replayed through the prepared path)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import model.network.teacache as teacache_module
from model.config import DIT_PRESETS
from model.network.dit import InfiniteTalkDiT
from model.network.teacache import TeaCache, TeaCacheConfig
from model.sampling.sampler import SamplerSettings, timestep_schedule
from model.weights.tiny import random_dit_state
from tests.dit_inputs import chunk_inputs, run_chunk

CFG = DIT_PRESETS["tiny"]
PARITY_DIR = Path(os.environ.get("PARITY_DIR", Path(__file__).parent / "fixtures" / "parity")).resolve()
SYNCING = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


@pytest.fixture(scope="module")
def model() -> InfiniteTalkDiT:
    m = InfiniteTalkDiT(CFG)
    m.load_state_dict(random_dit_state(CFG, seed=3), strict=True)
    return m.eval().requires_grad_(False)


def plain_callable(model: InfiniteTalkDiT):
    """The same DiT behind a plain function: a VelocityModel without `timestep_modulation`."""

    def call(x, **kw):
        return model(x, **kw)

    return call


def flags(cache: TeaCache) -> list[tuple[str, bool, float]]:
    return [(d.branch, d.computed, d.accumulated) for d in cache.decisions]


# (sampling_steps, denoise_strength, text scale, audio scale, batch_branches, use_ret_steps, threshold)
SCHEDULES = {
    "3-branches": (10, 1.0, 5.0, 4.0, False, True, 0.5),
    "3-batched-v2v": (12, 0.7, 5.0, 4.0, True, True, 0.5),  # start_step 4
    "2-branches-v2v-no-ret": (9, 0.8, 1.0, 4.0, False, False, 0.3),  # start_step 2
    "2-batched-no-ret": (8, 1.0, 1.0, 4.0, True, False, 0.3),
    "1-branch": (9, 1.0, 1.0, 1.0, False, True, 0.5),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_prepared_decisions_equal_per_call_decisions(model, name):
    """Same flags, bit-identical accumulators and latents; the prepared run never syncs a distance."""
    steps, strength, text_scale, audio_scale, batched, use_ret, threshold = SCHEDULES[name]
    settings = SamplerSettings(
        sampling_steps=steps,
        denoise_strength=strength,
        text_guide_scale=text_scale,
        audio_guide_scale=audio_scale,
        batch_branches=batched,
    )
    run_steps = steps - settings.start_step
    inp = chunk_inputs(CFG)
    caches, outs = {}, {}
    for prepared in (True, False):
        cache = TeaCache(TeaCacheConfig(threshold=threshold, use_ret_steps=use_ret), sample_steps=run_steps)
        outs[prepared] = run_chunk(
            model if prepared else plain_callable(model), settings, inp, teacache=cache
        )
        caches[prepared] = cache
    assert flags(caches[True]) == flags(caches[False])
    assert torch.equal(outs[True], outs[False])
    sources = Counter(d.source for d in caches[True].decisions)
    assert sources["synced"] == 0 and sources["prepared"] > 0, sources
    assert Counter(d.source for d in caches[False].decisions)["synced"] == sources["prepared"]
    assert not all(d.computed for d in caches[True].decisions), "schedule chosen so that some calls reuse"


def test_prepared_loop_makes_no_host_sync(model, monkeypatch):
    """Once prepared, the whole denoise loop reads nothing back: one `tolist` (the preparation) in all."""
    counts: Counter[str] = Counter()
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    distance_calls = []
    relative_l1 = teacache_module.relative_l1
    monkeypatch.setattr(
        teacache_module, "relative_l1", lambda m, p: distance_calls.append(1) or relative_l1(m, p)
    )
    settings = SamplerSettings(sampling_steps=10)
    inp = chunk_inputs(CFG, seed=1)

    cache = TeaCache(TeaCacheConfig(threshold=0.5), sample_steps=10)
    run_chunk(model, settings, inp, teacache=cache)
    assert dict(counts) == {"tolist": 1}
    assert len(distance_calls) == 9  # all inside the preparation, none per call
    assert sum(not d.computed for d in cache.decisions) > 0

    # the per-call path (a model without timestep_modulation) syncs once per needed distance
    counts.clear()
    fallback = TeaCache(TeaCacheConfig(threshold=0.5), sample_steps=10)
    run_chunk(plain_callable(model), settings, inp, teacache=fallback)
    synced = sum(d.source == "synced" for d in fallback.decisions)
    assert synced == 3 * 5 and dict(counts) == {"item": synced}


def drive(cache: TeaCache, model: InfiniteTalkDiT, calls: list[tuple[str, float, int]]) -> None:
    """Decisions only: each call is (branch, t, batch), with the DiT's own modulation."""
    for branch, t, batch in calls:
        e, e0 = model.timestep_modulation(torch.full((batch,), t))
        if cache.should_compute(branch, e, e0):
            cache.store_residual(branch, torch.zeros(batch, 1, CFG.dim))


def test_calls_off_the_schedule_fall_back_to_the_exact_distance(model):
    """Another batch shape, more calls than prepared, or a prepare without reset: same decisions as
    the per-call path, synced exactly where the schedule cannot answer."""
    ts = timestep_schedule(8, 7.0)[:8]
    config = TeaCacheConfig(threshold=0.4, use_ret_steps=False)
    first = [(b, float(t), 1) for t in ts for b in ("cond", "uncond")]
    first[9] = ("uncond", first[9][1], 2)  # 5th uncond call with batch 2: off the schedule from there
    second = [("cond", float(t), 1) for t in ts.flip(0)]  # more calls than prepared (other timesteps)
    prepared, per_call = (TeaCache(config, sample_steps=40) for _ in range(2))  # no wrap, no cutoff
    with torch.no_grad():
        prepared.prepare_schedule(model.timestep_modulation, ts)
        for cache in (prepared, per_call):
            drive(cache, model, first + second)
    assert flags(prepared) == flags(per_call)
    by_branch = {b: [d.source for d in prepared.decisions if d.branch == b] for b in ("cond", "uncond")}
    assert by_branch["uncond"][4:] == ["synced"] * 4
    assert "synced" not in by_branch["cond"][:8] and by_branch["cond"][8:] == ["synced"] * 8

    # prepare again without reset: the first call's distance is to a pre-schedule modulation (synced)
    with torch.no_grad():
        prepared.prepare_schedule(model.timestep_modulation, ts)
        for cache in (prepared, per_call):
            drive(cache, model, [("cond", float(t), 1) for t in ts])
    assert flags(prepared) == flags(per_call)
    assert [d.source for d in prepared.decisions[-8:]] == ["synced"] + ["prepared"] * 7
    assert {d.computed for d in prepared.decisions} == {True, False}


def test_reset_drops_the_schedule_and_prepare_checks_shapes(model):
    cache = TeaCache(TeaCacheConfig(threshold=0.4, use_ret_steps=False), sample_steps=4)
    ts = timestep_schedule(4, 7.0)[:4]
    with torch.no_grad():
        cache.prepare_schedule(model.timestep_modulation, ts)
        cache.reset()
        drive(cache, model, [("cond", float(t), 1) for t in ts])
        assert [d.source for d in cache.decisions] == ["rule", "synced", "synced", "rule"]
        one, two = model.timestep_modulation(ts[:1]), model.timestep_modulation(ts[:2])
    with pytest.raises(ValueError, match="modulation 1"):
        cache.prepare([one, two])


def _teacache_manifests() -> list[Path]:
    found = []
    for path in sorted((PARITY_DIR / "dit").rglob("manifest.json")):
        runs = json.loads(path.read_text()).get("runs")
        if isinstance(runs, list) and runs and all("calls" in r for r in runs):
            found.append(path.parent)
    return found


@pytest.mark.parametrize("case_dir", _teacache_manifests(), ids=lambda p: p.name)
def test_official_teacache_goldens_through_the_prepared_schedule(case_dir):
    """The official compute/reuse flags, accumulators and outputs, with every distance prepared."""
    from tests.parity.common import assert_close, load_tensors
    from tests.parity.dit import TOL, _audio_for, _batched, _inputs, _load_model, _teacache_settings

    manifest = json.loads((case_dir / "manifest.json").read_text())
    dit = _load_model(case_dir, manifest, PARITY_DIR)
    inputs = _inputs(case_dir, manifest)
    audio = inputs["audio_emb"][inputs["audio_window_indices"]][None]
    preset, use_ret = _teacache_settings(manifest)
    for run in manifest["runs"]:
        tensors = load_tensors(case_dir / run["file"])
        by_index = {}
        for name in tensors:
            m = re.fullmatch(r"(x|out)_(\d+)", name)
            if m:
                by_index[(m.group(1), int(m.group(2)))] = tensors[name]
        schedules = {}
        for call in run["calls"]:
            schedules.setdefault(call["branch"], []).append(call["t"])
        (ts,) = {tuple(v) for v in schedules.values()}  # every branch sees the same timesteps
        cache = TeaCache(TeaCacheConfig(run["teacache_thresh"], preset, use_ret), run["sampling_steps"])
        cache.prepare_schedule(dit.timestep_modulation, torch.tensor(ts, dtype=torch.float32))
        for call in run["calls"]:
            i = call["call"]
            x = by_index[("x", i)]
            with torch.no_grad():
                out = dit(
                    _batched(x, 5),
                    torch.tensor([call["t"]], dtype=torch.float32),
                    _batched(inputs[call["context"]], 3),
                    inputs["clip_fea"],
                    _batched(inputs["y"], 5),
                    _audio_for(call["audio"], inputs, audio),
                    inputs.get("ref_target_masks"),
                    teacache=cache,
                    branch=call["branch"],
                )
            decision = cache.decisions[-1]
            where = f"{run['file']} call {i}"
            assert decision.computed == call["computed"], where
            assert decision.source != "synced", where
            want = call.get("accumulated_rel_l1_after_call")
            if want is not None:
                assert abs(decision.accumulated - want) <= 1e-4 * max(1.0, abs(want)), where
            assert_close(out, by_index[("out", i)], TOL, where)


def sp_setup(sp):
    torch.set_num_threads(1)
    dit = InfiniteTalkDiT(CFG)
    dit.load_state_dict(random_dit_state(CFG, seed=3), strict=True)
    return sp.attach(dit.eval().requires_grad_(False))


def sp_chunk(dit, sp=None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A 10-step chunk with a prepared TeaCache -> (latent, computed flags, synced distances)."""
    cache = TeaCache(TeaCacheConfig(threshold=0.5), sample_steps=10)
    out = run_chunk(dit, SamplerSettings(sampling_steps=10), chunk_inputs(CFG, seed=2), teacache=cache)
    computed = torch.tensor([float(d.computed) for d in cache.decisions])
    return out, computed, sum(d.source == "synced" for d in cache.decisions)


def sp_handle(sp, dit, job: dict) -> dict:
    out, computed, synced = sp_chunk(dit)
    spread = torch.zeros(2)  # largest difference from rank 0: latent, flags
    for i, x in enumerate((out, computed)):
        spread[i] = (x - sp.broadcast(x.clone())).abs().max()
    total = torch.tensor([float(synced)])
    dist.all_reduce(spread, op=dist.ReduceOp.MAX, group=sp.group)
    dist.all_reduce(total, group=sp.group)
    return {"out": out, "computed": computed, "spread": spread.tolist(), "synced": int(total)}


@pytest.mark.distributed
def test_sequence_parallel_ranks_take_the_same_prepared_decisions(model):
    """Two gloo ranks: every rank prepares its own schedule and decides like one process."""
    from model.runtime.shot_worker import ShotWorker

    with ShotWorker(2, sp_setup, sp_handle, backend="gloo", start_timeout_s=300) as worker:
        got = worker.run({}, timeout_s=300)
    out, computed, synced = sp_chunk(model)
    assert got["spread"] == [0.0, 0.0] and got["synced"] == 0 and synced == 0
    assert torch.equal(got["computed"], computed) and 0 < computed.sum() < len(computed)
    assert (got["out"] - out).abs().max() <= 1e-5 * out.abs().max()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prepared_decisions_make_no_cuda_sync():
    dit = InfiniteTalkDiT(CFG)
    dit.load_state_dict(random_dit_state(CFG, seed=3), strict=True)
    dit = dit.cuda().eval().requires_grad_(False)
    ts = timestep_schedule(10, 7.0)[:10].cuda()
    with torch.no_grad():
        mods = [dit.timestep_modulation(ts[i : i + 1]) for i in range(10)]
        for prepared in (True, False):
            cache = TeaCache(TeaCacheConfig(threshold=0.5), sample_steps=10)
            if prepared:
                cache.prepare(mods)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                if prepared:
                    for e, e0 in mods:
                        if cache.should_compute("cond", e, e0):
                            cache.store_residual("cond", torch.zeros(1, 1, CFG.dim, device="cuda"))
                else:  # the check is live: the per-call path does sync
                    with pytest.raises(RuntimeError):
                        for e, e0 in mods:
                            cache.should_compute("cond", e, e0)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            if prepared:
                assert [d.source for d in cache.decisions][5:] == ["prepared"] * 5
