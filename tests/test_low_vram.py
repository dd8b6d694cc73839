"""Low-VRAM running as a pipeline option: the `offload: auto` rule over device sizes, `LoadSpec(offload=True)`
giving the resident DiT's outputs bit for bit (CPU slot path; CUDA stream path behind the cuda marker), the
backend dubbing a tiny shot identically with offload on, and VAE tiling chosen per call."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from model.config import DIT_PRESETS
from model.network.tiling import TileSpec
from model.runtime.offload import (
    OTHER_MODELS_BYTES,
    RESERVE_BYTES,
    T5_BYTES,
    DeviceMemoryError,
    OffloadedBlock,
    decide_offload,
    dit_weight_bytes,
    dit_weight_split,
    memo_bytes,
    resident_need,
    working_bytes_per_token,
)
from tasks.config.pipeline import load_config
from tasks.errors import ConfigError
from tasks.infinitetalk import ResidentModels, VaeTiling, load_spec, offload_decision, resolve_options
from tasks.infinitetalk.options import memory_need
from tasks.infinitetalk.settings import section_config
from tasks.picture.geometry import BUCKET_TABLES
from tasks.render.shot import render_shot_result
from tasks.timeline.shot_key import shot_settings
from tests.media import decode_all
from tests.test_infinitetalk import _job, resident, ws_root  # noqa: F401 (fixtures)

GIB = 2**30
OPTS = section_config(load_config())


def _opts(**changes) -> object:
    return dataclasses.replace(OPTS, **changes)


# ------------------------------------------------------------------------------ the auto rule


def test_resident_need_covers_every_measured_peak():
    """The working-set constants come from benchmarks/RESULTS.md: for every measured H200 peak (DiT only,
    bench token counts) the estimate without the other models and reserve is at least the peak."""
    c14 = DIT_PRESETS["infinitetalk-14b"]
    bf16 = dit_weight_bytes(c14, torch.bfloat16, fp8_blocks=False, quantized=False)
    fp8 = dit_weight_bytes(c14, torch.bfloat16, fp8_blocks=True, quantized=False)
    assert abs(bf16 / GIB - 35.2) < 0.1  # "Peak memory includes the 35.2 GiB of bf16 weights"
    assert fp8 < bf16 / 1.9  # block Linears are ~98% of the weights
    measured = [  # (tokens, fp8 blocks, compiled, batched 3-call, peak GiB): RESULTS.md speed-path table
        (32_760, False, False, False, 40.5),
        (32_760, False, True, False, 37.8),
        (32_760, False, True, True, 42.7),
        (75_600, False, False, False, 47.3),
        (75_600, False, True, False, 41.0),
        (32_760, True, False, False, 27.4),  # unfused activation quantization
        (32_760, True, True, False, 20.9),
        (32_760, True, True, True, 27.3),
        (75_600, True, True, False, 25.4),
    ]
    for tokens, is_fp8, compiled, batched, peak in measured:
        per_token = working_bytes_per_token(fp8_blocks=is_fp8, compiled=compiled, batched=batched)
        weights = fp8 if is_fp8 else bf16
        need = resident_need(weights, tokens, per_token=per_token, other_bytes=0) - RESERVE_BYTES
        assert peak * GIB <= need <= (peak + 3) * GIB, (tokens, is_fp8, compiled, batched, peak, need / GIB)


# (changes to the default infinitetalk section, usable device GiB, offload?)
CARDS = [
    ({"mode": "infinitetalk-480", "fp8_compute": True}, 23.99, True),  # RTX 4090, the 24 GB target
    ({"mode": "infinitetalk-480", "fp8_compute": True}, 39.4, False),  # A100 40GB: 27.4 GiB peak measured
    ({"mode": "infinitetalk-480"}, 39.4, True),  # bf16 weights alone are 35.2 GiB
    ({"mode": "infinitetalk-480"}, 47.5, False),  # 48 GB card: 42.7 GiB peak measured
    ({"mode": "infinitetalk-480", "t5_cpu": False}, 47.5, True),  # + umT5-XXL on the device
    ({"mode": "infinitetalk-480", "quant": "int8"}, 23.99, True),
    ({"mode": "infinitetalk-480", "quant": "int8"}, 39.4, False),
    ({"mode": "infinitetalk-720", "compile": False}, 47.5, True),  # 47.3 GiB peak measured eager
    # compiled: 41.0 GiB DiT peak measured, + 2.0 GiB VAE/CLIP/wav2vec2 + the float32 memo of the
    # conditioning encode at the largest 720P bucket (held for the whole shot): no longer fits 48 GB
    ({"mode": "infinitetalk-720"}, 47.5, True),
    ({"mode": "infinitetalk-480", "fp8_compute": True, "batch_branches": True}, 23.99, True),
    ({"mode": "infinitetalk-480", "fp8_compute": True, "batch_branches": True}, 39.4, False),  # 27.3 GiB
    ({"mode": "infinitetalk-720"}, 79.1, False),  # H100 80GB
    ({"mode": "infinitetalk-720", "fp8_compute": True}, 139.8, False),  # H200
    ({"mode": "tiny"}, 2.0, False),
]


@pytest.mark.parametrize(("changes", "gib", "expected"), CARDS)
def test_auto_offload_over_device_sizes(changes, gib, expected):
    d = offload_decision(_opts(**changes), "cuda:0", limit_bytes=int(gib * GIB))
    assert d.offload is expected
    assert d.reason.startswith("auto: device") and f"{gib:.1f} GiB" in d.reason and "needs ~" in d.reason


FAST_480 = {"mode": "infinitetalk-480", "preset": "fast", "fp8_compute": True, "vae_dtype": "bfloat16"}


@pytest.mark.parametrize("gib", [23.99, 16.0])
def test_fast_preset_offloads_under_24_and_16_gib_caps(gib):
    """The fast preset (fp8 blocks, bf16 VAE) on a 24 GiB or 16 GiB cap: too big resident (~25 GiB with
    every resident piece), offloaded it fits; the reason names both figures."""
    opts = _opts(**FAST_480)
    need = memory_need(opts, "cuda:0")
    assert need.offloaded < 16 * GIB < 24 * GIB < need.resident
    d = offload_decision(opts, "cuda:0", limit_bytes=int(gib * GIB))
    assert d.offload and "blocks streamed" in d.reason and f"{need.resident / GIB:.1f} GiB" in d.reason
    quality = _opts(mode="infinitetalk-480", vae_dtype="float32")  # bf16 blocks, float32 VAE
    assert offload_decision(quality, "cuda:0", limit_bytes=16 * GIB).offload


def test_every_resident_piece_is_counted():
    """umT5 on the device, the conditioning-encode memo (float32 twice bf16's) and the batched guidance
    working set each raise the estimate by their own size; offload keeps only two blocks of weights."""
    base = _opts(**FAST_480)
    need = memory_need(base, "cuda:0")
    t5 = memory_need(dataclasses.replace(base, t5_cpu=False), "cuda:0")
    assert t5.other - need.other == T5_BYTES and t5.resident - need.resident == T5_BYTES
    f32 = memory_need(dataclasses.replace(base, vae_dtype="float32"), "cuda:0")
    h, w = max(BUCKET_TABLES["480"].values(), key=lambda hw: hw[0] * hw[1])  # 1088 x 384
    f32_memo, bf16_memo = memo_bytes(h, w, 81, torch.float32), memo_bytes(h, w, 81, torch.bfloat16)
    assert f32.other - need.other == f32_memo - bf16_memo
    # the measured memo: 1.48 GiB float32 / 0.74 GiB bfloat16 at 896x448, 81 frames
    assert abs(memo_bytes(448, 896, 81, torch.float32) / GIB - 1.48) < 0.02
    assert abs(memo_bytes(448, 896, 81, torch.bfloat16) / GIB - 0.74) < 0.02
    batched = memory_need(dataclasses.replace(base, batch_branches=True), "cuda:0")
    assert batched.working == 3 * need.working
    c14 = DIT_PRESETS["infinitetalk-14b"]
    rest, block = dit_weight_split(c14, torch.bfloat16, fp8_blocks=True, quantized=False)
    assert need.dit_offloaded == rest + 2 * block and need.dit_resident == rest + c14.num_layers * block
    total = dit_weight_bytes(c14, torch.bfloat16, fp8_blocks=True, quantized=False)
    assert 0 <= need.dit_resident - total < 1e-3 * total  # the slot layout's 256-byte alignment only


def test_cap_too_small_for_any_mode_is_one_line_before_loading():
    opts = _opts(**FAST_480)
    need = memory_need(opts, "cuda:0")
    for setting in ("auto", True):
        with pytest.raises(DeviceMemoryError) as err:
            offload_decision(dataclasses.replace(opts, offload=setting), "cuda:0", limit_bytes=4 * GIB)
        line = str(err.value)
        assert "\n" not in line and line.startswith("cuda:0: 4.0 GiB usable is too small for any mode")
        assert f"~{need.offloaded / GIB:.1f} GiB" in line and "working set" in line
    # just enough for the offloaded run: no error; forced false is the user's call
    assert offload_decision(opts, "cuda:0", limit_bytes=need.offloaded).offload
    assert not offload_decision(dataclasses.replace(opts, offload=False), "cuda:0", limit_bytes=GIB).offload


def test_offload_setting_forced_and_never_on_cpu():
    assert not offload_decision(_opts(mode="infinitetalk-720"), "cpu").offload  # auto: never on a CPU
    assert offload_decision(_opts(offload=True), "cpu").offload  # forced: the CPU slot path
    assert offload_decision(_opts(offload=True, mode="infinitetalk-480"), "cuda").reason == (
        "forced by offload: true"
    )
    assert not offload_decision(_opts(offload=False, mode="infinitetalk-720"), "cuda").offload
    d = decide_offload("auto", device_type="cuda", limit_bytes=10 * GIB, need_bytes=10 * GIB + 1)
    assert d.offload and "10.0 GiB" in d.reason
    assert not decide_offload("auto", device_type="cuda", limit_bytes=10 * GIB, need_bytes=10 * GIB).offload
    with pytest.raises(ValueError, match="auto, true or false"):
        decide_offload("yes", device_type="cuda", limit_bytes=1, need_bytes=0)
    # the spec carries the decision; the reason is not part of its identity (ResidentModels keys on it)
    spec = load_spec(_opts(offload=True), "cpu")
    assert spec.offload and spec.offload_reason
    assert spec == dataclasses.replace(spec, offload_reason="other words")
    assert spec != dataclasses.replace(spec, offload=False)
    assert OTHER_MODELS_BYTES < 3 * GIB


def test_config_keys_validated_and_offload_outside_the_shot_key():
    base = load_config()
    assert (
        base.sections["infinitetalk"]["offload"] == "auto"
        and base.sections["infinitetalk"]["vae_tiling"] == "auto"
    )
    with pytest.raises(ConfigError, match="infinitetalk.offload"):
        load_config(overrides=["infinitetalk.offload=maybe"])
    with pytest.raises(ConfigError, match="vae_tile_px"):
        resolve_options(load_config(overrides=["infinitetalk.vae_tile_px=48"]))
    settings = shot_settings(base.to_dict(), 0)
    on = load_config(overrides=["infinitetalk.offload=true"])
    assert shot_settings(on.to_dict(), 0) == settings  # same pixels: same shot keys
    tiled = load_config(overrides=["infinitetalk.vae_tiling=true"])
    assert shot_settings(tiled.to_dict(), 0) != settings  # tiles change pixels


def test_vae_tiling_rule():
    f32 = torch.float32
    auto = VaeTiling()
    assert auto.spec_for(720, 1280, device_type="cpu", free_bytes=None, dtype=f32) is None
    assert auto.spec_for(720, 1280, device_type="cuda", free_bytes=80 * GIB, dtype=f32) is None
    short = auto.spec_for(720, 1280, device_type="cuda", free_bytes=4 * GIB, dtype=f32)
    assert short is not None and short.stride == short.tile - 64
    assert (
        auto.spec_for(720, 1280, device_type="cuda", free_bytes=4 * GIB, dtype=torch.bfloat16).tile
        > short.tile
    )
    forced = VaeTiling(True, 128)
    assert forced.spec_for(64, 64, device_type="cpu", free_bytes=None, dtype=f32) == TileSpec(128, 96)
    assert VaeTiling(False).spec_for(720, 1280, device_type="cuda", free_bytes=1, dtype=f32) is None


# ------------------------------------------------------------------------------ the backend


def test_backend_dubs_identically_with_offload_and_tiles_when_asked(
    tmp_path: Path,
    ws_root: Path,  # noqa: F811
    resident: ResidentModels,  # noqa: F811
    caplog,
):
    """One short tiny shot: `--set infinitetalk.offload=true` gives the same frames as resident (one load,
    the decision logged once); `vae_tiling=true` with small tiles really tiles (logged; pixels move a little)."""
    caplog.set_level(logging.INFO)
    over = ["gate.policy=all"]
    span = (0, 5)
    plain = render_shot_result(_job(tmp_path, ws_root, 0, span, over, name="plain"))
    caplog.clear()
    off = render_shot_result(_job(tmp_path, ws_root, 0, span, [*over, "infinitetalk.offload=true"], "off"))
    assert plain["dubbed"] and off["dubbed"]
    assert np.array_equal(decode_all(plain["path"]), decode_all(off["path"]))
    assert resident.loads["dit"] == 2  # another LoadSpec: the resident set is replaced, loaded once
    assert isinstance(resident._components["dit"].blocks[0], OffloadedBlock)
    decisions = [
        r.getMessage() for r in caplog.records if r.name == "model.weights.loading" and "offload" in r.message
    ]
    assert decisions == ["DiT block offload on (forced by offload: true)"]

    caplog.clear()
    tiled_over = [*over, "infinitetalk.vae_tiling=true", "infinitetalk.vae_tile_px=32"]
    tiled = render_shot_result(_job(tmp_path, ws_root, 0, span, tiled_over, "tiled"))
    assert any("in 32 px tiles every 24 px (vae_tiling: true)" in r.getMessage() for r in caplog.records)
    a, b = decode_all(plain["path"]).astype(np.int16), decode_all(tiled["path"]).astype(np.int16)
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_gguf_dits_are_estimated_at_their_bytes_per_weight():
    """A GGUF DiT's quantized Linears count at their type's bytes (Q4_K 144 B / 256 weights): Q4_K <
    int8 (1 byte + a scale per row) < Q8_0 (34 B / 32) < bf16; the Q4_K quality preset fits 24 GiB resident."""
    need = {q: memory_need(_opts(mode="infinitetalk-480", quant=q), "cuda:0").dit_resident
            for q in ("gguf-Q4_K_M", "gguf-Q8_0", "int8", "none", "gguf-BF16")}  # fmt: skip
    assert need["gguf-Q4_K_M"] < need["int8"] < need["gguf-Q8_0"] < need["none"] == need["gguf-BF16"]
    assert abs(need["gguf-Q4_K_M"] / need["gguf-Q8_0"] - (144 / 256) / (34 / 32)) < 0.05
    assert not offload_decision(
        _opts(mode="infinitetalk-480", quant="gguf-Q4_K"), "cuda:0", limit_bytes=24 * GIB
    ).offload
