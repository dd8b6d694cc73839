"""Parity runner for `clip/*` goldens: weights manifests and visual-tower cases.

Architecture sizes come from the weights manifest's `config` when present (the head count is not
stored in the tensors), else from the tensors and presets. Outputs: a [N, 3, S, S] tensor is the
preprocessed image; a token tensor described as all blocks / `use_31_block=False` is checked against
a full-depth tower; any other token tensor against the penultimate-block features InfiniteTalk uses.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from model.checkpoint import read_torch_state, strict_assign
from model.network.clip import (
    ClipImageEncoder,
    ClipVisionConfig,
    build_clip,
    clip_config_from_state,
    convert_state,
    load_clip,
)
from tests.parity.common import assert_close, load_tensors

TOL = 1e-4


def _weights(case_dir: Path, manifest: dict, parity_root: Path) -> tuple[Path, dict]:
    """(.pth file, weights manifest) for a case."""
    ref = manifest.get("weights")
    pth = None
    if isinstance(ref, str) and (case_dir / ref.split()[0]).is_file():
        pth = (case_dir / ref.split()[0]).resolve()
    elif list(case_dir.glob("*.pth")):
        pth = sorted(case_dir.glob("*.pth"))[0]
    else:
        found = sorted((parity_root / case_dir.relative_to(parity_root).parts[0]).rglob("*.pth"))
        assert found, f"{case_dir}: no CLIP .pth found"
        pth = found[0]
    wm = pth.parent / "manifest.json"
    return pth, (json.loads(wm.read_text()) if wm.is_file() else {})


def _config(pth: Path, weights_manifest: dict) -> ClipVisionConfig:
    """Sizes from the tensors; the head count (not stored) from the weights manifest when it has one."""
    cfg = clip_config_from_state(
        read_torch_state(pth), heads=weights_manifest.get("config", {}).get("vision_heads")
    )
    image_size = weights_manifest.get("config", {}).get("image_size")
    return dataclasses.replace(cfg, image_size=image_size) if image_size else cfg


def _run_weights(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    pth, wm = _weights(case_dir, manifest, parity_root)
    cfg = _config(pth, wm or manifest)
    enc = load_clip(pth, dtype=torch.float32, config=cfg)  # strict on every visual key but the last block
    want = (wm or manifest).get("config", {})
    ours = {
        "vision_dim": cfg.dim,
        "vision_layers": cfg.layers,
        "patch_size": cfg.patch_size,
        "image_size": cfg.image_size,
    }
    if "vision_mlp_ratio" in want:
        ours["vision_mlp_ratio"] = cfg.mlp_dim // cfg.dim
    for key, value in ours.items():
        if key in want:
            assert value == want[key], f"config {key}: {value} != manifest {want[key]}"
    state = read_torch_state(pth)
    if "visual_keys" in manifest:
        assert sorted(k for k in state if k.startswith("visual.")) == sorted(manifest["visual_keys"])
    assert enc.model.config.num_hidden_layers == cfg.layers - 1


def _full_depth(pth: Path, cfg: ClipVisionConfig) -> ClipImageEncoder:
    """A tower with every block (for goldens of the un-truncated transformer)."""
    deeper = dataclasses.replace(cfg, layers=cfg.layers + 1)  # build L blocks, drop none
    with torch.device("meta"):
        model = build_clip(deeper)
    state = convert_state(read_torch_state(pth), deeper.layers)
    strict_assign(model, state, source=pth, dtype=torch.float32, device="cpu")
    return ClipImageEncoder(model)


def _run_visual(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    pth, wm = _weights(case_dir, manifest, parity_root)
    cfg = _config(pth, wm)
    enc = load_clip(pth, dtype=torch.float32, config=cfg)
    inputs = load_tensors(case_dir / "inputs.safetensors")
    goldens = load_tensors(case_dir / "outputs.safetensors")
    image = inputs["image"] if "image" in inputs else next(iter(inputs.values()))
    image = image if image.dim() == 5 else image[:, :, None]  # (B, 3, T, H, W)
    for name, golden in goldens.items():
        meaning = str(manifest.get("outputs", {}).get(name, {}).get("meaning", ""))
        if golden.dim() == 4 and golden.shape[1] == 3:
            ours = enc.preprocess(image)
        elif "use_31_block=False" in meaning or "all blocks" in meaning or name.startswith("all_blocks"):
            ours = _full_depth(pth, cfg).encode(image)
        else:
            ours = enc.encode(image)
        assert_close(ours.reshape(golden.shape), golden, TOL, f"{case_dir.name}/{name}")


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    if (case_dir / "outputs.safetensors").is_file():
        _run_visual(case_dir, manifest, parity_root)
    elif "config" in manifest or list(case_dir.glob("*.pth")):
        _run_weights(case_dir, manifest, parity_root)
    else:
        raise AssertionError(f"{case_dir}: unrecognised clip manifest (keys {sorted(manifest)})")
