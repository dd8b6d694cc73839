"""Per-shot result keys: a hash of exactly what one shot's rendered pixels depend on, and nothing else.

A shot's finished result (and its chunk checkpoints) is reused whenever its key is unchanged. The key is
the SHA-256 of `ShotInputs`:

* the source frames: the film's content fingerprint and the shot's chunk plan (frame range, chunking);
* the dub audio it is conditioned on: the dialogue samples over `conditioning_span` (its slice, the model
  window past its end, the sampler's audio window and `workspace.audio_context_s` of context each side);
* its effective settings (`shot_config`: the global config with the shot's own overrides applied) minus
  the config that never changes pixels (`NON_PIXEL_CONFIG`); of `gate.overrides`, `gate.speakers` and
  `gate.crops` only its own entry;
* the weights' identity (`weights_identity`: file names, sizes and mtimes, not their path);
* `RENDER_VERSION`, bumped by hand when an algorithm change alters pixels (tests/test_shot_keys.py pins
  the tiny model's output per version and fails when pixels change without a bump). Not a hash of the
  code: an upgrade that does not bump it keeps every result.

The planning's face analysis of a shot (`tasks.decision.shot_decision`) has its own, smaller key (`faces_key`): it
reads the source frames and the source audio under them, never the dub audio (one exception, checked
where the file is read: a shot without source speech takes its speech timeline from the dub slice), so
an audio edit or a change of gate or region settings reuses it.

Accepted approximation: wav2vec2 normalises the waveform with whole-track statistics and its attention
reaches up to `model.network.wav2vec.AudioWindowing` (60 s windows, 10 s margins), so a line re-recorded far from
a shot shifts that shot's features a little; outside `audio_context_s` such a change does not re-render it
(`audio_context_s: null` hashes the whole track: any audio change re-renders every shot).

Pure functions over records, config dicts and files; no Prefect, no rendering, no workspace layout.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from tasks.backends import effective_options
from tasks.config.pipeline import PipelineConfig
from tasks.media.audio import DialogueTrack, read_samples

RENDER_VERSION = 5  # bump when a change alters any shot's pixels (the pinned tiny-model hash says when)
# 3: RetinaFace replaces YuNet (other face boxes, so other crops); speaker switches split the chunk plan
# 5: the learned route's sync-lead rules (a lone face, contradicted verdicts) change who some shots dub

# Config that never changes a shot's pixels (output encoding, where files go, early checks, costs, fault
# injection) or is run-level (probe, shot detection: the shot's range is in the key); the overlapped chunk
# pipeline (`pipeline`) writes the same bytes as the sequential loop; the backend's own such options are left
# out by its `effective_options` hook (for_key). `gate.overrides` is reduced to the
# shot's own entry by `shot_settings`, as the other per-shot gate maps are. Of `cast`, what links and names
# characters reaches a shot only through its `cast.shot` (its tracks' characters and stems' speech, filled by
# the planning), which stays.
PER_SHOT_GATE = ("overrides", "speakers", "crops", "answers")  # {shot index: value} maps of the gate section
NON_PIXEL_CONFIG = (
    "encode", "workspace", "checks", "cost", "estimate", "debug", "probe", "shots", "timeline", "pipeline", "cast.characters", "cast.names", "cast.identify", "cast.link_distance", "cast.link_votes",
    "cast.samples", "review",
)  # fmt: skip
# `speaker` keys only the gate reads (the dub slice's speech, the uncertainty policy), not the face analysis
GATE_ONLY_SPEAKER = (
    "uncertain",
    "min_score",
    "min_speech_s",
    "vad_min_speech_s",
    "vad_min_silence_s",
    "vad_pad_s",
    # the film-level verdict's keys: read after every shot's analysis (its result goes into cast.shot)
    "film",
    "film_strength",
    "film_min_s",
    "bind_min_lines",
    "bind_min_cos",
    "bind_margin",
)
LOCAL_REACH_S = 0.12  # the sampler's 5-frame audio window at 25 fps (+-0.08 s) + wav2vec2's 25 ms frame


@dataclasses.dataclass(frozen=True)
class ShotInputs:
    """What a shot's key is made of (kept in its done marker, so a changed key can be explained)."""

    render_version: int
    film: str  # content fingerprint of the source film
    plan: dict[str, Any]  # ShotPlan.to_dict(): frame range and chunking
    audio: dict[str, Any]  # {"span": [a, b], "samples": sha256, "rate", "track_samples"}
    settings: dict[str, Any]  # effective pixel settings (shot_settings)
    weights: str  # weights_identity

    def key(self) -> str:
        """20 hex digits of the SHA-256 of the canonical JSON of these inputs."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


# ----------------------------------------------------------------------------------------- settings


def shot_config(config: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shot's effective config dict: `config` with the nested `overrides` merged in.

    The shot's entries of the per-shot gate maps (`PER_SHOT_GATE`) replace any entry for the same index
    spelt differently (3 / "3").
    """
    out = copy.deepcopy(dict(config))
    for section, values in (overrides or {}).items():
        if section == "gate" and any(k in values for k in PER_SHOT_GATE):
            gate = out["gate"] = {
                **out["gate"],
                **{k: v for k, v in values.items() if k not in PER_SHOT_GATE},
            }
            for name in (k for k in PER_SHOT_GATE if k in values):
                mine = {str(k) for k in values[name]}
                kept = {k: v for k, v in gate.get(name, {}).items() if str(k) not in mine}
                gate[name] = {**kept, **copy.deepcopy(dict(values[name]))}
        elif isinstance(values, Mapping):
            out[section] = {**out[section], **copy.deepcopy(dict(values))}
        else:
            out[section] = copy.deepcopy(values)
    return out


def shot_configs(
    config: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> Callable[[int], PipelineConfig]:
    """``cfg_of(index)``: shot `index`'s effective config, typed: `config` with that shot's record's
    ``overrides`` merged in (`shot_config`); a shot without a record, or without overrides, gets `config`."""
    by_index = {r["index"]: r for r in records}

    def cfg_of(index: int) -> PipelineConfig:
        return PipelineConfig.from_dict(shot_config(config, (by_index.get(index) or {}).get("overrides")))

    return cfg_of


def shot_settings(config: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The pixel-affecting part of a shot's effective config (see the module docstring).

    The backend's options are made effective first (its `effective_options` hook through the registry,
    `tasks.backends`: options applied over its own sections, the weights path left out since
    `weights_identity` stands for the files).
    """
    data = effective_options(config, for_key=True)
    gate = data.get("gate", {})
    for name in (k for k in PER_SHOT_GATE if k in gate):
        own = [v for k, v in gate[name].items() if str(k) == str(index)]
        if name == "overrides":
            gate[name] = str(own[-1]).strip().lower() if own else None
        elif own:
            gate[name] = own[-1]
        else:  # absent, not None: a shot without one keeps the key it had before these maps existed
            del gate[name]
    cast = data.get("cast") or {}
    if not cast.get("shot") and not cast.get("undub"):  # no characters in play: keys as before `cast:`
        data.pop("cast", None)
    for key in NON_PIXEL_CONFIG:  # "section" or "section.key"
        section, _, leaf = key.partition(".")
        if not leaf:
            data.pop(section, None)
        elif isinstance(data.get(section), dict):
            data[section].pop(leaf, None)
    return data


# -------------------------------------------------------------------------------------------- audio


def conditioning_span(
    plan: Mapping[str, Any], audio_range: tuple[int, int], track: DialogueTrack, context_s: float | None
) -> tuple[int, int]:
    """Dialogue samples [a, b) a shot's render reads, directly or through its audio features.

    The shot's slice (gate, QC), its model frames from the shot start to the last chunk's `model_end`
    (the model window runs past the shot's end), widened by `LOCAL_REACH_S` and `context_s` each side;
    `context_s=None`: the whole track.
    """
    if context_s is None:
        return 0, track.n_samples
    fps = Fraction(plan["fps"])
    start_s = plan["start_frame"] / fps
    last = plan["chunks"][-1] if plan["chunks"] else {"model_start": 0, "num_frames": 0}
    model_end = last["model_start"] + last["num_frames"]
    end_s = start_s + Fraction(model_end, plan["model_fps"])
    reach = LOCAL_REACH_S + context_s
    a = math.floor((start_s - Fraction(reach)) * track.sample_rate)
    b = math.ceil((end_s + Fraction(reach)) * track.sample_rate)
    a, b = min(a, audio_range[0]), max(b, audio_range[1])
    return max(0, a), min(track.n_samples, b)


def audio_identity(track: DialogueTrack, span: tuple[int, int], block: int = 1 << 20) -> dict[str, Any]:
    """The span and the SHA-256 of its float32 samples (read in blocks: a whole-track span is hours)."""
    a, b = span
    digest = hashlib.sha256(f"{track.sample_rate}:{track.channels}:".encode())
    for start in range(a, b, block):
        digest.update(read_samples(track, start, min(b, start + block)).tobytes())
    return {
        "span": [a, b],
        "samples": digest.hexdigest()[:32],
        "rate": track.sample_rate,
        "track_samples": track.n_samples,
    }


# ------------------------------------------------------------------------------------------ the key


def shot_inputs(
    *,
    film_fingerprint: str,
    plan: Mapping[str, Any],
    audio_range: tuple[int, int],
    track: DialogueTrack,
    config: Mapping[str, Any],
    context_s: float | None,
    stems: Mapping[str, DialogueTrack] | None = None,
    weights_identity: Callable[..., str],
) -> ShotInputs:
    """The `ShotInputs` of one shot; `config` is the shot's effective config (`shot_config`); ``stems``:
    the per-character dub stems (same rate and length as ``track``), hashed over the same span;
    ``weights_identity(config, multi=...)``: the backend's (`tasks.render.backend.backend_weights_identity`),
    ``multi`` when the shot can run two speakers (two or more stems)."""
    span = conditioning_span(plan, audio_range, track, context_s)
    audio = audio_identity(track, span)
    if stems:
        audio["stems"] = {name: audio_identity(stems[name], span) for name in sorted(stems)}
    return ShotInputs(
        render_version=RENDER_VERSION,
        film=film_fingerprint,
        plan=dict(plan),
        audio=audio,
        settings=shot_settings(config, int(plan["shot_index"])),
        weights=weights_identity(config, multi=len(stems or {}) >= 2),
    )


def faces_key(start_frame: int, end_frame: int, speaker: Mapping[str, Any]) -> str:
    """16 hex digits naming a shot's face analysis inside its film's run workspace: the frame range (the
    source frames and the source audio under them), the analysis part of the `speaker` section and
    `RENDER_VERSION` (an analysis change alters decisions, hence pixels)."""
    settings = {k: v for k, v in sorted(speaker.items()) if k not in GATE_ONLY_SPEAKER}
    blob = json.dumps([RENDER_VERSION, start_frame, end_frame, settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
