"""Parity runner for `dit_quant/*` goldens: official quanto fp8 / int8 DiT files.

Each case folder holds `<name>.safetensors` + `<name>.json` (quantization map) and outputs of the
quantized model on a DiT case. The DiT `config.json` is the one under the golden set's `dit/`
folder; the inputs are the files the manifest's `inputs` line names. The model is loaded with
`load_quant_dit` (strict key check around quanto's `requantize`, then dequantize-then-float Linears)
and compared at 1e-4 with every `out*` output (timestep `t0` for `out_t0`, ...).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from model.weights.quant import DequantLinear, load_quant_dit
from tests.parity.common import assert_close, load_tensors

TOL = 1e-4


def _config_dir(parity_root: Path) -> Path:
    found = sorted(p.parent for p in (parity_root / "dit").rglob("config.json"))
    assert found, f"{parity_root / 'dit'}: no DiT config.json"
    return found[0]


def _quant_file(case_dir: Path) -> Path:
    files = [p for p in sorted(case_dir.glob("*.safetensors")) if p.with_suffix(".json").is_file()]
    assert len(files) == 1, f"{case_dir}: expected one quantized safetensors + json pair, found {files}"
    return files[0]


def _inputs(case_dir: Path, manifest: dict) -> dict[str, torch.Tensor]:
    refs = re.findall(r"[\w./-]+\.safetensors", str(manifest.get("inputs", "")))
    assert refs, f"{case_dir}: manifest names no input files"
    out: dict[str, torch.Tensor] = {}
    for ref in refs:
        out.update(load_tensors((case_dir / ref).resolve()))
    return out


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    quant_file = _quant_file(case_dir)
    model = load_quant_dit(_config_dir(parity_root), quant_file, dtype=torch.float32, device="cpu")
    n_quant = sum(isinstance(m, DequantLinear) for m in model.modules())
    if "n_quantized_modules" in manifest:
        assert n_quant == manifest["n_quantized_modules"], f"{n_quant} quantized Linears != manifest"
    goldens = load_tensors(case_dir / "outputs.safetensors")
    inputs = _inputs(case_dir, manifest)

    def batched(t: torch.Tensor, dims: int) -> torch.Tensor:
        return t[None] if t.dim() == dims - 1 else t

    checked = 0
    for name, golden in goldens.items():
        m = re.fullmatch(r"out(?:_(\w+))?", name)
        if not m:
            continue
        t = inputs[m.group(1) or "t"].reshape(1).float()
        with torch.no_grad():
            out = model(
                batched(inputs["x"], 5),
                t,
                batched(inputs["context"], 3),
                inputs["clip_fea"],
                batched(inputs["y"], 5),
                inputs["audio"],
                inputs.get("ref_target_masks"),
            )
        assert_close(out, golden, TOL, f"{case_dir.name}/{name}")
        checked += 1
    assert checked, f"{case_dir}: no out* outputs"
