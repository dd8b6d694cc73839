"""Files the backend computes once and shares between shots and worker processes: the advisory file lock,
the tiny random weights root, the per-film safetensors caches (written atomically under the lock) and the
identities their cache keys are made of (audio samples digest, weights file identity).

Only file mechanics: what goes into a cache (prompt embedding, audio features) and where it lives is the
backend's (`backend.InfiniteTalkBackend`); nothing here holds models or state between calls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from model.weights.layout import TINY_WEIGHTS_SEED, WeightsLayout
from tasks.files import atomic_path
from tasks.infinitetalk.tiny import TINY_BANNER

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__package__)  # the package's one logger, "tasks.infinitetalk"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (`flock`) on `path`: one process computes a cache, the others wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_tiny_root(cache_dir: Path, seed: int = TINY_WEIGHTS_SEED) -> Path:
    """A tiny random weights root (official layout), written once under `cache_dir` and reused."""

    root = cache_dir / f"tiny-weights-seed{seed}"
    if (root / ".complete").exists() and (root / WeightsLayout().multi).is_file():
        return root
    with file_lock(cache_dir / f"tiny-weights-seed{seed}.lock"):
        if (root / ".complete").exists():
            from model.weights.tiny import (
                add_tiny_multi,  # the tiny networks: only when a tiny root is written
            )

            if add_tiny_multi(root, seed):  # a root from before the multi checkpoint joined the layout
                log.warning("[%s] added the tiny multi checkpoint to %s", TINY_BANNER, root)
            return root
        from model.weights.tiny import write_tiny_root  # the tiny networks: only when a tiny root is written

        log.warning("[%s] writing tiny random weights to %s", TINY_BANNER, root)
        with atomic_path(root) as tmp:
            write_tiny_root(tmp, seed)
            (tmp / ".complete").touch()
            shutil.rmtree(root, ignore_errors=True)  # an interrupted earlier attempt
    return root


def audio_digest(path: Path, block: int = 1 << 20) -> str:
    """sha256 of an audio file's samples and rate (not its bytes: WAV headers carry timestamps)."""
    import soundfile as sf

    h = hashlib.sha256()
    with sf.SoundFile(str(path)) as f:
        h.update(f"{f.samplerate}:{f.channels}:".encode())
        while (chunk := f.read(block, dtype="float32")).size:
            h.update(chunk.tobytes())
    return h.hexdigest()


def path_stamp(path: Path) -> str:
    """Resolved path, size and mtime of a weights file or folder (its files)."""
    if not path.exists():
        return f"{path.resolve()}:absent"
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    parts = [str(path.resolve())]
    for p in files:
        st = p.stat()
        parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def cached_tensors(path: Path, compute: Callable[[], tuple[dict[str, torch.Tensor], dict[str, str]]]) -> Path:
    """`path` (safetensors), computed by `compute() -> (tensors, metadata)` under a lock if absent."""
    from safetensors.torch import save_file

    if path.exists():
        return path
    with file_lock(path.with_name(path.name + ".lock")):
        if path.exists():  # another process wrote it while this one waited
            return path
        tensors, metadata = compute()
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    return path
