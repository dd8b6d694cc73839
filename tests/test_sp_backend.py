"""`infinitetalk.gpus_per_shot: 2` on a CPU (gloo, tiny random weights): a shot dubbed by a two-rank
ShotWorker matches the in-process dub, and the ranks are started once for several shots."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tasks.config import load_config
from tasks.errors import ConfigError
from tasks.infinitetalk import ResidentModels, resolve_options
from tasks.render import render_shot_result
from tests.media import decode_all
from tests.test_infinitetalk import SHORT_CHUNKS, _job, resident, ws_root  # noqa: F401 (fixtures)

pytestmark = pytest.mark.distributed

# Ulysses attention over 2 ranks splits the heads into separate attention calls: float32 sums may round
# differently, so decoded uint8 frames may differ by a level or two (measured on this CPU: at most 1 level,
# 384 of 2,764,800 values, mean 0.00014).
MAX_LEVELS = 2


def test_two_gpus_per_shot_match_one_and_start_once(
    tmp_path: Path,
    ws_root: Path,  # noqa: F811
    resident: ResidentModels,  # noqa: F811
):
    """A 3-chunk shot (state handed across chunks) dubbed with gpus_per_shot=2 equals the in-process dub
    within MAX_LEVELS; a second shot reuses the same rank processes (one start, one setup each)."""
    over = ["gate.policy=all", *SHORT_CHUNKS]
    sp = [*over, "infinitetalk.gpus_per_shot=2"]
    one = render_shot_result(_job(tmp_path, ws_root, 0, (0, 16), over, name="one"))
    assert resident.loads["dit"] == 1 and resident.loads["shot_worker"] == 0
    two = render_shot_result(_job(tmp_path, ws_root, 0, (0, 16), sp, name="two"))
    assert one["dubbed"] and two["dubbed"] and one["chunks"] == two["chunks"] == 3
    a, b = decode_all(one["path"]).astype(np.int16), decode_all(two["path"]).astype(np.int16)
    diff = np.abs(a - b)
    assert a.shape == b.shape and diff.max() <= MAX_LEVELS, (diff.max(), np.count_nonzero(diff))
    assert diff.mean() < 0.01, diff.mean()  # rare rounding flips, not a different dub
    assert "sp_chunk" in two["timings_s"] and "dit" not in two["timings_s"]

    first = dict(resident.worker_stats)  # rank 0: describe + 3 chunks since its one setup
    assert first["jobs"] == 4
    again = render_shot_result(_job(tmp_path, ws_root, 4, (210, 215), sp, name="again"))
    assert again["dubbed"] and again["chunks"] == 1
    assert resident.loads["shot_worker"] == 1 and resident.loads["dit"] == 1  # no reload in this process
    assert resident.worker_stats == {"pid": first["pid"], "jobs": 5}  # same process, no second setup
    resident.close()
    with pytest.raises(ProcessLookupError):  # the ranks are joined by close()
        os.kill(first["pid"], 0)


def test_gpus_per_shot_is_validated():
    with pytest.raises(ConfigError, match="gpus_per_shot: must be >= 1"):
        load_config(overrides=["infinitetalk.gpus_per_shot=0"])
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(overrides=["infinitetalk.gpus_per_shot=1.5"])
    cfg = load_config()
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES"):
        resolve_options(cfg, {"gpus_per_shot": 2, "device": "cuda:1"})
    assert resolve_options(cfg, {"gpus_per_shot": 2}).gpus_per_shot == 2
