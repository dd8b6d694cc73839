"""The tiny random weights root (official layout) of the tests: written once per session by the
``tiny_weights`` fixture (tests/conftest.py), then copied where a test needs it.

Writing one took 40 s on the loaded 2-core box (111 MB of seeded random tensors); a copy takes about a
second. The bytes are the same: the root is a function of its seed (``tasks.infinitetalk.ensure_tiny_root``),
and its shot-key identity is the seed, not the path.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def seed_cache(tiny_weights: Path, cache_dir: Path) -> Path:
    """A workspace cache (``<workspace root>/.cache``) holding a copy of the session's tiny weights root,
    where the InfiniteTalk backend's ``ensure_tiny_root`` finds it (a copy: a test may change its own)."""
    return Path(shutil.copytree(tiny_weights, cache_dir / tiny_weights.name))
