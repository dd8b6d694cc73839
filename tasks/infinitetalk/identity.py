"""What a shot key records of InfiniteTalk's weights (the backend's `weights_identity` hook, which
`tasks.timeline.shot_key.shot_inputs` is handed through `tasks.render.backend.backend_weights_identity`).
Reads file names, sizes and mtimes only; loads nothing.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from model.weights.layout import QUANTS, TINY_WEIGHTS_SEED, WeightsLayout
from tasks.infinitetalk.settings import SECTION, effective_options


def weights_identity(config: Mapping[str, Any], *, multi: bool = False) -> str:
    """The model weights a shot is rendered with: tiny random weights by seed, else the weights root's
    files (relative names, sizes, mtimes; moving the folder keeps it). Hidden entries (a downloader's
    `.cache/`) are not weights. The multi-person checkpoint counts only for a shot that can run two speakers
    (``multi``: it has two or more stems), so adding it to a root re-renders no one-speaker shot."""
    opts = effective_options(copy.deepcopy(dict(config)))[SECTION]
    if opts.get("weights") is None:
        return f"tiny-random-seed{TINY_WEIGHTS_SEED}"
    root = Path(str(opts["weights"]))
    if not root.is_dir():
        return f"absent:{root.name}"  # the render fails on it; the key must not
    layout = WeightsLayout()
    multi_files = {layout.dit_file(q, multi=True) for q in QUANTS}
    multi_files |= {str(Path(f).with_suffix(".json")) for f in multi_files}
    digest = hashlib.sha256()
    for p in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = p.relative_to(root).as_posix()
        if any(part.startswith(".") for part in Path(rel).parts) or (not multi and rel in multi_files):
            continue
        st = p.stat()
        digest.update(f"{rel}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return f"{opts.get('mode')}:{digest.hexdigest()[:20]}"
