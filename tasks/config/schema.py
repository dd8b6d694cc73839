"""Typed sections from plain mappings: every key known, none missing, each value of its field's type.

The YAML is the one source of defaults (`configs/default.yaml`): the dataclasses of this room declare fields
and types only. A value is checked against its field's type (`Literal` choices, int/float/bool/str,
`X | None`, tuples, free-form `dict`); an unknown key or a bad value raises `ConfigError` naming the file
(or `--set`) and the key, and a key that was removed says where its meaning lives now (`REMOVED_KEYS`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from typing import Any, Literal

from tasks.errors import ConfigError

# Keys removed from the config -> where their meaning lives now (the unknown-key error says so).
REMOVED_KEYS: typing.Mapping[str, str] = types.MappingProxyType(
    {
        "cost.steps": "infinitetalk.steps (null = the mode's preset) and infinitetalk.denoise_strength",
        "cost.calls_per_step": "infinitetalk.text_guide_scale / audio_guide_scale (guidance branches)",
        "cost.s_per_forward": "estimate.dit_forward_s.<mode>.<precision>, cost.fallback_dit_forward_s where null",
        "cost.chunk_overhead_s": "estimate.vae_chunk_s.<mode>, cost.fallback_vae_chunk_s where null",
        "cost.model_load_s": "estimate.load_s.<mode>, cost.fallback_load_s where null",
    }
)


def unknown_key(key: str) -> str:
    """The unknown-key message; for a removed key, where its meaning lives now."""
    if key in REMOVED_KEYS:
        return (
            f"unknown key {key} (removed: shot groups are priced like `dubflow estimate` now, "
            f"from {REMOVED_KEYS[key]})"
        )
    return f"unknown key {key}"


def check_value(tp: Any, value: Any, where: str, key: str) -> Any:
    """`value` checked against the field type `tp` (ConfigError naming `where` and `key`), as the field holds it."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            # YAML may read "480" as an int; accept the string spelling of a choice
            if str(value) in choices:
                return str(value)
            if value is False and "off" in choices:  # YAML 1.1 reads a bare `off` as false
                return "off"
            raise ConfigError(where, f"{key}: {value!r} is not one of {', '.join(map(str, choices))}")
        return value
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return check_value(inner[0], value, where, key)
    if origin is tuple:  # tuple[X, ...]: a YAML/JSON list of X
        if not isinstance(value, list | tuple):
            raise ConfigError(where, f"{key}: expected a list, got {value!r}")
        item = typing.get_args(tp)[0]
        return tuple(check_value(item, v, where, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(where, f"{key}: expected a mapping, got {value!r}")
        return copy.deepcopy(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool) or value is None or isinstance(value, dict | list):
            raise ConfigError(where, f"{key}: expected a string, got {value!r}")
        return str(value)
    raise ConfigError(where, f"{key}: unsupported field type {tp!r}")  # pragma: no cover


def build_section(cls: type, data: Any, where: str, prefix: str) -> Any:
    """The typed dataclass `cls` of the mapping `data` (a config section; `prefix` names its keys in errors):
    every key known, none missing, each value of its field's type (ConfigError naming `where` and the key).
    A backend types its own sections with it (`PipelineConfig.sections`)."""
    if not isinstance(data, dict):
        raise ConfigError(where, f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        key = f"{prefix}{unknown[0]}"
        known = "" if key in REMOVED_KEYS else f" (known: {', '.join(names)})"
        raise ConfigError(where, unknown_key(key) + known)
    missing = [n for n in names if n not in data]
    if missing:
        raise ConfigError(where, f"missing key {prefix}{missing[0]}")
    kwargs = {}
    for name in names:
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build_section(tp, data[name], where, f"{prefix}{name}.")
        else:
            kwargs[name] = check_value(tp, data[name], where, f"{prefix}{name}")
    return cls(**kwargs)


def free_form_keys(cls: type, prefix: str = "") -> set[str]:
    """The dotted keys of `cls` (nested sections too) whose values are free-form mappings (`--set` may extend them)."""
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out |= free_form_keys(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is dict or tp is dict:
            out.add(f"{prefix}{f.name}")
    return out
