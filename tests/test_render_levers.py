"""The lossless speed levers outside the DiT (issue 49): the chunk's paste back on a thread pool
(`pipeline.composite_workers`) and the film's prep (umT5 prompt embedding, wav2vec2 features) in the group's
lead-in beside the compile warm-up (`infinitetalk.film_prep`). Each must leave the output bytes as they were.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tasks.config import load_config
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


def test_composite_workers_is_checked_and_not_in_the_shot_key():
    cfg = load_config()
    assert cfg.pipeline.composite_workers == 4
    with pytest.raises(ConfigError, match="pipeline.composite_workers: must be >= 1"):
        load_config(overrides=["pipeline.composite_workers=0"])
    one = load_config(overrides=["pipeline.composite_workers=1"])
    assert shot_settings(one.to_dict(), 0) == shot_settings(cfg.to_dict(), 0)
