"""umT5-XXL text encoder: transformers `UMT5EncoderModel` loaded from the official Wan checkpoint.

The official file `models_t5_umt5-xxl-enc-bf16.pth` uses Wan's own parameter names; `convert_state`
maps them onto transformers' names (shapes unchanged). Two traps: the gated FFN's GELU branch is
`ffn.gate.0` -> `wi_0` and the linear branch `ffn.fc1` -> `wi_1`; and `d_kv` is the per-head size.
Each prompt's embedding is trimmed to its real token count, as the official wrapper returns it.
"""

from __future__ import annotations

import html
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, UMT5Config, UMT5EncoderModel

from model.checkpoint import CheckpointError, read_torch_state, strict_assign

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class T5Config:
    """Official umT5 encoder sizes (`dim_attn` is the total attention width, heads x head size)."""

    vocab_size: int = 256384
    dim: int = 4096
    dim_attn: int = 4096
    dim_ffn: int = 10240
    num_heads: int = 64
    num_layers: int = 24
    num_buckets: int = 32
    max_distance: int = 128
    eps: float = 1e-6


T5_CONFIGS: dict[str, T5Config] = {
    "umt5-xxl": T5Config(),
    "tiny": T5Config(vocab_size=256, dim=64, dim_attn=64, dim_ffn=128, num_heads=4, num_layers=2),
}

TEXT_LEN = 512  # official tokenizer truncation length (the DiT pads the context to this)


def hf_config(cfg: T5Config) -> UMT5Config:
    return UMT5Config(
        vocab_size=cfg.vocab_size,
        d_model=cfg.dim,
        d_kv=cfg.dim_attn // cfg.num_heads,
        d_ff=cfg.dim_ffn,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        relative_attention_num_buckets=cfg.num_buckets,
        relative_attention_max_distance=cfg.max_distance,
        layer_norm_epsilon=cfg.eps,
        feed_forward_proj="gated-gelu",  # GELU with the tanh formula, as the official FFN
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
    )


def t5_config_from_state(state: dict[str, torch.Tensor]) -> T5Config:
    """Every size is readable off the official tensors."""
    n_layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    buckets, heads = state["blocks.0.pos_embedding.embedding.weight"].shape
    vocab, dim = state["token_embedding.weight"].shape
    return T5Config(
        vocab_size=vocab,
        dim=dim,
        dim_attn=state["blocks.0.attn.q.weight"].shape[0],
        dim_ffn=state["blocks.0.ffn.fc1.weight"].shape[0],
        num_heads=heads,
        num_layers=n_layers,
        num_buckets=buckets,
    )


_BLOCK_MAP = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",  # GELU branch
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",  # linear branch
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}


def convert_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Official umT5 encoder names -> `UMT5EncoderModel` names; unknown keys raise KeyError naming them."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, value in state.items():
        if key == "token_embedding.weight":
            out["shared.weight"] = value
            out["encoder.embed_tokens.weight"] = value  # tied with shared.weight
        elif key == "norm.weight":
            out["encoder.final_layer_norm.weight"] = value
        elif key.startswith("blocks.") and key.split(".", 2)[2] in _BLOCK_MAP:
            i, rest = key.split(".", 2)[1:]
            out[f"encoder.block.{i}.{_BLOCK_MAP[rest]}"] = value
        else:
            unknown.append(key)
    if unknown:
        raise KeyError(f"unexpected umT5 keys: {', '.join(sorted(unknown)[:8])}")
    return out


_REVERSE_BLOCK_MAP = {v: k for k, v in _BLOCK_MAP.items()}


def official_name(key: str) -> str:
    """`UMT5EncoderModel` key -> the official file's key (for error messages)."""
    if key in ("shared.weight", "encoder.embed_tokens.weight"):
        return "token_embedding.weight"
    if key == "encoder.final_layer_norm.weight":
        return "norm.weight"
    m = re.fullmatch(r"encoder\.block\.(\d+)\.(.+)", key)
    if m and m[2] in _REVERSE_BLOCK_MAP:
        return f"blocks.{m[1]}.{_REVERSE_BLOCK_MAP[m[2]]}"
    return key


def clean_prompt(text: str) -> str:
    """The official 'whitespace' cleaning: ftfy fix, double HTML unescape, collapse whitespace."""
    import ftfy  # only needed when prompts are tokenized

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return re.sub(r"\s+", " ", text).strip()


@dataclass
class PromptCache:
    """Per-run memo of prompt -> trimmed embedding (on CPU), so repeated prompts encode once."""

    entries: dict[str, torch.Tensor] = field(default_factory=dict)


class T5TextEncoder:
    """Tokenizer + umT5 encoder; `encode(prompts)` -> one (tokens, dim) float tensor per prompt."""

    def __init__(
        self, model: UMT5EncoderModel, tokenizer: PreTrainedTokenizerBase | None, text_len: int = TEXT_LEN
    ):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.text_len = text_len
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    @torch.no_grad()
    def encode_ids(self, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """ids/mask (B, L) -> per-sequence hidden states trimmed to mask.sum() tokens."""
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, D)
        lengths = mask.gt(0).sum(dim=1).cpu()
        return [h[: int(n)] for h, n in zip(hidden, lengths, strict=True)]

    def tokenize(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cleaned prompts -> (ids, mask), padded to the longest (pad length does not change results)."""
        if self.tokenizer is None:
            raise RuntimeError("this umT5 encoder was built without a tokenizer; use encode_ids")
        batch = self.tokenizer(
            [clean_prompt(p) for p in prompts],
            padding="longest",
            truncation=True,
            max_length=self.text_len,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return batch.input_ids, batch.attention_mask

    def encode(
        self, prompts: list[str], cache: PromptCache | None = None, device: torch.device | str | None = None
    ) -> list[torch.Tensor]:
        """Embed prompts (float32 results on `device`, default CPU), reusing `cache` entries."""
        todo = [p for p in dict.fromkeys(prompts) if cache is None or p not in cache.entries]
        fresh: dict[str, torch.Tensor] = {}
        if todo:
            ids, mask = self.tokenize(todo)
            for p, emb in zip(todo, self.encode_ids(ids, mask), strict=True):
                fresh[p] = emb.float().cpu()
            if cache is not None:
                cache.entries.update(fresh)
        table = fresh if cache is None else cache.entries
        return [table[p].to(device or "cpu") for p in prompts]


def build_umt5(cfg: T5Config) -> UMT5EncoderModel:
    """Construct on the current default device (use `torch.device('meta')` before loading)."""
    return UMT5EncoderModel(hf_config(cfg))


def load_tokenizer(tokenizer_dir: Path | str) -> PreTrainedTokenizerBase:
    if not Path(tokenizer_dir).is_dir():
        raise CheckpointError(f"{tokenizer_dir}: tokenizer folder not found")
    try:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{tokenizer_dir}: cannot load the umT5 tokenizer ({e})") from e


def load_umt5(
    pth: Path | str, *, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu"
) -> UMT5EncoderModel:
    """Load `models_t5_umt5-xxl-enc-bf16.pth` strictly into a meta-built `UMT5EncoderModel`."""
    pth = Path(pth)
    official = read_torch_state(pth)
    try:
        cfg = t5_config_from_state(official)
        state = convert_state(official)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{pth}: not an umT5 encoder checkpoint ({e})") from e
    with torch.device("meta"):
        model = build_umt5(cfg)
    strict_assign(model, state, source=pth, dtype=dtype, device=device, file_name=official_name)
    model.encoder.embed_tokens = model.shared  # one embedding module, as transformers ties them
    log.info("loaded umT5 encoder %s (%d layers, %s, %s)", pth, cfg.num_layers, dtype, device)
    return model.eval().requires_grad_(False)


def load_t5(
    pth: Path | str,
    tokenizer_dir: Path | str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> T5TextEncoder:
    """umT5 encoder (`load_umt5`) plus the tokenizer from the Wan folder's `google/umt5-xxl`."""
    return T5TextEncoder(load_umt5(pth, dtype=dtype, device=device), load_tokenizer(tokenizer_dir))
