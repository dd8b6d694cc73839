"""The GPU path's CPU-checkable parts on the tiny model: the conditioning-clip encode's reuse (bit-identical
to the full encode), the compile warm-up at model load (once per size; outputs unchanged), the fast
preset on a merged step-distilled checkpoint, and the next shot's preparation ahead of the current one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.network.vae import WanVAE
from model.network.vae_net import VAE_CONFIGS, CausalVAE, ZeroTailMemo
from tasks.infinitetalk import InfiniteTalkBackend, ResidentModels
from tasks.infinitetalk.session import sampler_settings
from tasks.infinitetalk.tiny import tiny_hw
from tasks.infinitetalk.warmup import warm_up
from tasks.media.probe import VideoInfo
from tasks.picture.geometry import ModelGeometry
from tasks.render.shot import render_shot_result
from tasks.timeline.plan import ShotPlan
from tests.media import decode_all
from tests.test_infinitetalk import SHORT_CHUNKS, _job
from tests.tiny_weights import seed_cache


@pytest.fixture(scope="module")
def ws_root(tmp_path_factory: pytest.TempPathFactory, tiny_weights: Path) -> Path:
    root = tmp_path_factory.mktemp("ws")
    seed_cache(tiny_weights, root / ".cache")
    return root


def _tiny_vae(seed: int = 0) -> WanVAE:
    torch.manual_seed(seed)
    model = CausalVAE(VAE_CONFIGS["tiny"])
    for p in model.parameters():
        p.data.normal_(0.0, 0.2)  # weights large enough that every layer moves its input
    return WanVAE(model)


def test_reference_clip_encode_reuses_only_what_is_bit_identical():
    """[reference, zeros] encoded with the memo equals the full encode bit for bit, for references other
    than the one that filled it and for a shorter (last-chunk) length; the memo holds only chunks past
    the encoder's reach, and the full latent does depend on the reference in every frame (so the
    encode cannot be reused whole)."""
    vae, memo = _tiny_vae(), ZeroTailMemo()
    reach = vae.model.encoder.chunk_reach()
    assert reach == sorted(reach) and reach[-1] > 20  # past an 81-frame clip's 21 chunks
    fulls = []
    for length in (81, 81, 37):  # fill, reuse with another reference, a shorter clip (fills again)
        ref = torch.rand(1, 3, 1, 16, 32) * 2 - 1
        full = vae.encode(torch.cat([ref, torch.zeros(1, 3, length - 1, 16, 32)], dim=2))
        assert torch.equal(vae.encode_reference(ref, length, memo), full)
        chunks = 1 + (length - 1) // 4
        assert memo.steps and all(reach[step] < k < chunks for k, (step, _) in memo.steps.items())
        fulls.append(full)
    assert not any(torch.equal(fulls[0][:, :, i], fulls[1][:, :, i]) for i in range(21))


def test_compile_warm_up_runs_once_per_size_and_changes_no_output(
    tmp_path: Path, ws_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """The warm-up (forced on the eager tiny model) runs two chunks once per model size and resident
    set; a shot rendered after it has the same frame bytes as one rendered before."""
    from tasks.infinitetalk import resident

    fresh = ResidentModels()
    monkeypatch.setattr(resident, "RESIDENT", fresh)
    over = ["gate.policy=all", "qc.enabled=false", *SHORT_CHUNKS]
    job = _job(tmp_path / "a", ws_root, 0, (0, 8), over)
    backend = InfiniteTalkBackend({}, config=None)
    cold = render_shot_result(job, backend=backend)
    plan = ShotPlan.from_dict(job.plan)
    geometry = ModelGeometry.for_video(VideoInfo.from_dict(job.video), "480")
    settings = sampler_settings(backend.opts, backend.config, plan, tiny=True)
    calls = []
    dit = fresh.get(backend.weights_root(), backend.load_spec("cpu"), ("dit",))["dit"]
    hook = dit.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        hw = tiny_hw(geometry.model_hw)
        assert warm_up(backend, hw, settings) is None  # eager model: nothing to warm
        assert warm_up(backend, hw, settings, force=True) > 0
        n = len(calls)
        assert n >= 2  # one step of each of the two synthetic chunks
        assert warm_up(backend, hw, settings, force=True) is None and len(calls) == n  # once per size
    finally:
        hook.remove()
    warm = render_shot_result(_job(tmp_path / "b", ws_root, 0, (0, 8), over), backend=backend)
    assert decode_all(warm["path"]).tobytes() == decode_all(cold["path"]).tobytes()


def test_fast_preset_accepts_a_declared_distilled_checkpoint(tmp_path: Path):
    """`distilled: true` lets the fast preset run on a root without any LoRA (none is merged); without it
    the one-line error names both ways; the declaration enters the shot key only when set."""
    from tasks.config.pipeline import load_config
    from tasks.errors import ConfigError
    from tasks.infinitetalk.options import resolve_options
    from tasks.timeline.shot_key import shot_settings

    root = tmp_path / "weights"
    root.mkdir()
    fast = ["infinitetalk.preset=fast", f"infinitetalk.weights={root}", "infinitetalk.mode=infinitetalk-480"]
    with pytest.raises(ConfigError, match=r"fast needs .* infinitetalk\.distilled: true; 4 undistilled"):
        resolve_options(load_config(overrides=fast))
    opts = resolve_options(load_config(overrides=[*fast, "infinitetalk.distilled=true"]))
    assert (opts.distilled, opts.loras, opts.steps, opts.text_guide_scale) == (True, (), 4, 1.0)
    with pytest.raises(ConfigError, match="infinitetalk.distilled: true needs a weights root"):
        resolve_options(load_config(overrides=["infinitetalk.preset=fast", "infinitetalk.distilled=true"]))
    plain = load_config(overrides=["backend.name=infinitetalk"]).to_dict()
    declared = load_config(overrides=["backend.name=infinitetalk", "infinitetalk.distilled=true"]).to_dict()
    assert "distilled" not in shot_settings(plain, 0)["infinitetalk"]
    assert shot_settings(declared, 0)["infinitetalk"]["distilled"] is True


def test_next_shot_is_prepared_one_ahead_and_its_errors_stay_with_it(tmp_path: Path):
    """render_group prepares shot i+1 while shot i runs, never runs a shot before its preparation
    returned, and a preparation that raised fails that shot alone (its render never starts)."""
    import threading

    from flows.runners import render_group
    from tasks.run.workspace import Workspace

    ws = Workspace(root=str(tmp_path), key="k", incarnation="i")
    shots = [{"index": i, "key": f"s{i}"} for i in range(4)]
    log, lock, released = [], threading.Lock(), threading.Event()

    def prepare(shot):
        with lock:
            log.append(("prepare", shot["index"]))
        if shot["index"] == 1:
            assert released.wait(10)  # shot 1 is prepared while shot 0 runs
        if shot["index"] == 2:
            raise ValueError("gate failed for shot 2")

    def run_shot(shot):
        with lock:
            log.append(("run", shot["index"]))
        if shot["index"] == 0:
            released.set()
        return None

    failed = render_group(ws, shots, run_shot, prepare)
    assert list(failed) == [2] and "ValueError: gate failed for shot 2" in failed[2]
    runs = [e[1] for e in log if e[0] == "run"]
    assert runs == [0, 1, 3]
    for i in runs:  # every shot ran after its own preparation, and the next one was started before it
        assert log.index(("prepare", i)) < log.index(("run", i))
        if i + 1 < len(shots):
            assert log.index(("prepare", i + 1)) < log.index(("run", i)) + 2


def test_a_prepared_decision_is_the_one_the_render_uses(tmp_path: Path, ws_root: Path):
    """`prepare_decision` (the next shot's preparation) keeps the gate's decision where the render reads
    it: the render then gates nothing and writes the same frames as a render that gated itself."""
    from tasks.render.shot import prepare_decision

    class Counting(InfiniteTalkBackend):
        gated = 0

        def prepare_shot(self, *args, **kwargs):
            Counting.gated += 1
            return super().prepare_shot(*args, **kwargs)

    over = ["gate.policy=all", "qc.enabled=false", *SHORT_CHUNKS]
    plain = render_shot_result(_job(tmp_path / "a", ws_root, 0, (0, 5), over), backend=Counting({}))
    assert Counting.gated == 1
    job = _job(tmp_path / "b", ws_root, 0, (0, 5), over)
    decision = prepare_decision(job, Counting({}))
    assert decision is not None and decision.dub and Counting.gated == 2
    prepared = render_shot_result(job, backend=Counting({}))
    assert Counting.gated == 2 and prepared["reason"] == plain["reason"]
    assert decode_all(prepared["path"]).tobytes() == decode_all(plain["path"]).tobytes()
