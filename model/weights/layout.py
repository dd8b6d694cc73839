"""The official weights layout: which files a mode needs, a header-only integrity check, and download.

Layout of a weights root (as the official README downloads it):

    Wan2.1-I2V-14B-480P/   config.json, diffusion_pytorch_model-0000k-of-0000n.safetensors + index json,
                           Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/ (tokenizer),
                           models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth
    chinese-wav2vec2-base/ config.json, preprocessor_config.json, model.safetensors (or pytorch_model.bin)
    InfiniteTalk/          single/infinitetalk.safetensors,
                           quant_models/infinitetalk_single_{fp8,int8}.safetensors + .json (optional),
                           multi/infinitetalk.safetensors (optional: the two-person checkpoint, same keys
                           as single), quant_models/infinitetalk_multi_{fp8,int8}.safetensors + .json

The multi checkpoint is an optional component: a root without it is valid (two-speaker segments then fall
back to the louder speaker); `verify_weights(..., multi=True)` requires it, otherwise it is checked only
when present.

`verify_weights` reads only headers (safetensors JSON header vs file size, zip directories of .pth
files, the shard index vs each shard's keys), so it is fast even on the 80 GB real root.
"""

from __future__ import annotations

import json
import logging
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DIT_STEM = "diffusion_pytorch_model"
# GGUF DiTs (`model.weights.gguf`): the file tag of the published conversions; _M / _S files mix K-quant types
GGUF_TAGS = ("Q8_0", "Q6_K", "Q5_K", "Q5_K_M", "Q5_K_S", "Q4_K", "Q4_K_M", "Q4_K_S", "F16", "BF16")
GGUF_QUANTS = tuple(f"gguf-{tag}" for tag in GGUF_TAGS)
QUANTS = ("none", "fp8", "int8", *GGUF_QUANTS)


def is_gguf(quant: str) -> bool:
    """Whether `quant` names GGUF files (`gguf-<tag>`)."""
    return quant in GGUF_QUANTS


TINY_WEIGHTS_SEED = 0  # the seed of the tiny random root a run without weights renders with


@dataclass(frozen=True)
class WeightsLayout:
    """Relative paths of every component inside a weights root."""

    wan_dir: str = "Wan2.1-I2V-14B-480P"
    vae: str = "Wan2.1_VAE.pth"
    t5: str = "models_t5_umt5-xxl-enc-bf16.pth"
    tokenizer: str = "google/umt5-xxl"
    clip: str = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
    wav2vec_dir: str = "chinese-wav2vec2-base"
    infinitetalk: str = "InfiniteTalk/single/infinitetalk.safetensors"
    quant_dir: str = "InfiniteTalk/quant_models"
    quant_stem: str = "infinitetalk_single"
    multi: str = "InfiniteTalk/multi/infinitetalk.safetensors"  # two-person checkpoint (optional)
    quant_stem_multi: str = "infinitetalk_multi"
    # GGUF roots: the Wan DiT as city96 names its conversions, the InfiniteTalk adapter (audio keys) next to
    # it; config.json, VAE, umT5, tokenizer, CLIP and wav2vec2 stay where the official layout has them
    gguf_dir: str = "gguf"
    gguf_dit: str = "wan2.1-i2v-14b-480p-{tag}.gguf"
    gguf_single: str = "Wan2_1-InfiniteTalk_Single_{tag}.gguf"
    gguf_multi: str = "Wan2_1-InfiniteTalk_Multi_{tag}.gguf"

    def quant_file(self, quant: str, multi: bool = False) -> str:
        if is_gguf(quant):
            name = self.gguf_multi if multi else self.gguf_single
            return f"{self.gguf_dir}/{name.format(tag=quant.removeprefix('gguf-'))}"
        stem = self.quant_stem_multi if multi else self.quant_stem
        return f"{self.quant_dir}/{stem}_{quant}.safetensors"

    def gguf_dit_file(self, quant: str) -> str:
        """The Wan DiT GGUF file of a `gguf-<tag>` quantization (the InfiniteTalk adapter: `dit_file`)."""
        return f"{self.gguf_dir}/{self.gguf_dit.format(tag=quant.removeprefix('gguf-'))}"

    def dit_file(self, quant: str, multi: bool = False) -> str:
        """The InfiniteTalk DiT file of a quantization (none: the audio-weights file over the Wan shards;
        gguf: the adapter file over `gguf_dit_file`)."""
        if quant == "none":
            return self.multi if multi else self.infinitetalk
        return self.quant_file(quant, multi)


# 480P and 720P generation share every file (InfiniteTalk runs on the 480P Wan2.1 checkpoint).
MODES: dict[str, WeightsLayout] = {
    "infinitetalk-480": WeightsLayout(),
    "infinitetalk-720": WeightsLayout(),
}


@dataclass(frozen=True)
class HubSource:
    repo_id: str
    revision: str
    local_dir: str


WAN_HUB = HubSource(
    "Wan-AI/Wan2.1-I2V-14B-480P", "6b73f84e66371cdfe870c72acd6826e1d61cf279", "Wan2.1-I2V-14B-480P"
)
WAV2VEC_HUB = HubSource(
    "TencentGameMate/chinese-wav2vec2-base",
    "3991242c806928916fff4a8c0e4f76acf661b743",
    "chinese-wav2vec2-base",
)
WAV2VEC_SAFETENSORS_REVISION = "refs/pr/1"  # model.safetensors exists only in this PR of the repo
INFINITETALK_HUB = HubSource(
    "MeiGen-AI/InfiniteTalk", "d59847ebdacf19245bfca3fb23311c0cada8378a", "InfiniteTalk"
)


def layout_for(mode: str, quant: str) -> WeightsLayout:
    if mode not in MODES:
        raise ValueError(f"unknown weights mode {mode!r}; known: {sorted(MODES)}")
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; known: {list(QUANTS)}")
    return MODES[mode]


# ---------------------------------------------------------------------------------------------
# header-only checks (each returns a list of problems; empty = fine)


def safetensors_header(path: Path) -> tuple[dict | None, str | None]:
    """(header dict, None) or (None, problem). Checks the declared data length against the file size."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return None, f"{path}: too short for a safetensors file ({size} bytes)"
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                return None, f"{path}: header length {n} exceeds the file size {size} (truncated?)"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable safetensors header ({e})"
    if not isinstance(header, dict):
        return None, f"{path}: safetensors header is not a JSON object"
    header.pop("__metadata__", None)
    end = 0
    for key, info in header.items():
        try:
            begin, stop = info["data_offsets"]
        except (TypeError, KeyError, ValueError):
            return None, f"{path}: malformed header entry for {key!r}"
        end = max(end, stop)
        if stop < begin:
            return None, f"{path}: negative data range for {key!r}"
    if 8 + n + end != size:
        return (
            None,
            f"{path}: data should end at byte {8 + n + end} but the file has {size} bytes (truncated?)",
        )
    return header, None


def _check_safetensors(path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path}: missing"]
    return [p for p in [safetensors_header(path)[1]] if p]


def _check_torch_zip(path: Path) -> list[str]:
    """A torch.save file is a zip; its central directory sits at the end, so truncation shows."""
    if not path.is_file():
        return [f"{path}: missing"]
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            size = path.stat().st_size
            for info in z.infolist():
                if info.header_offset + info.compress_size > size:
                    return [f"{path}: entry {info.filename} runs past the end of the file (truncated?)"]
    except (OSError, zipfile.BadZipFile) as e:
        return [f"{path}: not a readable torch checkpoint ({e})"]
    if not any(n.endswith("data.pkl") for n in names):
        return [f"{path}: zip without data.pkl (not a torch.save file)"]
    return []


def _check_json(path: Path) -> list[str]:
    if not path.is_file():
        return [f"{path}: missing"]
    try:
        json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"{path}: invalid JSON ({e})"]
    return []


def _check_dit_shards(wan_dir: Path) -> list[str]:
    index = wan_dir / f"{DIT_STEM}.safetensors.index.json"
    single = wan_dir / f"{DIT_STEM}.safetensors"
    if not index.is_file():
        return _check_safetensors(single) if single.is_file() else [f"{index}: missing"]
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        assert isinstance(weight_map, dict) and weight_map
    except (OSError, ValueError, KeyError, AssertionError) as e:
        return [f"{index}: invalid shard index ({e!r})"]
    problems = []
    by_file: dict[str, set[str]] = {}
    for key, name in weight_map.items():
        by_file.setdefault(name, set()).add(key)
    for name, keys in sorted(by_file.items()):
        shard = wan_dir / name
        if not shard.is_file():
            problems.append(f"{shard}: missing (listed in {index.name})")
            continue
        header, problem = safetensors_header(shard)
        if problem:
            problems.append(problem)
            continue
        absent = sorted(keys - set(header))
        extra = sorted(set(header) - keys)
        if absent:
            problems.append(f"{shard}: missing key(s) listed in {index.name}: {', '.join(absent[:5])}")
        if extra:
            problems.append(f"{shard}: key(s) not in {index.name}: {', '.join(extra[:5])}")
    return problems


def _check_tokenizer(tok_dir: Path) -> list[str]:
    if not tok_dir.is_dir():
        return [f"{tok_dir}: missing tokenizer folder"]
    if not ((tok_dir / "tokenizer.json").is_file() or (tok_dir / "spiece.model").is_file()):
        return [f"{tok_dir}: neither tokenizer.json nor spiece.model present"]
    return _check_json(tok_dir / "tokenizer_config.json")


def _check_wav2vec(w_dir: Path) -> list[str]:
    problems = _check_json(w_dir / "config.json") + _check_json(w_dir / "preprocessor_config.json")
    st, pt = w_dir / "model.safetensors", w_dir / "pytorch_model.bin"
    if st.is_file():
        problems += _check_safetensors(st)
    elif pt.is_file():
        problems += _check_torch_zip(pt)
    else:
        problems.append(f"{w_dir}: no model.safetensors or pytorch_model.bin")
    return problems


def _check_dit_file(root: Path, layout: WeightsLayout, quant: str, multi: bool) -> list[str]:
    path = root / layout.dit_file(quant, multi)
    if is_gguf(quant):
        return check_gguf(path, quant)
    problems = _check_safetensors(path)
    if quant != "none":
        problems += _check_json(path.with_suffix(".json"))
    return problems


def has_multi(root: Path, quant: str = "none", mode: str = "infinitetalk-480") -> bool:
    """Whether the root holds the multi (two-person) checkpoint of `quant` (presence only)."""
    path = Path(root) / layout_for(mode, quant).dit_file(quant, multi=True)
    return path.is_file() and (quant == "none" or is_gguf(quant) or path.with_suffix(".json").is_file())


def verify_weights(
    root: Path, mode: str = "infinitetalk-480", quant: str = "none", multi: bool = False
) -> list[str]:
    """Problems with the weights root for `mode` / `quant` (empty list = everything present and intact).

    The multi checkpoint is required with `multi=True`; otherwise it is checked only when present."""
    layout = layout_for(mode, quant)
    root = Path(root)
    if not root.is_dir():
        return [f"{root}: weights root not found"]
    wan = root / layout.wan_dir
    problems = _check_json(wan / "config.json")
    if quant == "none":
        problems += _check_dit_shards(wan)
    if is_gguf(quant):
        problems += check_gguf(root / layout.gguf_dit_file(quant), quant)
    problems += _check_dit_file(root, layout, quant, multi=False)
    if multi or (root / layout.dit_file(quant, multi=True)).exists():
        problems += _check_dit_file(root, layout, quant, multi=True)
    if is_gguf(quant) and not problems:
        problems += gguf_key_problems(root, layout, quant, multi)
    problems += _check_torch_zip(wan / layout.vae)
    problems += _check_torch_zip(wan / layout.t5)
    problems += _check_tokenizer(wan / layout.tokenizer)
    problems += _check_torch_zip(wan / layout.clip)
    problems += _check_wav2vec(root / layout.wav2vec_dir)
    return problems


# ---------------------------------------------------------------------------------------------
# GGUF files (`model.weights.gguf`): readable, architecture "wan", data within the file, the tag's weight type

GGUF_MAIN_TYPE = {"Q8_0": 8, "Q6_K": 14, "Q5_K": 13, "Q4_K": 12, "F16": 1, "BF16": 30}  # ggml type ids
# bytes per weight of a tag's main type (block scales included: 34 B / 32, 210, 176, 144 B / 256)
GGUF_BYTES_PER_WEIGHT = {
    "Q8_0": 34 / 32,
    "Q6_K": 210 / 256,
    "Q5_K": 176 / 256,
    "Q4_K": 144 / 256,
    "F16": 2.0,
    "BF16": 2.0,
}


def gguf_bytes_per_weight(quant: str) -> float:
    """Device bytes per quantized-Linear weight of a `gguf-<tag>` DiT (its tag's main type)."""
    tag = quant.removeprefix("gguf-")
    return GGUF_BYTES_PER_WEIGHT[tag[:4] if tag.startswith(("Q4_K", "Q5_K")) else tag]


def check_gguf(path: Path, quant: str) -> list[str]:
    """Problems of one GGUF file of `quant` (header and tensor table only; the data stays mapped)."""
    from model.checkpoint import CheckpointError  # model.weights.gguf reads through the gguf package
    from model.weights.gguf import ARCH, BLOCKS, TYPE_NAMES, read_gguf

    if not path.is_file():
        return [f"{path}: missing"]
    try:
        arch, tensors = read_gguf(path)
    except CheckpointError as exc:
        return [f"{exc} (truncated or not GGUF?)"]
    if arch != ARCH:
        return [f"{path}: GGUF architecture {arch!r}, expected {ARCH!r} (a Wan conversion)"]
    tag = quant.removeprefix("gguf-")
    want = GGUF_MAIN_TYPE[tag[:4] if tag.startswith(("Q4_K", "Q5_K")) else tag]
    kinds = {t.qtype for t in tensors.values() if t.name.startswith("blocks.") and len(t.shape) == 2}
    quantized = kinds & set(BLOCKS)  # rows that are not whole blocks keep the source precision
    if quantized and want not in kinds:
        names = ", ".join(sorted(TYPE_NAMES.get(k, str(k)) for k in kinds))
        return [f"{path}: holds {names} block weights, no {tag} as its name says (another file renamed?)"]
    return []


def gguf_key_problems(root: Path, layout: WeightsLayout, quant: str, multi: bool) -> list[str]:
    """The DiT's keys against the GGUF DiT + adapter files (names the files; each pair in turn)."""
    import torch

    from model.config import ConfigError, DiTConfig
    from model.network.dit import InfiniteTalkDiT
    from model.weights.gguf import read_gguf

    wan = root / layout.wan_dir
    try:
        config = DiTConfig.from_official(json.loads((wan / "config.json").read_text()), source=str(wan))
    except (ConfigError, OSError, ValueError) as exc:
        return [f"{wan / 'config.json'}: {exc}"]
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in InfiniteTalkDiT(config).state_dict().items()}
    dit = root / layout.gguf_dit_file(quant)
    base = {k: t.shape for k, t in read_gguf(dit)[1].items()}
    problems = []
    for person in (False, True) if multi or (root / layout.dit_file(quant, True)).exists() else (False,):
        adapter = root / layout.dit_file(quant, person)
        got = {**base, **{k: t.shape for k, t in read_gguf(adapter)[1].items()}}
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        shapes = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
        where = f"{dit} + {adapter}"
        if missing:
            problems.append(f"{where}: {len(missing)} missing key(s): {', '.join(missing[:5])}")
        if extra:
            problems.append(f"{where}: {len(extra)} unexpected key(s): {', '.join(extra[:5])}")
        if shapes:
            problems.append(f"{where}: shape mismatch for {', '.join(shapes[:5])} (another model size?)")
    return problems


# ---------------------------------------------------------------------------------------------
# download (pinned revisions; only the files the mode needs)


@dataclass(frozen=True)
class HubFile:
    """One file `download_weights` fetches: `name` of the Hub repository `repo_id` at `revision`, into the
    folder `local_dir` of the weights root."""

    repo_id: str
    revision: str
    name: str
    local_dir: str

    @property
    def path(self) -> str:
        """Where it lands, relative to the weights root."""
        return f"{self.local_dir}/{self.name}"


def download_files(mode: str = "infinitetalk-480", quant: str = "none", multi: bool = False) -> list[HubFile]:
    """The single files `download_weights` fetches for `mode` / `quant` (`multi`: the two-person checkpoint
    too), known before any network call; the tokenizer and the DiT shards come by `download_patterns`.
    ValueError for a GGUF quantization (community files, never downloaded)."""
    layout = layout_for(mode, quant)
    if is_gguf(quant):
        raise ValueError(
            f"{quant}: GGUF conversions are community files, not downloaded by dubflow; put them at "
            f"{layout.gguf_dit_file(quant)} and {layout.dit_file(quant)} in the weights root (quant none for "
            "the rest)"
        )
    wan_files = ["config.json", layout.vae, layout.t5, layout.clip]
    if quant == "none":
        wan_files.append(f"{DIT_STEM}.safetensors.index.json")
    files = [HubFile(WAN_HUB.repo_id, WAN_HUB.revision, name, WAN_HUB.local_dir) for name in wan_files]
    files += [
        HubFile(WAV2VEC_HUB.repo_id, WAV2VEC_HUB.revision, name, WAV2VEC_HUB.local_dir)
        for name in ("config.json", "preprocessor_config.json")
    ]
    files.append(
        HubFile(WAV2VEC_HUB.repo_id, WAV2VEC_SAFETENSORS_REVISION, "model.safetensors", WAV2VEC_HUB.local_dir)
    )
    it_prefix = INFINITETALK_HUB.local_dir + "/"
    for person in (False, True) if multi else (False,):
        it_files = [layout.dit_file(quant, person)]
        if quant != "none":
            it_files.append(str(Path(layout.dit_file(quant, person)).with_suffix(".json")))
        files += [
            HubFile(
                INFINITETALK_HUB.repo_id, INFINITETALK_HUB.revision, rel.removeprefix(it_prefix),
                INFINITETALK_HUB.local_dir,
            )
            for rel in it_files
        ]  # fmt: skip
    return files


def download_patterns(mode: str = "infinitetalk-480", quant: str = "none") -> list[str]:
    """The file patterns of the Wan repository `download_weights` fetches (the tokenizer, the DiT shards)."""
    layout = layout_for(mode, quant)
    patterns = [f"{layout.tokenizer}/*"]
    if quant == "none":
        patterns.append(f"{DIT_STEM}-*.safetensors")
    return patterns


def download_weights(
    to: Path, mode: str = "infinitetalk-480", quant: str = "none", multi: bool = False
) -> Path:
    """Fetch the files of `mode` / `quant` from the Hugging Face Hub into `to` (official layout); returns `to`.

    `multi` adds the two-person checkpoint of that quantization. Writes into `to` as the Hub client does:
    the command delivers through a staging folder (`tasks.run.outputs.delivered_folder`)."""
    from huggingface_hub import hf_hub_download, snapshot_download  # network only

    files = download_files(mode, quant, multi)  # ValueError for GGUF, before anything is fetched
    to = Path(to)
    for f in files:
        hf_hub_download(f.repo_id, f.name, revision=f.revision, local_dir=to / f.local_dir)
    snapshot_download(
        WAN_HUB.repo_id,
        revision=WAN_HUB.revision,
        allow_patterns=download_patterns(mode, quant),
        local_dir=to / WAN_HUB.local_dir,
    )
    log.info("downloaded %s weights (quant %s%s) to %s", mode, quant, ", multi" if multi else "", to)
    return to
