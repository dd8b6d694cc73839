"""Parity runner for `vae/*` goldens: weights manifests and encode/decode cases.

Dispatch is on manifest content: a manifest with `config` / `n_params` describes a weights file
(strict load, parameter count, architecture, scale constants); one with `inputs` and `outputs`
is an encode/decode case. Each output is matched to its input by name (`enc_X` <- `X`,
`dec_X[_unclamped]` <- `z_X`), else by shape; 16-channel outputs are encodes, 3-channel decodes.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from model.network.vae import LATENT_MEAN, LATENT_STD, WanVAE, load_vae
from tests.parity.common import assert_close, load_tensors

TOL = 1e-4


def _weights_file(case_dir: Path, manifest: dict, parity_root: Path) -> Path:
    ref = manifest.get("weights")
    if isinstance(ref, str):
        candidate = (case_dir / ref.split()[0]).resolve()
        if candidate.is_file():
            return candidate
    own = sorted(case_dir.glob("*.pth"))
    if own:
        return own[0]
    found = sorted((parity_root / case_dir.relative_to(parity_root).parts[0]).rglob("*.pth"))
    assert found, f"{case_dir}: no VAE .pth found"
    return found[0]


def _run_weights(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    pth = _weights_file(case_dir, manifest, parity_root)
    vae = load_vae(pth, dtype=torch.float32)  # strict: every key and shape must match
    cfg = vae.model.cfg
    n_params = sum(p.numel() for p in vae.model.parameters())
    if "n_params" in manifest:
        assert n_params == manifest["n_params"], f"{n_params} parameters != manifest {manifest['n_params']}"
    want = manifest.get("config", {})
    ours = {
        "dim": cfg.dim,
        "z_dim": cfg.z_dim,
        "dim_mult": list(cfg.dim_mult),
        "num_res_blocks": cfg.num_res_blocks,
        "attn_scales": list(cfg.attn_scales),
        "temperal_downsample": list(cfg.temporal_downsample),
    }
    for key, value in ours.items():
        if key in want:
            assert value == want[key], f"config {key}: {value} != manifest {want[key]}"
    consts = manifest.get("scale_constants", {})
    for key, ours_c in (("mean", LATENT_MEAN), ("std", LATENT_STD)):
        if key in consts:
            assert list(ours_c) == consts[key], f"latent {key} constants differ from the manifest"


def _pair(name: str, inputs: dict[str, torch.Tensor], want_channels: int, fits) -> str:
    base = re.sub(r"^(enc|dec)_|_(unclamped|clamped)$", "", name)
    for cand in (base, f"z_{base}", base.removeprefix("z_")):
        if cand in inputs and inputs[cand].shape[-4] == want_channels and fits(inputs[cand]):
            return cand
    matches = [k for k, v in inputs.items() if v.shape[-4] == want_channels and fits(v)]
    assert len(matches) == 1, f"cannot tell which input produced {name}: candidates {matches}"
    return matches[0]


def _run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    vae: WanVAE = load_vae(_weights_file(case_dir, manifest, parity_root), dtype=torch.float32)
    inputs = load_tensors(case_dir / "inputs.safetensors")
    goldens = load_tensors(case_dir / "outputs.safetensors")
    z = vae.z_dim
    checked = 0
    for name, golden in goldens.items():
        meaning = str(manifest.get("outputs", {}).get(name, {}).get("meaning", ""))
        g = golden if golden.dim() == 5 else golden[None]
        c, t, h, w = g.shape[1:]
        if c == z:  # an encode: input video (3, 1 + 4(t-1), 8h, 8w)
            src = _pair(
                name,
                inputs,
                3,
                lambda v, t=t, h=h, w=w: tuple(v.shape[-3:]) == (1 + 4 * (t - 1), 8 * h, 8 * w),
            )
            video = inputs[src] if inputs[src].dim() == 5 else inputs[src][None]
            ours = vae.encode(video)
        elif c == 3:  # a decode of a latent (z, (t + 3) / 4, h / 8, w / 8)
            src = _pair(
                name,
                inputs,
                z,
                lambda v, t=t, h=h, w=w: tuple(v.shape[-3:]) == (1 + (t - 1) // 4, h // 8, w // 8),
            )
            latent = inputs[src] if inputs[src].dim() == 5 else inputs[src][None]
            clamp = "unclamped" not in name and "unclamped" not in meaning
            ours = vae.decode(latent, clamp=clamp)
        else:
            raise AssertionError(f"{case_dir.name}/{name}: unexpected channel count {c}")
        assert_close(ours.reshape(golden.shape), golden, TOL, f"{case_dir.name}/{name}")
        checked += 1
    assert checked, f"{case_dir}: no outputs checked"


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    if (case_dir / "outputs.safetensors").is_file() and (case_dir / "inputs.safetensors").is_file():
        _run_case(case_dir, manifest, parity_root)
    elif "config" in manifest or "n_params" in manifest or list(case_dir.glob("*.pth")):
        _run_weights(case_dir, manifest, parity_root)
    else:
        raise AssertionError(f"{case_dir}: unrecognised vae manifest (keys {sorted(manifest)})")
