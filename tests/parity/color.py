"""Parity runner for `color/` goldens: colour transfer (match_and_blend) and bucket/resize cases.

Dispatches on manifest content, not case names:
* a manifest whose outputs are named `strength_<s>` and whose inputs hold a video chunk and a
  reference image -> `tasks.picture.color.match_and_blend` at each strength (1e-5 absolute);
* a manifest with `cases` carrying `source_hw` -> bucket choice, resize/crop sizes, sha256 and
  channel means of full outputs, and every stored tensor (subsamples, small full outputs, the
  nearest-resize tensor path) exactly.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import torch

from tasks.picture.color import match_and_blend
from tasks.picture.geometry import (
    BUCKET_TABLES,
    CropGeometry,
    choose_bucket,
    resize_and_centercrop,
    resize_and_centercrop_tensor,
)
from tests.parity.common import load_tensors

COLOR_ATOL = 1e-5
_TABLE_OF = {"ASPECT_RATIO_627": "480", "ASPECT_RATIO_960": "720"}


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    if "cases" in manifest and any("source_hw" in c for c in manifest["cases"]):
        _run_buckets(case_dir, manifest)
    elif any(re.match(r"strength_", k) for k in manifest.get("outputs", {})):
        _run_match_and_blend(case_dir, manifest)
    else:
        raise AssertionError(f"{case_dir}: unrecognised colour manifest (keys {sorted(manifest)})")


def _strength_of(name: str, meta: dict) -> float:
    m = re.fullmatch(r"strength_([0-9.]+)", name)
    if m:
        return float(m[1])
    m = re.search(r",\s*([0-9.]+)\)", meta.get("meaning", ""))
    assert m, f"cannot find the strength of output {name}"
    return float(m[1])


def _run_match_and_blend(case_dir: Path, manifest: dict) -> None:
    inputs = load_tensors(case_dir / "inputs.safetensors")
    outputs = load_tensors(case_dir / "outputs.safetensors")
    video_key = next(k for k, v in inputs.items() if v.dim() >= 4 and v.shape[-3] > 1)
    ref_key = next(k for k in inputs if k != video_key)
    video, ref = inputs[video_key], inputs[ref_key]
    for name, meta in manifest["outputs"].items():
        strength = _strength_of(name, meta)
        got = match_and_blend(video, ref, strength)
        want = outputs[name]
        assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.shape} {got.dtype}"
        err = float((got.double() - want.double()).abs().max())
        assert err <= COLOR_ATOL, f"{case_dir.name}/{name}: max abs error {err:.3e} > {COLOR_ATOL:.0e}"
        # the unbatched API must agree with the batched one
        if video.dim() == 5 and video.shape[0] == 1:
            single = match_and_blend(video[0], ref[0], strength)
            assert torch.equal(single, got[0])
    if "strength_0.0" not in manifest["outputs"]:
        assert match_and_blend(video, ref, 0.0) is video


def _pattern(h: int, w: int) -> np.ndarray:
    """The manifest's synthetic source image (uint8 H x W x 3, int64 math)."""
    y = np.arange(h, dtype=np.int64)[:, None]
    x = np.arange(w, dtype=np.int64)[None, :]
    r = (x * 251 // w + 37 * ((y // 16 + x // 16) % 2)) % 256
    g = (y * 251 // h + (x * y) % 23) % 256
    b = ((x + 2 * y) * 7) % 256
    return np.stack(np.broadcast_arrays(r, g, b), axis=-1).astype(np.uint8)


def _as_official(out: np.ndarray) -> np.ndarray:
    """(th, tw, 3) -> the official [1, 3, 1, th, tw] C-order layout."""
    return np.ascontiguousarray(out.transpose(2, 0, 1)[None, :, None])


def _run_buckets(case_dir: Path, manifest: dict) -> None:
    tensors = (
        load_tensors(case_dir / "outputs.safetensors") if (case_dir / "outputs.safetensors").exists() else {}
    )
    images: dict[tuple[int, int], np.ndarray] = {}
    for case in manifest["cases"]:
        h, w = case["source_hw"]
        img = images.setdefault((h, w), _pattern(h, w))
        for table_name in BUCKET_TABLES:
            if table_name not in case:
                continue
            exp = case[table_name]
            if "table" in exp:
                assert _TABLE_OF.get(exp["table"], table_name) == table_name
            key, target = choose_bucket(h, w, table_name)
            assert key == exp["key"], f"{h}x{w} {table_name}: bucket {key} != {exp['key']}"
            assert list(target) == exp["target_hw"]
            if "resized_hw_before_crop" in exp:
                assert list(CropGeometry.cover((h, w), target).scaled_hw) == exp["resized_hw_before_crop"]
            out = _as_official(resize_and_centercrop(img, target))
            if "output_shape" in exp:
                assert list(out.shape) == exp["output_shape"]
            if "output_sha256" in exp:
                assert hashlib.sha256(out.tobytes()).hexdigest() == exp["output_sha256"], (
                    f"{h}x{w} {table_name}"
                )
            if "output_channel_means" in exp:
                means = out.reshape(3, -1).astype(np.float64).mean(axis=1)
                np.testing.assert_allclose(means, exp["output_channel_means"], rtol=0, atol=1e-9)
    for name, want in tensors.items():
        m = re.fullmatch(r"(\d+)x(\d+)_(.+)", name)
        assert m, f"unrecognised tensor name {name}"
        h, w, rest = int(m[1]), int(m[2]), m[3]
        img = images.setdefault((h, w), _pattern(h, w))
        sub = re.fullmatch(r"(\w+?)_every(\d+)", rest)
        if sub and sub[1] in BUCKET_TABLES:
            _, target = choose_bucket(h, w, sub[1])
            step = int(sub[2])
            got = torch.from_numpy(
                _as_official(resize_and_centercrop(img, target))[0, :, 0, ::step, ::step].copy()
            )
        elif "tensor" in rest:
            src = torch.from_numpy(img.transpose(2, 0, 1).astype(np.float32))
            got = resize_and_centercrop_tensor(src, tuple(want.shape[-2:]))
        else:
            got = torch.from_numpy(_as_official(resize_and_centercrop(img, tuple(want.shape[-2:]))))
        assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.shape} {got.dtype}"
        assert torch.equal(got, want), f"{name}: {(got.double() - want.double()).abs().max()} max difference"
