"""Typed, frozen pipeline config loaded from `configs/default.yaml` + a user YAML + `--set` overrides.

The YAML is the one source of defaults: the dataclasses below declare fields and types only.
Overrides are merged as nested dicts, then every value is checked against its field's type
(`Literal` choices, int/float/bool/str, `X | None`, free-form `dict`); an unknown key or a bad
value raises `ConfigError` naming the file (or `--set`) and the key. A backend's own sections (top-level
mappings not declared here, such as `infinitetalk:`) are kept in `PipelineConfig.sections` and typed by
the configured backend (`tasks.backends`), so this ground module names no backend option.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tasks.backends import BACKENDS, settings_hook
from tasks.errors import ConfigError
from tasks.files import load_yaml, parse_yaml

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
PREVIEW_PRESET = DEFAULT_CONFIG.with_name("preview.yaml")  # the --preview pass, over the run's config


@dataclass(frozen=True)
class ProbeConfig:
    frame_count: Literal["packets", "decode"]


@dataclass(frozen=True)
class ShotsConfig:
    detector: Literal["content", "adaptive", "threshold", "histogram", "hash"]
    threshold: float | None
    min_scene_len: int
    detect_width: int
    min_shot_frames: int


@dataclass(frozen=True)
class AudioConfig:
    sample_rate: int
    channels: int
    length_policy: Literal["error", "pad", "trim", "fit"]
    resampler: Literal["soxr_hq", "ffmpeg"]  # the dialogue track: librosa.load semantics, or ffmpeg's


@dataclass(frozen=True)
class PlanConfig:
    model_fps: int
    frame_num: int
    motion_frames: int


@dataclass(frozen=True)
class FramesConfig:
    bucket: Literal["480", "720"]


@dataclass(frozen=True)
class ColorConfig:
    strength: float
    reference: Literal["chunk", "shot_first"]


@dataclass(frozen=True)
class EncodeConfig:
    codec: str
    crf: int
    preset: str
    pix_fmt: str
    audio_codec: str
    audio_bitrate: str
    audio_language: str
    keep_source_audio: bool
    intermediate: Literal["ffv1"]
    profile: Literal["web", "mezzanine", "lossless"]  # tasks/media/profiles.py
    mezzanine: Literal["prores_hq", "dnxhr_hqx"]
    per_shot: bool  # each shot its own closed-GOP segment, joined by stream copy (tasks/media/segments.py)


@dataclass(frozen=True)
class BackendConfig:
    name: str
    options: dict[str, Any]


@dataclass(frozen=True)
class WorkspaceConfig:
    root: str
    keep: bool
    audio_context_s: float | None  # dub audio around a shot that is part of its result key (None: all)
    preview: bool  # a preview pass (`--preview`): its own workspace, labelled in the output and QC


@dataclass(frozen=True)
class ChecksConfig:
    """Early checks, locks and timeouts (`tasks.render.preflight`, `tasks.run.run_lock`); never part of the workspace key."""

    ffv1_ratio: float  # FFV1 intermediate size / raw RGB size, for the free-disk estimate
    lock_wait_s: float  # a second run of the same workspace waits this long for the first one
    unscheduled_timeout_s: float  # a child group run no worker starts within this fails the film
    api_outage_s: float  # the Prefect API may be unreachable this long before waiting on a group fails
    interrupt_grace_s: float  # after one Ctrl-C / SIGTERM: time the chunk in flight may take to finish


@dataclass(frozen=True)
class CostConfig:
    """Shot-group sizing (`flows.groups.GpuCost`): chunks are priced like `dubflow estimate`
    (`tasks.infinitetalk.cost.chunk_price`); the `fallback_*` stand-ins replace `estimate:` figures that are null."""

    max_load_share: float  # a group's model load is at most this share of its GPU time
    fallback_dit_forward_s: float
    fallback_vae_chunk_s: float
    fallback_load_s: float


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


def _unknown_key(key: str) -> str:
    """The unknown-key message; for a removed key, where its meaning lives now."""
    if key in REMOVED_KEYS:
        return (
            f"unknown key {key} (removed: shot groups are priced like `dubflow estimate` now, "
            f"from {REMOVED_KEYS[key]})"
        )
    return f"unknown key {key}"


@dataclass(frozen=True)
class DebugConfig:
    """Fault injection for tests and demos: shots in `fail_shots` fail half-way (once, or every time)."""

    fail_shots: tuple[int, ...]
    fail_once: bool


@dataclass(frozen=True)
class RegionSettings:
    """Which part of a shot is dubbed (see `tasks.picture.region.RegionConfig`)."""

    mode: Literal["region", "full"]
    motion: Literal["auto", "static", "follow"]
    feather_px: int
    switch_blend_frames: int  # a speaker switch inside a shot: each face fades to/from the source over this
    expand_w: float
    expand_h: float


@dataclass(frozen=True)
class GateConfig:
    """Which shots are dubbed: speech in the dub slice + a face (`auto`), `all` or `none`; per-shot overrides."""

    policy: Literal["auto", "all", "none"]
    require_face: bool
    overrides: dict[str, Any]  # {shot index: dub | skip}
    speakers: dict[str, Any]  # {shot index: face track id}: dub that track over the whole shot
    crops: dict[str, Any]  # {shot index: [x0, y0, x1, y1]}: dub that box (display pixels)
    answers: dict[str, Any]  # {shot index: [{start_frame, end_frame, speaker}]}: the review's answers


@dataclass(frozen=True)
class SpeakerConfig:
    """Faces on film and the active speaker (tasks.perception.face_analysis, tasks.perception.speaker), and the VAD (tasks.perception.vad)."""

    detect_every: int  # the face detector runs on every k-th frame; boxes are interpolated in between
    detect_max_side: int  # analysis frames (display orientation) are downscaled to this longest side
    detect_threshold: float  # RetinaFace confidence
    min_face_px: float  # smaller faces (analysis pixels, short side) are ignored
    track_max_miss: int  # detection samples a track may miss before it ends
    mouth_lag_s: float  # mouth activity compares each frame's patches with those this long before
    activity_on: float  # mouth activity above this: the lips move
    still_face: float  # face change below this (90th percentile): a still picture, never a speaker
    smooth_s: float
    step_s: float
    switch_penalty: float
    contrast_min: float
    av_agreement: bool  # decide speakers on audio-visual agreement when the film has its own audio
    av_lag_s: float  # audio-visual agreement: the lag search covers +-this
    av_window_s: float  # agreement correlation window around each step
    av_margin_s: float  # ... reaching this far outside the step's stretch of speech
    av_min_window_s: float  # ... and at least this long
    av_on: float  # agreement above this (leading the other talking faces by av_margin): the speaker
    av_off: float  # talking faces all below this: nobody on screen says the line
    av_scale: float  # agreement above av_on of a full-strength score
    av_margin: float  # the speaker must out-agree every other talking face by this, else uncertain
    asd: Literal["auto", "off"]  # Light-ASD (tasks.perception.asd), joined with agreement: auto = own audio
    asd_on: float  # per-step mean speaking score above this: the face says the line
    asd_band: float  # a best face below asd_on + this: uncertain; so is one led by less than asd_margin by
    asd_margin: float  # ... a second face above asd_on + asd_band (two speakers?)
    asd_scale: float  # score above asd_on of a full-strength segment
    asd_switch_penalty: float  # evidence (steps x score units) a speaker change must win by
    asd_min_s: float  # a shorter speaker segment counts only as the previous speaker going on, else uncertain
    asd_sync_min: float  # a speaker's mean sync lead (tasks.perception.asd.sync_lead) must reach this
    asd_sync_sure: float  # ... a lone face's this; a face leading by this overrules agreement's "none"
    asd_max_faces: int  # tracks scored per shot at most (the most active mouths): bounds the cost
    voice_min_cos: float  # one face, two voices (GE2E cosine below this): its lines are uncertain; 0 = off
    voice_min_s: float  # ... lines shorter than this are not compared (tasks.perception.voices)
    # content (tasks.perception.content, content_fusion): mouth shapes against the sound's content
    content: Literal["auto", "off"]  # auto: whenever the film has its own audio; off: rhythm alone
    content_on: float  # two or more faces: the best face's fit at least this, leading every other by
    content_margin: float  # ... this much, is the speaker
    content_lone: float  # a lone face fitting at least this says the speech, confidently
    content_lone_off: float  # a lone face fitting at most this under speech: nobody on screen says it
    content_overrule: float  # two faces: content names another face than rhythm's likeliest only by this lead
    content_voice_split: float  # two faces: content's change of speaker needs voices either side below this cosine
    content_turn_min_s: float  # ... each turn at least this long
    content_turn_guard_s: float  # ... the speech this close to such a change is uncertain
    content_lone_none: bool  # a lone face fitting content_lone also says what rhythm gave nobody
    content_per_turn: bool  # two faces: each turn (one voice) decided once on its whole length
    content_min_s: float  # segments are scored over at least this much of the shot
    content_min_px: float  # faces smaller than this (median, analysis pixels) are not judged on content
    # the film-level verdict (tasks.decision.film_speakers): the content map calibrated on the film's confident
    # single-face lines, every shot judged again with it, voices bound to characters
    film: Literal["auto", "off"]  # auto: whenever shots are decided; off: each shot judged on its own
    film_strength: float  # ridge strength of the calibration towards the shipped prior
    film_min_s: float  # confident single-face speech needed before the map is calibrated
    bind_min_lines: int  # confident lines a character needs before its voice is bound to it
    bind_min_cos: float  # an uncertain line's voice this close (GE2E cosine) to a bound character's ...
    bind_margin: float  # ... and this much closer than to any other bound character's: that character speaks
    uncertain: Literal["most_likely", "skip", "largest"]  # what an uncertain segment dubs
    min_score: float  # a speaker segment scoring below this counts as uncertain
    vad_threshold: float
    vad_min_speech_s: float
    vad_min_silence_s: float
    vad_pad_s: float
    min_speech_s: float  # a dub slice "has speech" when its VAD segments add up to this


@dataclass(frozen=True)
class CastConfig:
    """Characters across the film (tasks.decision.characters, tasks.decision.cast) and per-character dub stems (tasks.decision.stems)."""

    characters: dict[str, Any]  # {NAME: [reference still, ...]}: names characters from a few stills
    names: dict[str, Any]  # {automatic id: NAME}: renames confirmed in the shot plan's characters: section
    undub: tuple[str, ...]  # characters never dubbed in the whole film (their lines pass through)
    identify: Literal["auto", "always", "never"]  # auto: when stems, stills, names or undub are given
    link_distance: float  # face embeddings closer than this vote "same person"
    link_votes: float  # share of a track's samples that must vote for one character to link it
    samples: int  # face samples embedded per track
    min_turn_s: float  # stem turns and overlaps of two stems shorter than this join a neighbouring turn
    bridge_s: float  # pauses in one stem shorter than this are part of its speech
    shot: dict[str, Any]  # filled by planning per shot (its tracks' characters, its stems' speech)


@dataclass(frozen=True)
class QcSettings:
    """Per dubbed shot: side-by-side preview + contact sheet in the run workspace."""

    enabled: bool
    height: int
    # the output check (tasks/perception/lip_check.py): the dubbed face's mouth shapes against the dub track's
    # content; a fit below this (or no mouth found) flags the shot for review; 0 = off
    lip_min_fit: float = 0.1


@dataclass(frozen=True)
class ShotPipelineConfig:
    """The per-shot chunk loop (`tasks.render.overlap`): decode ahead / finish behind the model on threads."""

    overlap: bool
    queue: int  # chunks decoded ahead and chunks waiting to be written, each at most
    composite_workers: int  # threads pasting a chunk's frames back (same bytes with any count); 1 = none
    film_prep: Literal["lead_in", "shot"]  # a backend's per-film caches: in a group's lead-in, or in a shot


@dataclass(frozen=True)
class EstimateConfig:
    """Benchmark figures behind `dubflow estimate` (seconds; None = not measured)."""

    reference_gpu: str  # the GPU the figures were measured on (what `dubflow estimate`'s times mean)
    dit_forward_s: dict[str, Any]  # {mode: {precision: s per DiT forward of a full chunk}}
    vae_chunk_s: dict[str, Any]  # {mode: s of VAE work per full chunk}
    load_s: dict[str, Any]  # {mode: s to load the models}


@dataclass(frozen=True)
class TimelineConfig:
    """The edit-suite timeline next to each output (`tasks.timeline.export`): `<out>.otio` always, and these."""

    edl: bool  # <out>.edl: a CMX 3600 EDL of the dubbed shots (an EDL holds one video track)
    fcp_xml: bool  # <out>.xml: Final Cut Pro 7 XML with the source, dubbed and dub-audio tracks


@dataclass(frozen=True)
class ReviewConfig:
    """The film run's review step (`flows.review`): one pause for the uncertain turns, a deadline."""

    enabled: bool  # a deployment run asks once in the Prefect UI (local runs never wait)
    timeout_s: float  # then the run resumes itself with the policy (never Failed, never stuck)


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
        cfg = _build(
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


def _validate_value(tp: Any, value: Any, where: str, key: str) -> Any:
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
        return _validate_value(inner[0], value, where, key)
    if origin is tuple:  # tuple[X, ...]: a YAML/JSON list of X
        if not isinstance(value, list | tuple):
            raise ConfigError(where, f"{key}: expected a list, got {value!r}")
        item = typing.get_args(tp)[0]
        return tuple(_validate_value(item, v, where, f"{key}[{i}]") for i, v in enumerate(value))
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
    return _build(cls, data, where, prefix)


def _build(cls: type, data: Any, where: str, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(where, f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        key = f"{prefix}{unknown[0]}"
        known = "" if key in REMOVED_KEYS else f" (known: {', '.join(names)})"
        raise ConfigError(where, _unknown_key(key) + known)
    missing = [n for n in names if n not in data]
    if missing:
        raise ConfigError(where, f"missing key {prefix}{missing[0]}")
    kwargs = {}
    for name in names:
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, data[name], where, f"{prefix}{name}.")
        else:
            kwargs[name] = _validate_value(tp, data[name], where, f"{prefix}{name}")
    return cls(**kwargs)


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
            raise ConfigError(where, _unknown_key(f"{prefix}{key}"))
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
                raise ConfigError("--set", _unknown_key(".".join(parts)))
        if not isinstance(node[part], dict):
            raise ConfigError("--set", f"{path} is not a section")
        node = node[part]
    leaf = ".".join(parts)
    parent = ".".join(parts[:-1])
    inside_free = parent in free_form or any(parent.startswith(f + ".") for f in free_form)
    if parts[-1] not in node and not inside_free:
        raise ConfigError("--set", _unknown_key(leaf))
    node[parts[-1]] = value


def _free_form_keys(cls: type, prefix: str = "") -> set[str]:
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out |= _free_form_keys(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is dict or tp is dict:
            out.add(f"{prefix}{f.name}")
    return out


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
    free = _free_form_keys(PipelineConfig) | _free_form_in_sections(data)
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(data, parts, value, free_form=free)
    where = "--set" if overrides else str(config_file or defaults)
    return PipelineConfig.from_dict(data, source=where)
