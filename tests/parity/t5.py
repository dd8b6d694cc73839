"""Parity runner for `t5/*` goldens: weights manifests and encoder cases.

Weights: strict load of the official-named `.pth` into `UMT5EncoderModel`, sizes vs the manifest.
Encoder cases: `ids`/`mask` in; every [B, L, D] output is the full hidden states, every
`<name>_<i>` output of rank 2 is sequence i trimmed to its real length (the official wrapper).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from model.checkpoint import read_torch_state
from model.network.t5 import T5TextEncoder, load_umt5, t5_config_from_state
from tests.parity.common import assert_close, load_tensors

TOL = 1e-4


def _weights_file(case_dir: Path, manifest: dict, parity_root: Path) -> Path:
    ref = manifest.get("weights")
    if isinstance(ref, str) and (case_dir / ref.split()[0]).is_file():
        return (case_dir / ref.split()[0]).resolve()
    own = sorted(case_dir.glob("*.pth"))
    if own:
        return own[0]
    found = sorted((parity_root / case_dir.relative_to(parity_root).parts[0]).rglob("*.pth"))
    assert found, f"{case_dir}: no umT5 .pth found"
    return found[0]


def _encoder(pth: Path) -> tuple[T5TextEncoder, dict]:
    official = read_torch_state(pth)
    model = load_umt5(pth, dtype=torch.float32)  # strict: every key and shape must match
    return T5TextEncoder(model, tokenizer=None), {"cfg": t5_config_from_state(official), "official": official}


def _run_weights(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    pth = _weights_file(case_dir, manifest, parity_root)
    enc, info = _encoder(pth)
    cfg = info["cfg"]
    want = manifest.get("config", {})
    ours = {
        "vocab_size": cfg.vocab_size,
        "dim": cfg.dim,
        "dim_attn": cfg.dim_attn,
        "dim_ffn": cfg.dim_ffn,
        "num_heads": cfg.num_heads,
        "encoder_layers": cfg.num_layers,
        "num_buckets": cfg.num_buckets,
    }
    for key, value in ours.items():
        if key in want:
            assert value == want[key], f"config {key}: {value} != manifest {want[key]}"
    n_file = sum(t.numel() for t in info["official"].values())
    n_model = sum(p.numel() for p in enc.model.parameters())
    assert n_model == n_file, f"model has {n_model} parameters, file {n_file} (tied embedding counted once)"


def _run_encoder(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    enc, _ = _encoder(_weights_file(case_dir, manifest, parity_root))
    inputs = load_tensors(case_dir / "inputs.safetensors")
    goldens = load_tensors(case_dir / "outputs.safetensors")
    ids = inputs["ids"] if "ids" in inputs else next(v for v in inputs.values() if v.dtype == torch.int64)
    mask = inputs.get("mask", torch.ones_like(ids))
    with torch.no_grad():
        full = enc.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, D)
    trimmed = enc.encode_ids(ids, mask)
    checked = 0
    for name, golden in goldens.items():
        m = re.fullmatch(r".*_(\d+)", name)
        if golden.dim() == 3:
            assert_close(full, golden, TOL, f"{case_dir.name}/{name}")
        elif golden.dim() == 2 and m:
            i = int(m.group(1))
            assert trimmed[i].shape == golden.shape, f"{name}: trimmed to {tuple(trimmed[i].shape)}"
            assert_close(trimmed[i], golden, TOL, f"{case_dir.name}/{name}")
        else:
            continue
        checked += 1
    assert checked, f"{case_dir}: no outputs recognised"
    if "real_lengths" in manifest:
        assert [t.shape[0] for t in trimmed] == manifest["real_lengths"], "trimmed lengths differ"


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    if (case_dir / "outputs.safetensors").is_file():
        _run_encoder(case_dir, manifest, parity_root)
    elif "config" in manifest or list(case_dir.glob("*.pth")):
        _run_weights(case_dir, manifest, parity_root)
    else:
        raise AssertionError(f"{case_dir}: unrecognised t5 manifest (keys {sorted(manifest)})")
