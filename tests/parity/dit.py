"""Parity runner for `dit/*` goldens: forward calls (+ intermediates), TeaCache replays, weights, inputs.

Dispatches on manifest content, never on case folder names, shapes or counts:
  * `runs` with recorded `calls`           -> TeaCache replay (outputs + compute/reuse flags)
  * `outputs` + `call`                     -> forward parity at every recorded timestep, + intermediates
  * `n_params` / `audio_keys` / `files`     -> strict load through `load_dit`, parameter count, key split
  * `tensors` only                          -> shared input sanity (shape, dtype, finite)
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from model.checkpoint import safetensors_keys
from model.network.dit import InfiniteTalkDiT
from model.network.dit_blocks import reference_attention_map, token_masks
from model.network.teacache import TeaCache, TeaCacheConfig
from model.weights.dit_loader import load_dit
from model.weights.layout import DIT_STEM
from tests.parity.common import assert_close, load_tensors

TOL = 1e-4
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
}


# ---------------------------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------------------------


def _leading_path(text: str) -> str:
    """'../weights (official layout ...)' -> '../weights'."""
    return text.strip().split()[0]


def _weights_dir(case_dir: Path, manifest: dict, parity_root: Path) -> Path:
    ref = manifest.get("weights")
    if isinstance(ref, str):
        candidate = (case_dir / _leading_path(ref)).resolve()
        if (candidate / "config.json").is_file():
            return candidate
    for config in sorted((parity_root / case_dir.relative_to(parity_root).parts[0]).rglob("config.json")):
        if list(config.parent.glob(f"{DIT_STEM}*.safetensors")):
            return config.parent
    raise AssertionError(f"{case_dir}: no DiT weights folder found")


def _infinitetalk_file(weights_dir: Path) -> Path:
    files = [p for p in sorted(weights_dir.glob("*.safetensors")) if not p.name.startswith(DIT_STEM)]
    assert len(files) == 1, f"{weights_dir}: expected one InfiniteTalk safetensors file, found {files}"
    return files[0]


def _load_model(case_dir: Path, manifest: dict, parity_root: Path) -> InfiniteTalkDiT:
    weights = _weights_dir(case_dir, manifest, parity_root)
    return load_dit(weights, _infinitetalk_file(weights), dtype=torch.float32, device="cpu")


def _inputs(case_dir: Path, manifest: dict) -> dict[str, torch.Tensor]:
    """inputs.safetensors plus `external_inputs` ("<path> (tensor '<name>')")."""
    out = load_tensors(case_dir / "inputs.safetensors") if (case_dir / "inputs.safetensors").is_file() else {}
    for name, ref in manifest.get("external_inputs", {}).items():
        tensor_name = re.search(r"tensor '([^']+)'", ref)
        out[name] = load_tensors(case_dir / _leading_path(ref))[tensor_name.group(1) if tensor_name else name]
    return out


def _batched(t: torch.Tensor, dims: int) -> torch.Tensor:
    return t[None] if t.dim() == dims - 1 else t


# ---------------------------------------------------------------------------------------------
# forward parity
# ---------------------------------------------------------------------------------------------


class _Recorder:
    """Forward hooks keeping the last output of selected submodules."""

    def __init__(self, model: InfiniteTalkDiT):
        self.outputs: dict[str, object] = {}
        names = [
            "patch_embedding",
            "time_embedding",
            "time_projection",
            "text_embedding",
            "img_emb",
            "audio_proj",
            "head",
        ]
        for i in range(len(model.blocks)):
            names += [f"blocks.{i}", f"blocks.{i}.self_attn", f"blocks.{i}.audio_cross_attn"]
        modules = dict(model.named_modules())
        self.handles = [modules[n].register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def run(module, args, output):
            self.outputs[name] = output

        return run

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def _intermediate(
    base: str, rec: _Recorder, model: InfiniteTalkDiT, masks: torch.Tensor | None, grid_hw: tuple[int, int]
) -> torch.Tensor | None:
    """Our value for a golden intermediate name (without its timestep suffix); None if unknown."""
    simple = {
        "patch_embedding_out": "patch_embedding",
        "time_embedding_e": "time_embedding",
        "text_embedding_out": "text_embedding",
        "img_emb_out": "img_emb",
        "audio_proj_out": "audio_proj",
        "head_out": "head",
    }
    out = rec.outputs
    if base in simple:
        return out[simple[base]]
    if base == "time_projection_e0":
        return out["time_projection"].unflatten(1, (6, -1))
    m = re.fullmatch(r"block(\d+)_(out|audio_cross_attn_out|x_ref_attn_map)", base)
    if not m:
        return None
    i, what = int(m.group(1)), m.group(2)
    if what == "out":
        return out[f"blocks.{i}"]
    if what == "audio_cross_attn_out":
        return out[f"blocks.{i}.audio_cross_attn"]
    # the official model computes this map in every block; ours only for two speakers -> recompute
    _, q, k = out[f"blocks.{i}.self_attn"]
    mask = masks if masks.dim() == 4 else masks[None]
    tm = token_masks(mask, grid_hw)
    return reference_attention_map(q, k, tm, model.config.ref_map_head_splits)[0]


def _run_forward(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    model = _load_model(case_dir, manifest, parity_root)
    inputs = _inputs(case_dir, manifest)
    goldens = load_tensors(case_dir / "outputs.safetensors")
    inter_file = case_dir / "intermediates.safetensors"
    inter = load_tensors(inter_file) if inter_file.is_file() else {}
    x = _batched(inputs["x"], 5)
    context = _batched(inputs["context"], 3)
    y = _batched(inputs["y"], 5)
    masks = inputs.get("ref_target_masks")
    p = model.config.patch_size
    grid = (x.shape[2] // p[0], x.shape[3] // p[1], x.shape[4] // p[2])
    if "seq_len" in inputs:
        assert int(inputs["seq_len"].reshape(-1)[0]) == grid[0] * grid[1] * grid[2], "seq_len != token count"

    out_names = [n for n in manifest["outputs"] if re.fullmatch(r"out(_.+)?", n)]
    assert out_names, f"{case_dir}: no out* outputs in manifest"
    n_inter = 0
    for name in out_names:
        suffix = name[3:]  # '' or '_t0'
        t_name = "t" if not suffix else suffix[1:]
        t_value = inputs[t_name] if t_name in inputs else torch.tensor([manifest["config"][t_name]])
        rec = _Recorder(model)
        try:
            with torch.no_grad():
                out = model(
                    x, t_value.reshape(1).float(), context, inputs["clip_fea"], y, inputs["audio"], masks
                )
            assert_close(out, goldens[name], TOL, f"{case_dir.name}/{name}")
            for inter_name, golden in inter.items():
                if suffix and not inter_name.endswith(suffix):
                    continue
                if not suffix and any(inter_name.endswith(n[3:]) for n in out_names if n != name):
                    continue
                base = inter_name[: len(inter_name) - len(suffix)] if suffix else inter_name
                with torch.no_grad():
                    ours = _intermediate(base, rec, model, masks, grid[1:])
                if ours is None:
                    continue  # an intermediate this runner does not know: outputs are still checked
                assert_close(ours, golden, TOL, f"{case_dir.name}/{inter_name}")
                n_inter += 1
        finally:
            rec.close()
    if inter:
        assert n_inter > 0, f"{case_dir}: none of the intermediates was recognised"


# ---------------------------------------------------------------------------------------------
# TeaCache replay
# ---------------------------------------------------------------------------------------------


def _teacache_settings(manifest: dict) -> tuple[str, bool]:
    text = " ".join(manifest.get("how_to_replay", [])) + " " + manifest.get("description", "")
    preset = re.search(r"model_scale='([^']+)'", text)
    use_ret = not re.search(r"use_ret_steps\s*=\s*False", text)
    return (preset.group(1) if preset else "infinitetalk-480"), use_ret


def _audio_for(spec: str, inputs: dict[str, torch.Tensor], audio: torch.Tensor) -> torch.Tensor:
    if spec == "audio_windows":
        return audio
    if spec.startswith("zeros_like"):
        zeros = torch.zeros_like(audio)
        return zeros[-1:] if spec.endswith("[-1:]") else zeros
    return inputs[spec]


def _run_teacache(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    model = _load_model(case_dir, manifest, parity_root)
    inputs = _inputs(case_dir, manifest)
    audio = inputs["audio_emb"][inputs["audio_window_indices"]][None]  # (1, F_pix, 5, 12, 768)
    y = _batched(inputs["y"], 5)
    masks = inputs.get("ref_target_masks")
    preset, use_ret = _teacache_settings(manifest)
    for run in manifest["runs"]:
        tensors = load_tensors(case_dir / run["file"])
        by_index = {}
        for tname in tensors:
            m = re.fullmatch(r"(x|out)_(\d+)", tname)
            if m:
                by_index[(m.group(1), int(m.group(2)))] = tname
        cache = TeaCache(TeaCacheConfig(run["teacache_thresh"], preset, use_ret), run["sampling_steps"])
        for call in run["calls"]:
            i = call["call"]
            x = _batched(tensors[by_index[("x", i)]], 5)
            context = _batched(inputs[call["context"]], 3)
            t = torch.tensor([call["t"]], dtype=torch.float32)
            with torch.no_grad():
                out = model(
                    x,
                    t,
                    context,
                    inputs["clip_fea"],
                    y,
                    _audio_for(call["audio"], inputs, audio),
                    masks,
                    teacache=cache,
                    branch=call["branch"],
                )
            decision = cache.decisions[-1]
            where = f"{case_dir.name}/{run['file']} call {i} ({call['branch']})"
            assert decision.computed == call["computed"], f"{where}: computed {decision.computed} != official"
            want_acc = call.get("accumulated_rel_l1_after_call")
            if want_acc is not None:
                assert abs(decision.accumulated - want_acc) <= 1e-4 * max(1.0, abs(want_acc)), (
                    f"{where}: accumulated distance {decision.accumulated} != {want_acc}"
                )
            assert_close(out, tensors[by_index[("out", i)]], TOL, where)
        computed = sum(d.computed for d in cache.decisions)
        if "n_computed" in run:
            assert computed == run["n_computed"], f"{run['file']}: {computed} computed != {run['n_computed']}"
        if "n_reused" in run:
            assert len(cache.decisions) - computed == run["n_reused"]


# ---------------------------------------------------------------------------------------------
# weights + shared inputs
# ---------------------------------------------------------------------------------------------


def _run_weights(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    weights = (
        case_dir if (case_dir / "config.json").is_file() else _weights_dir(case_dir, manifest, parity_root)
    )
    it_file = _infinitetalk_file(weights)
    model = load_dit(weights, it_file, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    if "n_params" in manifest:
        assert n_params == manifest["n_params"], f"{n_params} parameters != manifest {manifest['n_params']}"
    if "audio_keys" in manifest:
        assert set(safetensors_keys(it_file)) == set(manifest["audio_keys"]), (
            f"{it_file}: audio key set differs"
        )
    for key, value in manifest.get("model_kwargs", {}).items():
        if key in ("window_size", "weight_init"):
            continue
        ours = getattr(model.config, key)
        ours = list(ours) if isinstance(ours, tuple) else ours
        assert ours == value, f"config {key}: {ours} != manifest {value}"


def _run_tensors(case_dir: Path, manifest: dict) -> None:
    found: dict[str, torch.Tensor] = {}
    for f in sorted(case_dir.glob("*.safetensors")):
        found.update(load_tensors(f))
    for name, spec in manifest["tensors"].items():
        assert name in found, f"{case_dir}: tensor {name} missing"
        t = found[name]
        assert list(t.shape) == list(spec["shape"]), f"{name}: shape {list(t.shape)} != {spec['shape']}"
        if spec.get("dtype") in _DTYPES:
            assert t.dtype == _DTYPES[spec["dtype"]], f"{name}: dtype {t.dtype} != {spec['dtype']}"
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"{name}: non-finite values"
            assert t.float().std() > 0, f"{name}: constant tensor"


def run_case(case_dir: Path, manifest: dict, parity_root: Path) -> None:
    if isinstance(manifest.get("runs"), list) and all("calls" in r for r in manifest["runs"]):
        _run_teacache(case_dir, manifest, parity_root)
    elif "outputs" in manifest and "call" in manifest:
        _run_forward(case_dir, manifest, parity_root)
    elif {"n_params", "audio_keys"} & set(manifest) or (case_dir / "config.json").is_file():
        _run_weights(case_dir, manifest, parity_root)
    elif "tensors" in manifest:
        _run_tensors(case_dir, manifest)
    else:
        raise AssertionError(f"{case_dir}: unrecognised dit manifest (keys {sorted(manifest)})")
