"""The dub decision of one shot, as planning takes it: the dub slice's speech, the shot's face analysis, the gate.

Holds `decide_shot` (one shot; `dubflow estimate`, the film run's planning step and the backend's fallback
all call it), `region_config` (the region geometry settings of a pipeline config) and the JSON the estimate
and the shot table show (`regions_json`: boxes in display pixels, film frame numbers).  The face analysis
(`tasks.perception.face_analysis`) is the expensive part: it runs only when the outcome can depend on it, and is read
from / written to ``cache`` (a JSON file per shot in the run workspace) when one is given, so a GPU worker
that finds the planning's file never decodes or analyses anything.  A shot's speaker / crop override
(`gate.speakers`, `gate.crops`, e.g. from an edited shot plan) replaces the automatic region after the gate.
Must not run a dubbing model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from tasks.config.pipeline import PipelineConfig
from tasks.decision.gate import answer_turns, apply_region_overrides, decide_dub, speaker_turns
from tasks.decision.overrides import ShotOverrides, needs_faces, precedence, shot_overrides
from tasks.decision.record import ShotDecision
from tasks.decision.stems import cast_turns
from tasks.errors import ConfigError
from tasks.files import head_tail_fingerprint, read_bound_json, write_bound_json
from tasks.media.probe import VideoInfo
from tasks.perception.face_analysis import ShotFaces, analyse_shot, source_speech
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.speech import SpeechInfo, detect_speech
from tasks.perception.vad import at_frames, resample_to_vad, speech_probs
from tasks.picture.region import RegionConfig
from tasks.timeline.shot_key import GATE_ONLY_SPEAKER, faces_key

log = logging.getLogger(__name__)


def region_config(cfg: PipelineConfig) -> RegionConfig:
    """`tasks.picture.region.RegionConfig` from the pipeline config (the bucket table follows frames.bucket)."""
    r = cfg.region
    return RegionConfig(
        mode=r.mode, size=f"infinitetalk-{cfg.frames.bucket}", motion=r.motion, feather_px=r.feather_px,
        expand_w=r.expand_w, expand_h=r.expand_h,
    )  # fmt: skip


def faces_path(work_dir: str | Path, shot_index: int, start: int, end: int, cfg: PipelineConfig) -> Path:
    """Where the planning keeps the face analysis of shot frames [start, end) in the film's run workspace:
    ``faces/<index>-<faces key>.json`` (the key: the frames and the analysis settings, not the dub audio)."""
    key = faces_key(start, end, dataclasses.asdict(cfg.speaker))
    return Path(work_dir) / "faces" / f"{shot_index:04d}-{key}.json"


def _dub_digest(mono: np.ndarray) -> str:
    """Identity of the dub slice a face analysis took its speech timeline from (no source speech)."""
    return hashlib.sha256(np.ascontiguousarray(mono, dtype=np.float32).tobytes()).hexdigest()[:20]


def faces_made_from(info: VideoInfo, start: int, end: int, cfg: PipelineConfig) -> dict[str, Any]:
    """What a shot's face analysis is made from: the film's content, the frames and the analysis settings
    (its cache is bound to it: `tasks.files.write_bound_json`); the gate's and the film step's own `speaker`
    keys are left out (`GATE_ONLY_SPEAKER`: changing them re-decides, it does not re-analyse)."""
    speaker = {k: v for k, v in dataclasses.asdict(cfg.speaker).items() if k not in GATE_ONLY_SPEAKER}
    return {"film": head_tail_fingerprint(info.path), "frames": [start, end], "speaker": speaker}


def _cached_faces(cache: Path, mono: np.ndarray, made_from: dict[str, Any]) -> ShotFaces | None:
    """The analysis in ``cache`` when it was made from `made_from` (else removed, logged), unless its speech
    timeline came from a dub slice that has changed."""
    saved = read_bound_json(cache, made_from, "face analysis")
    if saved is None:
        return None
    try:
        faces = ShotFaces.from_dict(saved)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # damaged: never a stuck state
        log.warning(
            "%s: unreadable face analysis (%s: %s): analysing the shot again", cache, type(exc).__name__, exc
        )
        return None
    if not faces.source_audio and saved.get("dub_audio") != _dub_digest(mono):
        return None
    return faces


def _no_faces(info: VideoInfo, start: int, end: int) -> ShotFaces:
    """An analysis with no faces, for a shot whose decision and region cannot depend on the picture."""
    w, h = info.display_size
    return ShotFaces(
        num_frames=end - start, fps=float(info.fps), display_hw=(h, w), analysis_hw=(h, w), source_audio=False,
        tracks=(), segments=(), speech=(), activity=(), step_frames=1, cpu_s=0.0,
    )  # fmt: skip


def shot_faces(
    info: VideoInfo, start: int, end: int, dub_mono: np.ndarray, sample_rate: int, cfg: PipelineConfig
) -> ShotFaces:
    """Analyse frames [start, end): the speech timeline is the source's own audio when it has speech there,
    else the dub slice's (a film without audio, or a source VAD that hears nothing under loud music)."""
    probs = source_speech(info, start, end)
    source_audio = probs is not None and bool((probs >= cfg.speaker.vad_threshold).any())
    if not source_audio:
        dub = speech_probs(resample_to_vad(dub_mono, sample_rate))
        probs = at_frames(dub, end - start, float(info.fps))
    return analyse_shot(info, start, end, probs, cfg.speaker, source_audio=source_audio)


def needed_faces(
    ov: ShotOverrides, start: int, end: int, info: VideoInfo, audio: np.ndarray, sample_rate: int,
    cfg: PipelineConfig, cache: Path | None = None, *, planned: bool = False,
) -> tuple[SpeechInfo, ShotFaces | None]:  # fmt: skip
    """The dub slice's speech and, when the shot's outcome can depend on it (`tasks.decision.overrides`:
    `precedence`, then `needs_faces`), its face analysis (read from / written to ``cache``; see
    `decide_shot`). ``ov``: the shot's overrides."""
    mono = np.ascontiguousarray(audio.mean(axis=1) if audio.ndim == 2 else audio, dtype=np.float32)
    speech = detect_speech(mono, sample_rate, cfg.speaker)
    faces = None
    if needs_faces(ov, precedence(ov, cfg.gate.policy, speech), cfg.region.mode):
        made_from = faces_made_from(info, start, end, cfg) if cache is not None else {}
        if cache is not None:
            faces = _cached_faces(cache, mono, made_from)
        if faces is None:
            if planned:
                log.warning(
                    "shot %04d: no face analysis from planning (%s): analysing it here", ov.index, cache
                )
            faces = shot_faces(info, start, end, mono, sample_rate, cfg)
            if (
                cache is not None and faces_made_from(info, start, end, cfg) == made_from
            ):  # the film read is the one named
                dub = None if faces.source_audio else _dub_digest(mono)
                write_bound_json(
                    cache, made_from, {**faces.to_dict(), "dub_audio": dub, "verdict": faces.verdict}
                )
    elif cfg.region.mode == "full":
        faces = _no_faces(info, start, end)
    return speech, faces


def decide_shot(
    shot_index: int,
    start: int,
    end: int,
    info: VideoInfo,
    audio: np.ndarray,
    sample_rate: int,
    cfg: PipelineConfig,
    cache: Path | None = None,
    *,
    planned: bool = False,
) -> ShotDecision:
    """Speech in the dub slice ``audio`` ((S, C) or (S,) float32), then (only when the outcome can depend on
    it) the face analysis of frames [start, end), then the gate.  ``cache``: the analysis JSON file;
    ``planned``: the planning should have written it (a GPU worker's call), so its absence is logged."""
    frame_hw = info.display_size[::-1]
    ov = shot_overrides(shot_index, cfg.gate, frame_hw)  # parsed once, checked before any analysis
    speech, faces = needed_faces(ov, start, end, info, audio, sample_rate, cfg, cache, planned=planned)
    film = (cfg.cast.shot or {}).get("speakers")  # the film-level verdict (tasks.decision.film_speakers)
    if faces is not None and film is not None:
        faces = dataclasses.replace(faces, segments=tuple(SpeakerSegment.from_dict(s) for s in film))
    turns, why_not, names = cast_turns(faces, cfg)  # per-character stems / undubbed characters (stems.py)
    region = region_config(cfg)
    try:
        if faces is not None and turns is None:
            turns = speaker_turns(faces, cfg.speaker.uncertain, cfg.speaker.min_score)
        if faces is not None and ov.answers:  # the review's answers (gate.answers, a plan's `answers:`)
            turns = answer_turns(turns or [], ov.answers, start, faces, shot_index)
            if all(t.track is None for t in turns):
                why_not = why_not or "review: nobody on screen says the line"
        d = decide_dub(
            ov, speech, faces, region, cfg.gate, cfg.speaker, turns=turns, why_not=why_not, names=names
        )
        d = apply_region_overrides(d, ov, faces, region, frame_hw, end - start)
    except ValueError as ex:
        raise ConfigError("gate", str(ex)) from ex
    return dataclasses.replace(d, speech=speech, faces=faces, characters=names, turns=tuple(turns or ()))


def switch_frames(decision: ShotDecision) -> list[int]:
    """Shot frames where the dubbed region moves to another speaker (the renderer splits the chunk plan
    there, `tasks.timeline.plan.split_at`): the start of every region after the first."""
    regions = sorted(decision.regions, key=lambda r: r.start_frame) if decision.dub else []
    return [
        r.start_frame for prev, r in zip(regions[:-1], regions[1:], strict=True) if r.speaker != prev.speaker
    ]


def regions_json(decision: ShotDecision, shot_start: int) -> list[dict[str, Any]]:
    """The estimate's / shot table's regions: film frames, box in display pixels, speaker track and score,
    the speaker's character (None when unknown) and, for a two-speaker region, its people."""
    names = decision.characters
    out = []
    for r in decision.regions if decision.dub else ():
        out.append(
            {
                "start_frame": shot_start + r.start_frame,
                "end_frame": shot_start + r.end_frame,
                "box": list(r.plan.box),
                "speaker": r.speaker,
                "score": r.score,
                "status": r.status,
                "character": names.get(str(r.speaker)),
                **({"people": [dict(p) for p in r.people]} if r.people else {}),
            }  # fmt: skip
        )
    return out


__all__ = [
    "decide_shot",
    "faces_path",
    "needed_faces",
    "region_config",
    "regions_json",
    "shot_faces",
    "switch_frames",
]
