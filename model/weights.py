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
QUANTS = ("none", "fp8", "int8")
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

    def quant_file(self, quant: str, multi: bool = False) -> str:
        stem = self.quant_stem_multi if multi else self.quant_stem
        return f"{self.quant_dir}/{stem}_{quant}.safetensors"

    def dit_file(self, quant: str, multi: bool = False) -> str:
        """The InfiniteTalk DiT file of a quantization (none: the audio-weights file over the Wan shards)."""
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
    problems = _check_safetensors(path)
    if quant != "none":
        problems += _check_json(path.with_suffix(".json"))
    return problems


def has_multi(root: Path, quant: str = "none", mode: str = "infinitetalk-480") -> bool:
    """Whether the root holds the multi (two-person) checkpoint of `quant` (presence only)."""
    path = Path(root) / layout_for(mode, quant).dit_file(quant, multi=True)
    return path.is_file() and (quant == "none" or path.with_suffix(".json").is_file())


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
    problems += _check_dit_file(root, layout, quant, multi=False)
    if multi or (root / layout.dit_file(quant, multi=True)).exists():
        problems += _check_dit_file(root, layout, quant, multi=True)
    problems += _check_torch_zip(wan / layout.vae)
    problems += _check_torch_zip(wan / layout.t5)
    problems += _check_tokenizer(wan / layout.tokenizer)
    problems += _check_torch_zip(wan / layout.clip)
    problems += _check_wav2vec(root / layout.wav2vec_dir)
    return problems


# ---------------------------------------------------------------------------------------------
# download (pinned revisions; only the files the mode needs)


def download_weights(
    to: Path, mode: str = "infinitetalk-480", quant: str = "none", multi: bool = False
) -> Path:
    """Fetch the files of `mode` / `quant` from the Hugging Face Hub into `to` (official layout); returns `to`.

    `multi` adds the two-person checkpoint of that quantization."""
    from huggingface_hub import hf_hub_download, snapshot_download  # network only

    layout = layout_for(mode, quant)
    to = Path(to)
    wan_files = ["config.json", layout.vae, layout.t5, layout.clip]
    if quant == "none":
        wan_files.append(f"{DIT_STEM}.safetensors.index.json")
    for name in wan_files:
        hf_hub_download(WAN_HUB.repo_id, name, revision=WAN_HUB.revision, local_dir=to / WAN_HUB.local_dir)
    patterns = [f"{layout.tokenizer}/*"]
    if quant == "none":
        patterns.append(f"{DIT_STEM}-*.safetensors")
    snapshot_download(
        WAN_HUB.repo_id, revision=WAN_HUB.revision, allow_patterns=patterns, local_dir=to / WAN_HUB.local_dir
    )
    for name in ("config.json", "preprocessor_config.json"):
        hf_hub_download(
            WAV2VEC_HUB.repo_id, name, revision=WAV2VEC_HUB.revision, local_dir=to / WAV2VEC_HUB.local_dir
        )
    hf_hub_download(
        WAV2VEC_HUB.repo_id,
        "model.safetensors",
        revision=WAV2VEC_SAFETENSORS_REVISION,
        local_dir=to / WAV2VEC_HUB.local_dir,
    )
    it_prefix = INFINITETALK_HUB.local_dir + "/"
    it_files = []
    for person in (False, True) if multi else (False,):
        it_files.append(layout.dit_file(quant, person))
        if quant != "none":
            it_files.append(str(Path(layout.dit_file(quant, person)).with_suffix(".json")))
    for rel in it_files:
        hf_hub_download(
            INFINITETALK_HUB.repo_id,
            rel.removeprefix(it_prefix),
            revision=INFINITETALK_HUB.revision,
            local_dir=to / INFINITETALK_HUB.local_dir,
        )
    log.info("downloaded %s weights (quant %s%s) to %s", mode, quant, ", multi" if multi else "", to)
    return to
