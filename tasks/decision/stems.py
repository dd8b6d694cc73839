"""Per-character dub stems: `--stem NAME=FILE` parsing, each stem's speech per shot, and who speaks when.

Holds `parse_stems` (the CLI / deployment form, one-line errors), `stem_speech` (Silero VAD over one
whole stem, the film's frames with speech as runs, each with its loudness), `shot_speech` (those runs
inside one shot) and `stem_turns`: a shot's speaker turns from its stems and its tracks' characters.
A stem speaks for its character: the turn's speaker is that character's on-screen (moving) track; speech
whose character is not on screen is voice-over (nobody dubbed, the reason says so); a character in
`cast.undub` is never dubbed; two on-screen characters whose stems overlap for at least `min_turn_s` make
one two-speaker turn (status "two", both people with their boxes, the louder one as the fallback
`speaker`: the contract with the two-person generation in tasks/infinitetalk/multi.py).
Must not decode media (callers pass samples) nor build regions (tasks.decision.gate does).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from tasks.config.pipeline import PipelineConfig
from tasks.config.speaker import SpeakerConfig
from tasks.decision.gate import speaker_turns
from tasks.decision.record import Turn
from tasks.errors import ConfigError
from tasks.perception.face_analysis import ShotFaces
from tasks.perception.speech import vad_settings
from tasks.perception.vad import RATE, resample_to_vad, segments, speech_probs

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\- ]{0,63}$")


def parse_stems(items: Sequence[str] | Mapping[str, str] | None, where: str = "--stem") -> dict[str, str]:
    """{NAME: FILE} from ``["NAME=FILE", ...]`` (or a mapping, the deployment parameter), checked."""
    pairs = list(items.items()) if isinstance(items, Mapping) else []
    if not isinstance(items, Mapping):
        for item in items or ():
            name, sep, path = str(item).partition("=")
            if not sep:
                raise ConfigError(where, f"{item!r}: expected NAME=FILE")
            pairs.append((name, path))
    out: dict[str, str] = {}
    for name, path in pairs:
        name, path = str(name).strip(), str(path).strip()
        if not NAME.match(name):
            raise ConfigError(where, f"{name!r}: a character name is letters, digits, _ . - or spaces")
        if not path:
            raise ConfigError(where, f"{name}: no file given")
        if name in out:
            raise ConfigError(where, f"{name}: two stems for one character")
        out[name] = path
    return out


def stem_speech(mono: np.ndarray, sample_rate: int, fps: Fraction, cfg: SpeakerConfig) -> list[list[float]]:
    """[[start_frame, end_frame, level_dbfs], ...] (film frames, end exclusive) where a whole stem speaks."""
    x = resample_to_vad(np.asarray(mono, np.float32), sample_rate)
    duration = len(x) / RATE
    out = []
    for a, b in segments(speech_probs(x), vad_settings(cfg), duration):
        s0, s1 = int(a * RATE), max(int(a * RATE) + 1, int(b * RATE))
        rms = float(np.sqrt(np.mean(np.square(x[s0:s1], dtype=np.float64))))
        level = round(20 * np.log10(max(rms, 1e-6)), 1)
        f0, f1 = int(np.floor(a * fps)), int(np.ceil(b * fps))
        if f1 > f0:
            out.append([f0, f1, level])
    return out


def shot_speech(runs: Sequence[Sequence[float]], start: int, end: int) -> list[list[float]]:
    """The runs of `stem_speech` inside film frames [start, end), shot-relative."""
    return [
        [max(a, start) - start, min(b, end) - start, lv] for a, b, lv in runs if a < end and b > start
    ]  # fmt: skip


def _track_at(faces: ShotFaces, ids: list[int]) -> np.ndarray:
    """(num_frames,) the first of ``ids``' tracks visible at each frame, -1 where none is."""
    out = np.full(faces.num_frames, -1)
    for k in reversed(ids):
        tr = faces.track(k)
        out[tr.start_frame : tr.end_frame] = k
    return out


def _union_box(faces: ShotFaces, track: int, start: int, end: int) -> list[int]:
    tr = faces.track(track)
    boxes = [b for _, b in tr.samples(start, end)] or list(tr.boxes)
    b = np.array(boxes)
    return [int(b[:, 0].min()), int(b[:, 1].min()), int(b[:, 2].max()), int(b[:, 3].max())]


def _runs(states: list[Any]) -> list[list[Any]]:
    """[[start, end, state]] of equal neighbours, skipping None (silence)."""
    out: list[list[Any]] = []
    for t, s in enumerate(states):
        if s is None:
            continue
        if out and out[-1][1] == t and out[-1][2] == s:
            out[-1][1] = t + 1
        else:
            out.append([t, t + 1, s])
    return out


def stem_turns(
    faces: ShotFaces,
    characters: Mapping[str, str],
    speech: Mapping[str, Sequence[Sequence[float]]],
    undub: Sequence[str],
    min_turn: int,
    bridge: int = 0,
) -> tuple[list[Turn], str]:
    """(turns covering the shot, why nothing is dubbed) from the stems' speech (shot-relative runs per
    character name) and ``characters`` ({track id (str): name}); see the module docstring.  A stem's
    pauses shorter than ``bridge`` frames are speech; a turn (or an overlap of two stems) shorter than
    ``min_turn`` frames joins the turn before it (the first one: the next)."""
    n = faces.num_frames
    moving = {t.id for t in faces.tracks if not t.still}
    names = sorted(speech)
    at = {nm: _track_at(faces, [int(k) for k, v in characters.items() if v == nm and int(k) in moving])
          for nm in names}  # fmt: skip
    level = {nm: np.full(n, -np.inf) for nm in names}
    for nm in names:
        runs_nm = sorted((int(a), int(b), float(lv)) for a, b, lv in speech[nm])
        for i, (a, b, lv) in enumerate(runs_nm):
            level[nm][a:b] = lv
            if i and 0 < a - runs_nm[i - 1][1] < bridge:  # a short pause: still this stem's turn
                level[nm][runs_nm[i - 1][1] : a] = min(lv, runs_nm[i - 1][2])
    states: list[Any] = []
    for t in range(n):
        talking = [nm for nm in names if level[nm][t] > -np.inf]
        dubbed = sorted(
            (nm for nm in talking if nm not in undub and at[nm][t] >= 0), key=lambda m: -level[m][t]
        )
        states.append(None if not talking else tuple(sorted(int(at[nm][t]) for nm in dubbed[:2])))
    runs = _runs(states)
    for i, run in enumerate(runs):
        if run[1] - run[0] >= min_turn:
            continue
        if len(run[2]) == 2:  # a short overlap of two stems: the louder one alone
            run[2] = (_louder(faces, characters, level, run),)
        elif len(runs) > 1:  # a short turn: part of its neighbour's
            run[2] = runs[i - 1][2] if i else runs[1][2]
    merged: list[list[Any]] = []
    for run in runs:
        if merged and merged[-1][2] == run[2]:
            merged[-1][1] = run[1]
        else:
            merged.append(run)
    turns: list[Turn] = []
    for i, (a, b, state) in enumerate(merged):
        start = 0 if i == 0 else (merged[i - 1][1] + a) // 2
        end = n if i == len(merged) - 1 else (b + merged[i + 1][0]) // 2
        if not state:
            turns.append(Turn(start=start, end=end, track=None, score=1.0, status="none"))
        elif len(state) == 1:
            turns.append(Turn(start=start, end=end, track=state[0], score=1.0, status="speaker"))
        else:
            people = tuple(
                {"track": k, "character": characters.get(str(k)), "stem": characters.get(str(k)),
                 "box": _union_box(faces, k, start, end)}
                for k in state
            )  # fmt: skip
            louder = _louder(faces, characters, level, [a, b, state])
            turns.append(Turn(start=start, end=end, track=louder, score=1.0, status="two", people=people))
    return turns, _why(names, level, at, undub, min_turn)


def _louder(faces: ShotFaces, characters: Mapping[str, str], level: Mapping[str, np.ndarray], run) -> int:
    """The track of ``run``'s two whose stem is louder over the run."""
    a, b, state = run

    def loud(k: int) -> float:
        lv = level[characters[str(k)]][a:b]
        return float(np.mean(lv[np.isfinite(lv)])) if np.isfinite(lv).any() else -np.inf

    return max(state, key=loud)


def _why(
    names: list[str], level: Mapping[str, np.ndarray], at: Mapping[str, np.ndarray], undub, least: int
) -> str:
    """Why a shot whose stems give no dubbed turn is passed through (stems speaking >= ``least`` frames)."""
    talking = [nm for nm in names if np.isfinite(level[nm]).sum() >= max(1, least)]
    if not talking:
        return "no stem speaks"
    off = [nm for nm in talking if nm not in undub and not (at[nm][np.isfinite(level[nm])] >= 0).any()]
    kept = [nm for nm in talking if nm in undub]
    parts = ([f"voice-over: {', '.join(off)} off screen"] if off else []) + (
        [f"{', '.join(kept)} undubbed (cast.undub)"] if kept else []
    )
    return "; ".join(parts) or "speaker off screen"


def undub_turns(
    turns: Sequence[Turn], characters: Mapping[str, str], undub: Sequence[str]
) -> tuple[list[Turn], str]:
    """The mixed track's speaker turns with the undubbed characters' turns emptied (and the reason)."""
    out, kept = [], []
    for turn in turns:
        who = characters.get(str(turn.track)) if turn.track is not None else None
        if who is not None and who in undub:
            kept.append(who)
            turn = dataclasses.replace(turn, track=None, status="none")
        out.append(turn)
    why = f"{', '.join(sorted(set(kept)))} undubbed (cast.undub)" if kept else ""
    return out, why


def cast_turns(faces: ShotFaces | None, cfg: PipelineConfig) -> tuple[list[Turn] | None, str, dict[str, str]]:
    """(turns for `tasks.decision.gate.decide_dub` or None for the face analysis's own, why nothing is dubbed,
    {track id: character}) of a shot under its effective config's `cast.shot` (filled by the planning)."""
    shot = cfg.cast.shot or {}
    names = {str(k): str(v) for k, v in (shot.get("tracks") or {}).items()}
    if faces is None:
        return None, "", names
    if "stems" in shot:
        frames = max(1, round(cfg.cast.min_turn_s * faces.fps)), round(cfg.cast.bridge_s * faces.fps)
        turns, why = stem_turns(faces, names, shot["stems"], cfg.cast.undub, *frames)
        return turns, why, names
    if cfg.cast.undub and names:
        turns, why = undub_turns(
            speaker_turns(faces, cfg.speaker.uncertain, cfg.speaker.min_score), names, cfg.cast.undub
        )
        return turns, why, names
    return None, "", names


__all__ = ["cast_turns", "parse_stems", "shot_speech", "stem_speech", "stem_turns", "undub_turns"]
