"""The cast: the `cast:` section / `--cast cast.yaml` file, and the film-level character and stem planning.

A cast file holds the `cast:` section's user keys: ``characters: {NAME: [still.png, ...]}`` (reference
stills naming a character), ``undub: [NAME, ...]`` and ``names: {c1: NAME}``; `read_cast_file` checks it
(one-line errors naming the file), `check_cast` checks the stills exist and the stems name known
characters before any expensive work.  `plan_cast` is the planning step: every shot's face analysis
(the cached one of `tasks.decision.shot_decision`), a few face embeddings per track (cached next to it, keyed by
the analysis and the embedding settings), the characters of the whole film (`tasks.decision.characters`) and each
stem's speech, as one small per-shot `cast.shot` config override (its tracks' characters, its stems'
speech) that the gate reads; being config, it is part of each shot's result key.  The shot plan's
`characters:` section (`plan_characters` writes it, `plan_names` reads the renames back) lets a user
confirm or rename the automatic clusters.
Must not decide whether a shot is dubbed (`tasks.decision.gate`, `tasks.decision.stems`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.config.pipeline import PipelineConfig
from tasks.decision.characters import Character, TrackFaces, display_name, link_characters, shot_characters
from tasks.decision.overrides import ShotOverrides, dub_action
from tasks.decision.stems import NAME, shot_speech
from tasks.errors import ConfigError
from tasks.files import digest_of, head_tail_fingerprint, load_yaml, read_bound_json, write_bound_json
from tasks.perception.face_analysis import ShotFaces

log = logging.getLogger(__name__)

CAST_KEYS = ("characters", "undub", "names")
AUTO_ID = "c"  # automatic character ids: c1, c2, ...


def read_cast_file(path: str | Path) -> dict[str, Any]:
    """The `cast:` updates of a cast file (relative still paths resolved against the file's folder)."""
    p = Path(path)
    data = load_yaml(p, "cast file")  # a regular file, bounded, no aliases (tasks/files.py)
    if not isinstance(data, dict):
        raise ConfigError(p, "a cast file is a mapping: characters: {NAME: [still, ...]}, undub: [NAME]")
    unknown = sorted(set(data) - set(CAST_KEYS))
    if unknown:
        raise ConfigError(p, f"unknown key {unknown[0]!r} (known: {', '.join(CAST_KEYS)})")
    chars = data.get("characters") or {}
    if not isinstance(chars, dict):
        raise ConfigError(p, "characters: expected a mapping NAME: [still, ...]")
    out: dict[str, Any] = {"characters": {}}
    for name, stills in chars.items():
        if not NAME.match(str(name)):
            raise ConfigError(
                p, f"characters: {name!r} is not a character name (letters, digits, _ . - space)"
            )
        stills = [stills] if isinstance(stills, str) else stills
        if not isinstance(stills, list) or not stills or not all(isinstance(s, str) for s in stills):
            raise ConfigError(p, f"characters: {name}: expected a list of still image files")
        out["characters"][str(name)] = [str((p.parent / s).resolve()) for s in stills]
    undub = data.get("undub") or []
    if not isinstance(undub, list) or not all(isinstance(u, str) for u in undub):
        raise ConfigError(p, "undub: expected a list of character names")
    out["undub"] = undub
    names = data.get("names") or {}
    if not isinstance(names, dict):
        raise ConfigError(p, "names: expected a mapping automatic id: NAME")
    out["names"] = {str(k): str(v) for k, v in names.items()}
    return out


def cast_active(cfg: PipelineConfig, stems: Mapping[str, Any] | None) -> bool:
    """Whether the run links characters (`cast.identify`; auto: stems, stills, names or undub given)."""
    c = cfg.cast
    if c.identify != "auto":
        return c.identify == "always"
    return bool(stems or c.characters or c.names or c.undub)


def check_cast(cfg: PipelineConfig, stems: Mapping[str, Any] | None) -> None:
    """Before expensive work: stills exist, every stem / undub name can be a character (one-line errors)."""
    if cfg.cast.identify == "never" and stems:
        raise ConfigError("cast.identify", "never: stems need characters (auto or always)")
    for name, stills in cfg.cast.characters.items():
        if isinstance(stills, str) or not isinstance(stills, list | tuple) or not stills:
            raise ConfigError("cast.characters", f"{name}: expected a list of still image files")
        for still in stills:
            if not Path(str(still)).is_file():
                raise ConfigError(str(still), f"cast still of {name} not found")
    known = set(cfg.cast.characters) | {str(v) for v in cfg.cast.names.values()}
    for where, names in (("--stem", list(stems or ())), ("cast.undub", list(cfg.cast.undub))):
        for name in names:
            if name not in known and not _is_auto(name):
                hint = ", ".join(sorted(known)) or "none named; name them in cast.characters or the plan"
                raise ConfigError(
                    where, f"{name}: no such character (known: {hint}; or an automatic id c1, c2, ...)"
                )


def _is_auto(name: str) -> bool:
    return name.startswith(AUTO_ID) and name[len(AUTO_ID) :].isdigit()


def references(cfg: PipelineConfig) -> dict[str, np.ndarray]:
    """{NAME: (k, 128)} embeddings of the cast's reference stills."""
    from tasks.perception.face_id import still_embeddings

    return {
        str(name): np.concatenate([still_embeddings(s) for s in stills])
        for name, stills in cfg.cast.characters.items()
    }  # fmt: skip


@dataclass(frozen=True)
class CastPlan:
    """The planning's cast: the film's characters and each shot's `cast.shot` override."""

    characters: tuple[dict[str, Any], ...]  # {"id", "name", "tracks": [[shot, track]], "shots"}
    shots: dict[int, dict[str, Any]]  # shot index -> cast.shot

    def overrides(self, index: int, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A shot's own config overrides (its plan-file ones, if any) with its `cast.shot` added."""
        shot = self.shots.get(index) or self.shots.get(str(index)) or {}  # str: after a JSON round trip
        return with_cast_shot(overrides, shot)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def with_cast_shot(overrides: Mapping[str, Any] | None, shot: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` (a shot's nested config overrides) with ``cast.shot`` set to ``shot``."""
    out = dict(overrides or {})
    out["cast"] = {**dict(out.get("cast") or {}), "shot": dict(shot)}
    return out


def _embeddings_cache(faces_file: Path | None, cfg: PipelineConfig) -> Path | None:
    from tasks.perception.face_id import MODEL_ID

    if faces_file is None:
        return None
    key = hashlib.sha256(f"{MODEL_ID}:{cfg.cast.samples}".encode()).hexdigest()[:10]
    return faces_file.with_name(f"{faces_file.stem}.ids-{key}.json")


def shot_embeddings(
    info: Any, start: int, end: int, faces: ShotFaces, cfg: PipelineConfig, faces_file: Path | None
) -> dict[int, np.ndarray]:
    """{track: (k, 128)} of one shot, read from / written next to its face analysis file."""
    from tasks.perception.face_id import MODEL_ID, track_embeddings

    cache = _embeddings_cache(faces_file, cfg)
    made_from = None if cache is None else {
        "film": head_tail_fingerprint(info.path), "frames": [start, end], "model": MODEL_ID,
        "samples": cfg.cast.samples, "faces": digest_of(faces.to_dict()),
    }  # fmt: skip
    saved = read_bound_json(cache, made_from, "embeddings cache") if cache is not None else None
    if saved is not None:
        try:
            return {int(k): np.array(v).reshape(-1, 128) for k, v in saved.items()}
        except (ValueError, TypeError, AttributeError) as ex:
            log.warning("%s: unreadable embeddings cache (%s): computing them again", cache, ex)
    emb = track_embeddings(info, start, end, faces, cfg.cast.samples)
    if cache is not None:
        write_bound_json(cache, made_from, {str(k): v.round(6).tolist() for k, v in emb.items()})
    return emb


FacesOf = Callable[[int], tuple[ShotFaces | None, Path | None]]  # shot index -> (analysis, its cache file)


def plan_cast(
    info: Any,
    shots: Sequence[tuple[int, int, int]],
    faces_of: FacesOf,
    cfg: PipelineConfig,
    stem_runs: Mapping[str, Sequence[Sequence[float]]] | None = None,
) -> CastPlan:
    """Characters of the film's shots ``[(index, start_frame, end_frame)]`` and each shot's `cast.shot`;
    ``faces_of(index)``: that shot's face analysis (None: not needed) and its cache file; ``stem_runs``:
    {NAME: `tasks.decision.stems.stem_speech` of that stem}."""
    refs = references(cfg)  # the stills first: a bad one fails before any face analysis
    tracks: list[TrackFaces] = []
    for index, start, end in shots:
        faces, cache = faces_of(index)
        if faces is None or not faces.tracks:
            continue
        emb = shot_embeddings(info, start, end, faces, cfg, cache)
        for tr in faces.tracks:
            if tr.id in emb:
                tracks.append(TrackFaces(index, tr.id, tr.start_frame, tr.end_frame, emb[tr.id]))
    chars = link_characters(
        tracks, refs, link_distance=cfg.cast.link_distance, link_votes=cfg.cast.link_votes
    )
    per_shot = shot_characters(chars, cfg.cast.names)
    out: dict[int, dict[str, Any]] = {}
    for index, start, end in shots:
        shot: dict[str, Any] = {"tracks": per_shot.get(index, {})}
        if stem_runs:
            shot["stems"] = {n: shot_speech(r, start, end) for n, r in sorted(stem_runs.items())}
        out[index] = shot
    summary = tuple(_summary(c, cfg.cast.names) for c in chars)
    log.info("%d character(s) over %d track(s): %s", len(chars), len(tracks), [c["name"] for c in summary])
    return CastPlan(summary, out)


def _summary(ch: Character, names: Mapping[str, Any]) -> dict[str, Any]:
    return {**ch.to_dict(), "name": display_name(ch.id, names) if (ch.name or ch.id in names) else None,
            "shots": sorted({s for s, _ in ch.tracks})}  # fmt: skip


def load_stem(path: str | Path, frame_count: int, fps: Any, cfg: PipelineConfig) -> np.ndarray:
    """A stem decoded to mono at `audio.sample_rate`, checked like the dialogue track (length against the
    picture under `audio.length_policy`, finite samples; one-line errors naming the file) and conformed."""
    from tasks.media.audio import check_length, conform, decode_audio

    x = decode_audio(path, sample_rate=cfg.audio.sample_rate, channels=1)
    decision = check_length(
        x.shape[0], cfg.audio.sample_rate, frame_count, fps, cfg.audio.length_policy, path=path
    )
    return conform(x, decision)[:, 0]


def film_cast(
    info: Any,
    shots: Sequence[tuple[int, int, int, tuple[int, int]]],
    dialogue: Callable[[int, int], np.ndarray],
    sample_rate: int,
    stems: Mapping[str, np.ndarray] | None,
    cfg_of: Callable[[int], PipelineConfig],
    work_dir: str | Path,
) -> CastPlan:
    """`plan_cast` over a film: shots ``[(index, start, end, (first, end sample))]``, ``dialogue(a, b)``
    the dub track's samples, ``stems`` {NAME: mono samples}, ``cfg_of(index)`` a shot's effective config;
    the face analyses are read from / written to ``work_dir``'s faces/ (`tasks.decision.shot_decision`)."""
    from tasks.decision.shot_decision import faces_path, needed_faces
    from tasks.decision.stems import stem_speech

    spans = {i: (s, e, ab) for i, s, e, ab in shots}

    def faces_of(index: int) -> tuple[ShotFaces | None, Path | None]:
        start, end, (a, b) = spans[index]
        cfg_i = cfg_of(index)
        cache = faces_path(work_dir, index, start, end, cfg_i)
        own = ShotOverrides(index, action=dub_action(index, cfg_i.gate))  # a plan's speaker track: not here
        _, faces = needed_faces(own, start, end, info, dialogue(a, b), sample_rate, cfg_i, cache)
        return faces, cache

    cfg = cfg_of(-1)
    runs = {n: stem_speech(x, sample_rate, info.fps, cfg.speaker) for n, x in (stems or {}).items()}
    return plan_cast(info, [(i, s, e) for i, s, e, _ in shots], faces_of, cfg, runs or None)


# ------------------------------------------------------------------------------ the shot plan's section


def plan_characters(characters: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The shot plan's `characters:` section: each automatic cluster, its shots, and a name to fill in."""
    return [{"id": c["id"], "name": c.get("name"), "shots": list(c.get("shots") or [])} for c in characters]


def plan_names(path: str | Path) -> dict[str, str]:
    """{automatic id: NAME} a user set in a shot plan's `characters:` section (one-line errors)."""
    p = Path(path)
    data = load_yaml(p, "shot plan")
    section = (data or {}).get("characters") if isinstance(data, dict) else None
    if section is None:
        return {}
    if not isinstance(section, list):
        raise ConfigError(p, "characters: expected a list of {id, name, shots}")
    out = {}
    for n, entry in enumerate(section):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ConfigError(p, f"characters[{n}]: expected a mapping with a string id")
        name = entry.get("name")
        if name is None or name == entry["id"]:
            continue
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(p, f"characters[{n}] ({entry['id']}): name {name!r} is not a character name")
        out[entry["id"]] = name
    return out


__all__ = [
    "CastPlan",
    "cast_active",
    "check_cast",
    "film_cast",
    "load_stem",
    "plan_cast",
    "plan_characters",
    "plan_names",
    "read_cast_file",
    "references",
    "with_cast_shot",
]
