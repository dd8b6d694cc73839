"""Where a film run may keep its workspace: `workspace.root` confined like the output path.

`workspace.root` arrives in the run's config, which anyone who reaches the Prefect API can set (a
deployment parameter, or a `dub-group` run's `ws`), and workers write gigabytes under it. So the
root, fully resolved (``..`` and symlinks), must lie under a workspace root of the host running the
flow, never named by a run parameter: the default root (``workspace.root`` of ``configs/default.yaml``,
resolved in the working folder) and ``$DUBFLOW_WORKSPACE`` when set, plus ``DUBFLOW_WORKSPACE_ROOTS``
(paths separated by ``os.pathsep``) or, when that is unset, the source's folder. No Prefect here.
"""

from __future__ import annotations

import os
from pathlib import Path

from tasks.config.pipeline import PipelineConfig, load_config
from tasks.errors import ConfigError

WS_ROOTS_ENV = "DUBFLOW_WORKSPACE_ROOTS"


def workspace_root(cfg: PipelineConfig) -> str:
    """`workspace.root`, except that `DUBFLOW_WORKSPACE` replaces the default root (shared across hosts)."""
    env = os.environ.get("DUBFLOW_WORKSPACE", "").strip()
    if env and cfg.workspace.root == load_config().workspace.root:
        return env
    return cfg.workspace.root


def workspace_roots(source: str | os.PathLike[str]) -> list[Path]:
    """The folders workspaces may live under (resolved)."""
    roots = [Path(load_config().workspace.root).expanduser().resolve()]  # the host's own settings
    shared = os.environ.get("DUBFLOW_WORKSPACE", "").strip()
    if shared:
        roots.append(Path(shared).expanduser().resolve())
    configured = [p for p in os.environ.get(WS_ROOTS_ENV, "").split(os.pathsep) if p.strip()]
    if configured:
        return [*roots, *(Path(p).expanduser().resolve() for p in configured)]
    return [*roots, Path(source).expanduser().resolve().parent]


def confine_workspace_root(root: str | os.PathLike[str], source: str | os.PathLike[str]) -> Path:
    """The resolved workspace root, after checking it lies under a workspace root (else ConfigError,
    one line naming it, before anything is created there)."""
    resolved = Path(root).expanduser().resolve()
    roots = workspace_roots(source)
    if not any(resolved.is_relative_to(r) for r in roots):
        raise ConfigError(
            "workspace.root",
            f"{root} resolves to {resolved}, outside the workspace roots ({', '.join(map(str, roots))}); "
            f"set {WS_ROOTS_ENV} on the hosts running the flows to allow another folder",
        )
    return resolved
