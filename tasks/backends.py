"""The backend registry: which dubbing backends exist, by name, and the hooks generic code asks them.

Ground, so every wing may ask "the backend" without importing it: `BACKENDS` maps a name to its
"module:attribute" factory, imported only when that backend is asked for (so a `passthrough` run never
imports the model), and to the light module of its own settings, which every config asks (so loading a
config never imports the model either). Adding a backend costs its own wing plus one line here. The hooks
a factory may carry are listed in `tasks.render.backend`. A settings module may carry `SECTION` (the YAML
section of its options), `typed_sections(sections, where)` (with which `tasks.config.pipeline.PipelineConfig` types
the configured backend's own YAML sections) and:

`effective_options(config)`: the plain config dict with the backend's own sections made effective
(`backend.options` applied over them and cleared), as shot keys, the plan file and the CLI read them;
`for_key=True` also leaves out what a shot key records otherwise (the weights, whose identity the
`weights_identity` hook gives, and the options that never change pixels) and turns file paths into file
identities. A backend without the hook keeps its options in `backend.options` and the config unchanged.

`PLAN_FIELDS` and `plan_options(index, fields)`: the editable shot plan's per-shot fields this backend owns
(field -> its meaning and YAML types) and the `backend.options` a shot's set fields become
(`tasks.decision.plan_file`, through `plan_fields` / `plan_options` here: the plan's format is the same
whichever backend a run uses).

`plan_auto(config, index)`: the automatic values of those fields the plan shows for shot `index` under the
plain config dict `config` (InfiniteTalk: the shot's seed), beside the gate's decision.

`run_notes(sections)`: what a run's report must say about these settings (say, that no weights were given).
Generic code never compares the configured name with a backend that owns options (tests/test_layering.py).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.errors import ConfigError


@dataclass(frozen=True)
class Registered:
    """A backend's registry entry: its factory, and the light module of its own settings (if it has any)."""

    factory: str  # "module:attribute", imported when the backend is asked for
    settings: str | None = None  # a module importing no model code: its `typed_sections`, `effective_options`


BACKENDS: dict[str, Registered | str] = {  # name -> entry ("module:attribute" alone: a factory, no settings)
    "passthrough": Registered("tasks.render.backend:PassthroughBackend"),
    "infinitetalk": Registered(
        "tasks.infinitetalk:InfiniteTalkBackend", settings="tasks.infinitetalk.settings"
    ),
}


def _entry(name: str) -> Registered:
    if name not in BACKENDS:
        raise ConfigError("backend.name", f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")
    entry = BACKENDS[name]
    return entry if isinstance(entry, Registered) else Registered(entry)


def _import(name: str, target: str) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module
    except (ImportError, AttributeError) as ex:
        raise ConfigError("backend.name", f"backend {name!r} is not available ({target}: {ex})") from ex


def backend_factory(name: str) -> Any:
    """The registered factory (class) of backend `name`, imported now; ConfigError when unknown."""
    return _import(name, _entry(name).factory)


def settings_hook(name: str, hook: str) -> Any:
    """The hook `hook` of backend `name`'s settings module (imports no model code), None without one."""
    entry = _entry(name)
    return None if entry.settings is None else getattr(_import(name, entry.settings), hook, None)


def backend_option(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The effective value of the backend's option `key` under the plain config dict `config`: from the
    backend's own section (its factory's `section`, after `effective_options`), else `backend.options`,
    else `default`."""
    data = effective_options(config)
    section = settings_hook(data["backend"]["name"], "SECTION")
    own = data.get(section, {}) if section else {}
    return own[key] if key in own else data["backend"]["options"].get(key, default)


def effective_options(config: Mapping[str, Any], *, for_key: bool = False) -> dict[str, Any]:
    """A copy of the plain config dict `config` with its backend's options made effective (the backend's
    `effective_options` hook; see the module docstring), unchanged for a backend without one."""
    data = copy.deepcopy(dict(config))
    hook = settings_hook(data["backend"]["name"], "effective_options")
    return hook(data, for_key=for_key) if hook is not None else data


def plan_fields() -> dict[str, tuple[str, tuple[type, ...]]]:
    """The shot plan's per-shot fields the registered backends own (their settings' `PLAN_FIELDS`, in registry
    order): field -> (its meaning, the YAML types it takes)."""
    out: dict[str, tuple[str, tuple[type, ...]]] = {}
    for name in BACKENDS:
        out.update(settings_hook(name, "PLAN_FIELDS") or {})
    return out


def plan_auto(config: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The automatic values the plan shows for shot `index` under the plain config dict `config` (each
    backend's `plan_auto`, in registry order)."""
    out: dict[str, Any] = {}
    for name in BACKENDS:
        if (hook := settings_hook(name, "plan_auto")) is not None:
            out.update(hook(config, index))
    return out


def plan_options(index: int, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The `backend.options` the plan fields `fields` of shot `index` set (each backend's `plan_options`)."""
    out: dict[str, Any] = {}
    for name in BACKENDS:
        if (hook := settings_hook(name, "plan_options")) is not None:
            out.update(hook(index, fields))
    return out
