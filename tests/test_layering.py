"""The import order of the code, held in the repository: wings one way, `model/` pure torch, `tasks/` below `flows/`.

Reads every module's imports with `ast` (function-local imports included, so a lazy import cannot hide an
arrow) and checks the rules the packages' docstrings state: `tasks/` wings and `model/` rooms import only what
stands below them in the declared order, `model/` imports no Prefect, `tasks`, `flows`, `cv2` or
`subprocess`, `tasks/` imports neither `flows` nor Prefect, and `flows/` holds no tensor or image maths.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom; a wing may import itself and anything after it. The last entry is the package's root ground.
TASKS_ORDER = [
    "run",
    "infinitetalk",
    "render",
    "decision",
    "perception",
    "timeline",
    "picture",
    "media",
    "config",
    "<root>",
]
MODEL_ORDER = ["weights", "runtime", "network", "sampling", "speaker", "<root>"]


def _imports(path: Path, root: Path) -> list[tuple[str, int]]:
    """Absolute module names a file imports (relative imports resolved), with their line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = ".".join(path.relative_to(root).with_suffix("").parts)
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: -node.level]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, node.lineno))
            # `from pkg import module` names a module too
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def _files(root: Path, package: str) -> list[Path]:
    return sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)


def _wing(module: str, package: str, wings: list[str]) -> str | None:
    """The wing (first-level subpackage) of `module` inside `package`, `<root>` for a root module, None outside."""
    parts = module.split(".")
    if parts[0] != package or len(parts) < 2:
        return None
    return parts[1] if parts[1] in wings else "<root>"


def upward_imports(root: Path, package: str, order: list[str]) -> list[str]:
    """Every import in `root/package` of a wing that stands above the importing file's wing."""
    upward = []
    for path in _files(root, package):
        src = _wing(".".join(path.relative_to(root).with_suffix("").parts), package, order)
        for module, line in _imports(path, root):
            dst = _wing(module, package, order)
            if dst is None or dst == src:
                continue
            if order.index(dst) < order.index(src):
                upward.append(f"{path.relative_to(root)}:{line} ({src}) imports {module} ({dst})")
    return upward


@pytest.mark.parametrize(("package", "order"), [("tasks", TASKS_ORDER), ("model", MODEL_ORDER)])
def test_wings_import_only_downward(package: str, order: list[str]) -> None:
    on_disk = {p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").is_file()}
    assert on_disk == set(order) - {"<root>"}, f"{package}/ wings on disk differ from the declared order"
    upward = upward_imports(ROOT, package, order)
    assert not upward, "imports that run back up:\n" + "\n".join(upward)


FORBIDDEN = {
    "model": ("prefect", "tasks", "flows", "cv2", "subprocess"),
    "tasks": ("prefect", "flows"),
    "flows": ("torch", "numpy", "cv2"),
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_forbidden_imports(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _files(ROOT, package)
        for module, line in _imports(path, ROOT)
        if module.split(".")[0] in FORBIDDEN[package]
    ]
    assert not bad, f"{package}/ must not import {', '.join(FORBIDDEN[package])}:\n" + "\n".join(bad)


def test_checker_sees_lazy_and_relative_upward_imports(tmp_path: Path) -> None:
    """The checker itself, on a small tree: a function-local and a relative import of a higher wing are found."""
    for wing in ("media", "render"):
        (tmp_path / "tasks" / wing).mkdir(parents=True)
        (tmp_path / "tasks" / wing / "__init__.py").write_text("")
    (tmp_path / "tasks" / "render" / "shot.py").write_text("from tasks.media import probe\n")
    (tmp_path / "tasks" / "media" / "probe.py").write_text("def f():\n    from tasks.render import shot\n")
    (tmp_path / "tasks" / "media" / "frames.py").write_text("from ..render.shot import x\n")
    found = upward_imports(tmp_path, "tasks", TASKS_ORDER)
    assert found == [
        "tasks/media/frames.py:1 (media) imports tasks.render.shot (render)",
        "tasks/media/frames.py:1 (media) imports tasks.render.shot.x (render)",
        "tasks/media/probe.py:2 (media) imports tasks.render (render)",
        "tasks/media/probe.py:2 (media) imports tasks.render.shot (render)",
    ]


def backend_name_checks(root: Path) -> list[str]:
    """Places outside a backend's wing that compare a value with the name of a backend that owns options (a
    settings module): generic code that knows one backend's options, what the hooks of `tasks.backends` are for.
    The passthrough backend (the dry run, no options) may be named."""
    from tasks.backends import BACKENDS

    typed = {name for name, e in BACKENDS.items() if getattr(e, "settings", None)}
    own = {f"tasks/{name}" for name in typed} | {"tasks/backends.py"}
    found = []
    for package in ("tasks", "flows"):
        for path in _files(root, package):
            rel = path.relative_to(root).as_posix()
            if any(rel == o or rel.startswith(o + "/") for o in own):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Compare):
                    consts = [c for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
                    found += [f"{rel}:{node.lineno}" for c in consts if c.value in typed]
    return found


def test_generic_code_asks_the_backend_hooks() -> None:
    assert not backend_name_checks(ROOT), "compare a backend's name outside its wing; use its settings hooks"


def test_the_report_notes_come_from_the_backend() -> None:
    """The tiny random model's label reaches a run's report through the backend's `run_notes` hook."""
    from flows.delivery import _run_notes
    from tasks.config.pipeline import load_config
    from tasks.infinitetalk.tiny import TINY_LABEL

    tiny = load_config(None, ["backend.name=infinitetalk"])
    real = load_config(None, ["backend.name=infinitetalk", "infinitetalk.weights=/models/InfiniteTalk"])
    assert any(TINY_LABEL in n for n in _run_notes(tiny))
    assert not any(TINY_LABEL in n for n in _run_notes(real))
    assert any("DRY RUN" in n for n in _run_notes(load_config(None, ["backend.name=passthrough"])))


def test_a_backends_plan_fields_come_from_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The editable shot plan's per-shot model fields are the registered backends' (`PLAN_FIELDS`,
    `plan_options`): a backend registered with one more field gets it in the plan's legend, type-checked on
    reading and mapped onto `backend.options`, with no change to the plan file's code."""
    from tasks.backends import BACKENDS, Registered
    from tasks.decision.plan_file import read_plan, to_config_overrides, write_plan
    from tasks.errors import ConfigError

    (tmp_path / "other_settings.py").write_text(
        "PLAN_FIELDS = {'guidance': ('this shot guidance', (int, float))}\n"
        "def plan_options(index, fields):\n"
        "    return {'cfg': float(fields['guidance'])} if fields.get('guidance') is not None else {}\n"
        "def plan_auto(config, index):\n"
        "    return {'guidance': 5 + index}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        BACKENDS, "other", Registered("tasks.render.backend:PassthroughBackend", "other_settings")
    )
    doc = {
        "format": "dubflow-shot-plan/1",
        "shots": [{"index": 2, "override": {"dub": "auto", "guidance": 3}}],
    }
    path = write_plan(tmp_path / "plan.yaml", doc)
    assert "#   guidance: this shot guidance" in path.read_text()
    assert "#   steps: sampling steps" in path.read_text()  # the InfiniteTalk backend's, still there
    fields = read_plan(path)[2]["overrides"]
    assert to_config_overrides(2, fields, {"seed": 1}) == {"backend": {"options": {"seed": 1, "cfg": 3.0}}}
    path.write_text(path.read_text().replace("guidance: 3", "guidance: loud"))
    with pytest.raises(ConfigError, match="shot 2: guidance must be int, got 'loud'"):
        read_plan(path)
    # the automatic values a fresh plan shows are the backends' too (InfiniteTalk's seed: the run's + index)
    from fractions import Fraction

    from tasks.config.pipeline import load_config
    from tasks.decision.review import fresh_plan

    records = [{"index": 3, "plan": {"start_frame": 0, "end_frame": 24}, "decision": None}]
    config = load_config(overrides=["infinitetalk.seed=7"]).to_dict()
    (shot,) = fresh_plan("film.mp4", "dub.wav", Fraction(24), 24, records, config)["shots"]
    assert shot["auto"]["seed"] == 10 and shot["auto"]["guidance"] == 8
