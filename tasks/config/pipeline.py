"""The pipeline's config: `configs/default.yaml` + a user YAML + `--set` overrides, typed and frozen.

Overrides are merged as nested dicts, then every value is checked against its field's type (`tasks.config.
schema`); an unknown key or a bad value raises `ConfigError` naming the file (or `--set`) and the key. A
backend's own sections (top-level mappings not declared here, such as `infinitetalk:`) are kept in
`PipelineConfig.sections` and typed by the configured backend (`tasks.backends`), so this room names no
backend option.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.backends import BACKENDS, settings_hook
from tasks.config.media import (
    AudioConfig,
    ColorConfig,
    EncodeConfig,
    FramesConfig,
    PlanConfig,
    ProbeConfig,
    ShotsConfig,
    TimelineConfig,
)
from tasks.config.run import (
    BackendConfig,
    ChecksConfig,
    CostConfig,
    DebugConfig,
    EstimateConfig,
    QcSettings,
    ShotPipelineConfig,
    WorkspaceConfig,
)
from tasks.config.schema import build_section, free_form_keys, unknown_key
from tasks.config.speaker import CastConfig, GateConfig, RegionSettings, ReviewConfig, SpeakerConfig
from tasks.errors import ConfigError
from tasks.files import load_yaml, parse_yaml

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
PREVIEW_PRESET = DEFAULT_CONFIG.with_name("preview.yaml")  # the --preview pass, over the run's config


@dataclass(frozen=True)
class PipelineConfig:
    probe: ProbeConfig
    shots: ShotsConfig
    audio: AudioConfig
    plan: PlanConfig
    frames: FramesConfig
    color: ColorConfig
    encode: EncodeConfig
    backend: BackendConfig
    workspace: WorkspaceConfig
    checks: ChecksConfig
    cost: CostConfig
    debug: DebugConfig
    region: RegionSettings
    gate: GateConfig
    speaker: SpeakerConfig
    cast: CastConfig
    qc: QcSettings
    pipeline: ShotPipelineConfig
    estimate: EstimateConfig
    timeline: TimelineConfig
    review: ReviewConfig
    # The sections a backend owns (top-level YAML sections beside these, e.g. the InfiniteTalk backend's
    # `infinitetalk:` and `presets:`), kept here as mappings and typed by their backend when it resolves
    # them (`tasks.backends`). `to_dict` puts them back at the top level.
    sections: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {**data.pop("sections"), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> PipelineConfig:
        if not isinstance(data, dict):
            raise ConfigError(source, f"config: expected a mapping, got {data!r}")
        own = {f.name for f in dataclasses.fields(cls)} - {"sections"}
        sections = {k: v for k, v in data.items() if k not in own and isinstance(v, dict)}
        cfg = build_section(
            cls, {**{k: v for k, v in data.items() if k not in sections}, "sections": sections}, source, ""
        )
        known = cfg.backend.name in BACKENDS  # (an unknown name fails where the backend is asked for)
        hook = settings_hook(cfg.backend.name, "typed_sections") if known else None
        if hook is not None:  # the configured backend types its own sections (tasks.backends)
            cfg = dataclasses.replace(cfg, sections=hook(cfg.sections, source))
        if cfg.pipeline.queue < 1:
            raise ConfigError(source, f"pipeline.queue: must be >= 1, got {cfg.pipeline.queue}")
        if cfg.pipeline.composite_workers < 1:
            raise ConfigError(
                source, f"pipeline.composite_workers: must be >= 1, got {cfg.pipeline.composite_workers}"
            )
        if cfg.review.timeout_s <= 0:
            raise ConfigError(source, f"review.timeout_s: must be > 0, got {cfg.review.timeout_s}")
        return cfg


def _read_yaml(path: Path) -> dict[str, Any]:
    data = load_yaml(path, "config file")  # a regular file, bounded, no aliases (tasks/files.py)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(path, "top level must be a mapping")
    return data


def _merge(base: dict[str, Any], over: dict[str, Any], where: str, prefix: str = "") -> None:
    """Merge `over` into `base` in place; keys must exist in `base` except inside free-form dicts."""
    for key, value in over.items():
        if key not in base:
            raise ConfigError(where, unknown_key(f"{prefix}{key}"))
        if isinstance(base[key], dict) and isinstance(value, dict) and base[key]:
            _merge(base[key], value, where, f"{prefix}{key}.")
        else:
            base[key] = value


def parse_override(text: str) -> tuple[list[str], Any]:
    """`"section.key=value"` -> (["section", "key"], typed value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError("--set", f"{text!r}: expected key.sub=value")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if len(parts) < 2 or not all(parts):
        raise ConfigError("--set", f"{key!r}: expected section.key")
    try:
        value = parse_yaml(raw, "--set") if raw.strip() else ""
    except ConfigError:  # not YAML (or an alias, never expanded: tasks/files.py): the text itself
        value = raw
    return parts, value


def apply_override(data: dict[str, Any], parts: list[str], value: Any, *, free_form: set[str]) -> None:
    node = data
    for i, part in enumerate(parts[:-1]):
        path = ".".join(parts[: i + 1])
        if part not in node:
            if path.rsplit(".", 1)[0] in free_form or any(path.startswith(f + ".") for f in free_form):
                node[part] = {}
            else:
                raise ConfigError("--set", unknown_key(".".join(parts)))
        if not isinstance(node[part], dict):
            raise ConfigError("--set", f"{path} is not a section")
        node = node[part]
    leaf = ".".join(parts)
    parent = ".".join(parts[:-1])
    inside_free = parent in free_form or any(parent.startswith(f + ".") for f in free_form)
    if parts[-1] not in node and not inside_free:
        raise ConfigError("--set", unknown_key(leaf))
    node[parts[-1]] = value


def _free_form_in_sections(data: dict[str, Any]) -> set[str]:
    """Mappings inside the backends' sections (`PipelineConfig.sections`: the top-level mappings that are
    not a section of this file), which `--set` may extend as it may any free-form mapping."""
    own = {f.name for f in dataclasses.fields(PipelineConfig)}
    return {
        f"{name}.{key}"
        for name, section in data.items()
        if name not in own and isinstance(section, dict)
        for key, value in section.items()
        if isinstance(value, dict)
    }


def load_config(
    config_file: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    updates: dict[str, Any] | None = None,
    defaults: str | Path = DEFAULT_CONFIG,
    preview: bool = False,
) -> PipelineConfig:
    """Defaults, then `config_file`, then `updates` (a nested dict), then with `preview` the preview
    preset (`configs/preview.yaml`), then `--set` strings."""
    data = _read_yaml(Path(defaults))
    if config_file is not None:
        _merge(data, _read_yaml(Path(config_file)), str(config_file))
    if updates:
        _merge(data, copy.deepcopy(updates), "config")
    if preview:
        _merge(data, _read_yaml(PREVIEW_PRESET), str(PREVIEW_PRESET))
    free = free_form_keys(PipelineConfig) | _free_form_in_sections(data)
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(data, parts, value, free_form=free)
    where = "--set" if overrides else str(config_file or defaults)
    return PipelineConfig.from_dict(data, source=where)
