"""The lossless speed levers outside the DiT (issue 49): the chunk's paste back on a thread pool
(`pipeline.composite_workers`) and the film's prep (umT5 prompt embedding, wav2vec2 features) in the group's
lead-in beside the compile warm-up (`pipeline.film_prep`). Each must leave the output bytes as they were.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tasks.config.pipeline import load_config
from tasks.errors import ConfigError
from tasks.infinitetalk.region_map import ShotRegion, paste_frames
from tasks.picture.geometry import CropGeometry, ModelGeometry
from tasks.picture.region import RegionPlan
from tasks.timeline.shot_key import shot_settings


def _geometry(coded_hw: tuple[int, int]) -> ModelGeometry:
    return ModelGeometry(coded_hw, 0, coded_hw, "1.00", CropGeometry.cover(coded_hw, (32, 48)))


def _label(frame: np.ndarray, j: int) -> np.ndarray:  # a per-frame finish that depends on j
    out = frame.copy()
    out[0, j % frame.shape[1]] = 255
    return out


@pytest.mark.parametrize("mode", ["region", "follow", "full"])
def test_paste_on_a_pool_is_the_same_bytes_as_the_loop(mode: str):
    coded_hw, n = (120, 200), 23
    rng = np.random.default_rng(7)
    geometry = _geometry(coded_hw)
    boxes = tuple((20 + t, 30, 84 + t, 94) for t in range(n)) if mode == "follow" else None
    plan = RegionPlan("region", (20, 30, 84, 94), (640, 640), True, 5, "test", coded_hw, n, boxes)
    weights = tuple(np.clip(np.linspace(-0.5, 1.5, n), 0, 1))  # a fade: 0 (source), ramps, 1
    region = ShotRegion(geometry, None if mode == "full" else plan, (32, 32), feather_px=6, weights=weights)
    kept = rng.integers(0, 256, (n + 4, 32, 32, 3), dtype=np.uint8)
    sources = rng.integers(0, 256, (n, *coded_hw, 3), dtype=np.uint8)
    indices = [min(n + 3, (t * 25) // 24 + 2) for t in range(n)]  # a conform map: repeats and skips
    loop = paste_frames(region, kept, indices, sources, 5, _label)
    with ThreadPoolExecutor(4) as pool:
        pooled = paste_frames(region, kept, indices, sources, 5, _label, pool)
    assert pooled.dtype == np.uint8 and pooled.shape == (n, *coded_hw, 3)
    assert pooled.tobytes() == loop.tobytes()
    # and it is the per-frame paste, in order
    want = np.stack([_label(region.paste(kept[indices[t]], sources[t], 5 + t), 5 + t) for t in range(n)])
    assert loop.tobytes() == want.tobytes()
    assert not np.array_equal(loop, sources)  # something was pasted


def test_render_settings_are_checked_and_not_in_the_shot_key():
    cfg = load_config()
    assert cfg.pipeline.composite_workers == 4
    with pytest.raises(ConfigError, match="pipeline.composite_workers: must be >= 1"):
        load_config(overrides=["pipeline.composite_workers=0"])
    for change in ("pipeline.composite_workers=1", "pipeline.film_prep=shot"):
        for backend in ("infinitetalk", "passthrough"):
            base = load_config(overrides=[f"backend.name={backend}"])
            other = load_config(overrides=[f"backend.name={backend}", change])
            assert shot_settings(other.to_dict(), 0) == shot_settings(base.to_dict(), 0), change
    with pytest.raises(ConfigError, match="pipeline.film_prep"):
        load_config(overrides=["pipeline.film_prep=never"])


# ------------------------------------------------------------------------- the film's prep in the lead-in


@pytest.fixture
def resident(monkeypatch: pytest.MonkeyPatch):
    """A fresh resident-model holder: nothing loaded, nothing warm."""
    import tasks.infinitetalk.resident as it
    from tasks.infinitetalk import ResidentModels

    fresh = ResidentModels()
    monkeypatch.setattr(it, "RESIDENT", fresh)
    return fresh


def _files(film_dir):
    """{file name: (metadata, {tensor name: raw bytes})} of the film's cache files (the header's metadata
    order is not fixed by safetensors, so the files are compared by content)."""
    from safetensors import safe_open

    out = {}
    for p in sorted(film_dir.glob("*.safetensors")):
        with safe_open(str(p), framework="pt") as f:
            tensors = {k: (str(f.get_tensor(k).dtype), f.get_tensor(k).numpy().tobytes()) for k in f.keys()}  # noqa: SIM118
            out[p.name] = (f.metadata(), tensors)
    return out


def test_film_prep_runs_in_the_lead_in_beside_the_warm_up_and_the_shot_reads_it(
    tmp_path, tiny_weights, resident, backend_log
):
    """`warm_up_planned` with the film's inputs makes the prompt embedding and the audio features (the
    files a shot's session reads) on a thread while the warm-up runs; the shot then loads neither umT5
    nor wav2vec2 and spends nothing on them; the files are byte for byte those the shot itself makes
    (`film_prep: shot`); a group with no dubbed shot or `film_prep: shot` prepares nothing."""
    from pathlib import Path

    from tasks.infinitetalk import InfiniteTalkBackend
    from tasks.infinitetalk.timing import Stopwatch
    from tasks.render.backend import FilmInputs, PlannedShot
    from tasks.render.shot import render_shot_result
    from tasks.timeline.plan import ShotPlan
    from tests.test_infinitetalk import _job
    from tests.tiny_weights import seed_cache

    ws_root = tmp_path / "ws"
    seed_cache(tiny_weights, ws_root / ".cache")
    job = _job(tmp_path, ws_root, 0, (0, 40), ["infinitetalk.warm_up=true", "gate.overrides={0: dub}"])
    cfg = load_config(overrides=["backend.name=infinitetalk", f"workspace.root={ws_root}",
                                 "infinitetalk.warm_up=true"])  # fmt: skip
    plan = ShotPlan.from_dict(job.plan)
    film = FilmInputs(Path(job.work_dir), Path(job.dialogue["path"]))
    film_dir = Path(job.work_dir) / "film"

    backend = InfiniteTalkBackend({}, config=cfg)
    assert backend.warm_up_planned([PlannedShot(cfg, plan, None)], film=film) == {}  # nothing dubbed
    shot_cfg = load_config(overrides=[f"workspace.root={ws_root}", "backend.name=infinitetalk",
                                      "pipeline.film_prep=shot", "infinitetalk.warm_up=false"])  # fmt: skip
    assert backend.warm_up_planned([PlannedShot(shot_cfg, plan, (32, 48))], film=film) == {}
    assert not film_dir.exists() and resident.loads["t5"] == 0

    got = backend.warm_up_planned([PlannedShot(cfg, plan, (32, 48))], film=film)
    assert got["film_prep_s"] > 0 and list(got["warm_up_s"]) == ["48x32"], got
    assert any("film prep" in line and "beside it" in line for line in backend_log), backend_log
    lead_in = _files(film_dir)
    assert sorted(n.split("-")[0] for n in lead_in) == ["audio_features", "prompt"], lead_in
    loads = dict(resident.loads)
    assert loads["t5"] == 1 and loads["audio"] == 1 and loads["dit"] == 1, loads

    # the shot finds the film's inputs made: nothing loaded, no encoder time
    result = render_shot_result(job, backend=backend, qc=False)
    assert result["dubbed"] and "encoders" not in result["timings_s"], result["timings_s"]
    assert resident.loads["t5"] == 1 and resident.loads["audio"] == 1
    assert _files(film_dir) == lead_in

    # the same files as the shot's own prep makes (`film_prep: shot`, a fresh work dir)
    other = tmp_path / "other" / "film"
    watch = Stopwatch("cpu", False)
    backend.prompt_embeddings(other, watch)
    backend.audio_features_file(other, film.dialogue, watch)
    assert _files(other) == lead_in


def test_a_resident_model_is_handed_out_while_another_loads(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """`ResidentModels.get` loads outside the set's lock: while one thread loads umT5 (held here until
    released), another thread gets the DiT already resident at once; loads still run one at a time and
    each component is loaded once."""
    import threading
    import types

    import tasks.infinitetalk.resident as it
    from model.weights.loading import LoadSpec

    release, loading = threading.Event(), threading.Event()
    calls: list[tuple[str, ...]] = []

    def fake_load(root, spec):
        calls.append(spec.components)
        if "t5" in spec.components:
            loading.set()
            assert release.wait(10), "the load was never released"
        return types.SimpleNamespace(**{c: f"{c}-model" for c in spec.components})

    monkeypatch.setattr(it, "load_models", fake_load)
    holder = it.ResidentModels()
    spec = LoadSpec(device="cpu")
    assert holder.get(tmp_path, spec, ("dit",)) == {"dit": "dit-model"}
    got: dict = {}
    loader = threading.Thread(target=lambda: got.update(holder.get(tmp_path, spec, ("t5",))))
    loader.start()
    assert loading.wait(10)
    assert holder.get(tmp_path, spec, ("dit",)) == {"dit": "dit-model"}  # not blocked by the t5 load
    late = threading.Thread(target=lambda: got.update(holder.get(tmp_path, spec, ("t5", "audio"))))
    late.start()  # waits for the running load, then loads only what is still missing
    release.set()
    loader.join(10)
    late.join(10)
    assert got == {"t5": "t5-model", "audio": "audio-model"}
    assert calls == [("dit",), ("t5",), ("audio",)] and holder.loads == {"dit": 1, "t5": 1, "audio": 1}
