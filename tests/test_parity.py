"""Parity against golden tensors made by the official InfiniteTalk code (tiny random weights, float32).

Data-driven: every `manifest.json` under the parity folder is a case, dispatched by its top-level
component folder to `tests/parity/<component>.py::run_case`. `PARITY_DIR` overrides the folder so
other golden sets in the same format run against the same code; nothing here knows the public
set's case names, shapes or file counts.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

PARITY_DIR = Path(os.environ.get("PARITY_DIR", Path(__file__).parent / "fixtures" / "parity")).resolve()


def _case_dirs() -> list[Path]:
    return sorted(m.parent for m in PARITY_DIR.rglob("manifest.json"))


def test_parity_dir_has_cases():
    assert _case_dirs(), f"no manifest.json under {PARITY_DIR}"


@pytest.mark.parametrize("case_dir", _case_dirs(), ids=lambda p: p.relative_to(PARITY_DIR).as_posix())
def test_parity_case(case_dir: Path):
    manifest = json.loads((case_dir / "manifest.json").read_text())
    component = case_dir.relative_to(PARITY_DIR).parts[0]
    runner = importlib.import_module(f"tests.parity.{component}")
    runner.run_case(case_dir, manifest, PARITY_DIR)
