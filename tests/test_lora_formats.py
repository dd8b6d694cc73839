"""LoRA files in diffusers / SimpleTuner naming merge exactly as the same LoRA in lightx2v (official) naming."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from model.weights.loading import LoadSpec, load_models
from model.weights.lora import LoraError, merge_lora
from model.weights.tiny import write_tiny_root

# (official module path, diffusers module path): every kind of layer a Wan LoRA touches
PAIRS = [
    ("blocks.0.self_attn.q", "blocks.0.attn1.to_q"),
    ("blocks.1.self_attn.o", "blocks.1.attn1.to_out.0"),
    ("blocks.0.cross_attn.k", "blocks.0.attn2.to_k"),
    ("blocks.1.cross_attn.o", "blocks.1.attn2.to_out.0"),
    ("blocks.0.cross_attn.k_img", "blocks.0.attn2.add_k_proj"),
    ("blocks.1.cross_attn.v_img", "blocks.1.attn2.add_v_proj"),
    ("blocks.0.ffn.0", "blocks.0.ffn.net.0.proj"),
    ("blocks.1.ffn.2", "blocks.1.ffn.net.2"),
    ("blocks.0.audio_cross_attn.q_linear", "blocks.0.audio_cross_attn.q_linear"),  # InfiniteTalk's own
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
    ("head.head", "proj_out"),
]
# weight differences (norms and biases): (official target, diffusers module path, suffix)
DIFFS = [
    ("blocks.1.norm3.weight", "blocks.1.norm2", "diff"),  # diffusers' norm2 is the official norm3
    ("blocks.0.cross_attn.norm_k_img.weight", "blocks.0.attn2.norm_added_k", "diff"),
    ("img_emb.proj.4.bias", "condition_embedder.image_embedder.norm2", "diff_b"),
]


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    root = write_tiny_root(tmp_path_factory.mktemp("weights") / "root", seed=0)
    return load_models(root, LoadSpec.cpu_float32(components=("dit",))).dit


@pytest.fixture(scope="module")
def lora(dit):
    """{official path: (down, up, alpha, diff_b)} and {official target: diff} drawn against the tiny DiT."""
    gen = torch.Generator().manual_seed(3)
    params = dict(dit.named_parameters())
    low = {}
    for n, (path, _) in enumerate(PAIRS):
        out, inp = params[f"{path}.weight"].shape
        rank = 2 + n % 3
        alpha = torch.tensor(float(2 * rank if n % 2 else rank))
        low[path] = (torch.randn(rank, inp, generator=gen), torch.randn(out, rank, generator=gen) * 0.1, alpha,
                     torch.randn(out, generator=gen))  # fmt: skip
    diffs = {t: torch.randn(params[t].shape, generator=gen) for t, _, _ in DIFFS}
    return low, diffs


def _file(low, diffs, prefix: str, diffusers: bool) -> dict[str, torch.Tensor]:
    """The LoRA's tensors in lightx2v naming (lora_down / lora_up / diff_b on official paths) or in diffusers
    naming (lora_A / lora_B / lora_B.bias on diffusers paths) under `prefix`."""
    names = dict(PAIRS) if diffusers else {path: path for path, _ in PAIRS}
    down_k, up_k, bias_k = (
        ("lora_A.weight", "lora_B.weight", "lora_B.bias")
        if diffusers
        else ("lora_down.weight", "lora_up.weight", "diff_b")
    )
    out = {}
    for path, (down, up, alpha, bias) in low.items():
        p = prefix + names[path]
        out |= {f"{p}.{down_k}": down, f"{p}.{up_k}": up, f"{p}.alpha": alpha, f"{p}.{bias_k}": bias}
    for (target, module, suffix), t in zip(DIFFS, diffs.values(), strict=True):
        out[f"{prefix}{module if diffusers else target.rsplit('.', 1)[0]}.{suffix}"] = t
    return out


def _merged(dit, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    save_file(tensors, str(path))
    model = copy.deepcopy(dit)
    assert merge_lora(model, path, scale=0.7) == 2 * len(PAIRS) + len(DIFFS)
    return model.state_dict()


@pytest.mark.parametrize("prefix", ["transformer.", "diffusion_model.", "base_model.model."])
def test_diffusers_naming_merges_like_lightx2v_naming(dit, lora, tmp_path, prefix):
    low, diffs = lora
    want = _merged(dit, _file(low, diffs, "diffusion_model.", False), tmp_path / "lightx2v.safetensors")
    got = _merged(dit, _file(low, diffs, prefix, True), tmp_path / "diffusers.safetensors")
    before = dit.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], want[k]))
    targets = [f"{p}.{leaf}" for p, _ in PAIRS for leaf in ("weight", "bias")] + [t for t, _, _ in DIFFS]
    assert changed == sorted(targets)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    down, up, alpha, _ = low["blocks.0.cross_attn.k"]  # and the math: 0.7 * alpha / rank * up @ down
    expect = before["blocks.0.cross_attn.k.weight"] + 0.7 * float(alpha) / down.shape[0] * up @ down
    torch.testing.assert_close(want["blocks.0.cross_attn.k.weight"], expect)


@pytest.mark.parametrize(
    ("tensors", "named"),
    [
        ({"transformer.blocks.0.attn1.to_q.lora_C.weight": torch.zeros(2, 128)}, "lora_C"),
        ({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(2, 128),
          "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(128, 2),
          "transformer.blocks.0.self_attn.k.diff": torch.zeros(128, 128)}, "blocks.0.self_attn.k.diff"),
        ({"transformer.blocks.0.norm3.diff": torch.zeros(128)}, "transformer.blocks.0.norm3.diff"),
        ({"transformer.blocks.7.attn2.to_v.lora_A.weight": torch.zeros(2, 128),
          "transformer.blocks.7.attn2.to_v.lora_B.weight": torch.zeros(128, 2)}, "blocks.7.attn2.to_v"),
        ({"transformer.proj_out.lora_A.weight": torch.zeros(2, 128)}, "transformer.proj_out.lora_A.weight"),
        ({"transformer.blocks.0.attn1.to_q.diff": torch.zeros(128, 128),
          "diffusion_model.blocks.0.attn1.to_q.diff": torch.zeros(128, 128)}, "more than one key"),
    ],
    ids=["unknown", "mixed", "no-target", "no-block", "unpaired", "repeated"],
)  # fmt: skip
def test_bad_diffusers_keys_are_one_line_errors(dit, tmp_path, tensors, named):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path))
    model = copy.deepcopy(dit)
    with pytest.raises(LoraError) as ex:
        merge_lora(model, path)
    message = str(ex.value)
    assert "\n" not in message and str(path) in message and named in message, message
    before = dit.state_dict()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
