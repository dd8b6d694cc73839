"""Who speaks, judged once more over the whole film: the content map calibrated on the film's own lines, and
voices bound to characters.

A shot judged alone knows only the shipped prior (an audio -> mouth-shape map fitted on nine heads) and its own
frames.  Once every shot is analysed, the film knows more:

1. **Calibration.** Its *confident single-face lines* (`single_face_lines`: a confident speaker segment with one
   moving face on screen, which the rhythm route also names and whose lips fit the sound's content at least
   `speaker.content_lone`) are pairs (audio features, mouth shapes) of the film's own speakers, language and
   microphones.  With at least `speaker.film_min_s` of them, the map is refitted on them shrunk towards the prior
   (`ContentMap.calibrated`, ridge strength `speaker.film_strength`), and every shot's verdict is run again from
   its kept inputs (`tasks.perception.verdict_record.VerdictRecord`; no frame decoded, MediaPipe not re-run).
2. **Voice binding.** A character (`tasks.decision.characters`: face identity across shots) with at least
   `speaker.bind_min_lines` confident lines whose GE2E voices agree (every two >= `voice_min_cos`) has
   that voice bound to it.  An uncertain line whose voice is that character's (cosine >= `bind_min_cos`,
   `bind_margin` ahead of every other bound voice), with the character's face moving on screen, is that
   character's line, confidently; so is a line named "none" when that face is the only one on screen and its
   lips fit the content (`apply_bindings`).  Confident segments are never changed by a voice.

The result is each changed shot's segments (`FilmVerdict.segments`), which the planning puts into the shot's
`cast.shot.speakers` (config, hence part of the shot's result key) and `decide_shot` reads instead of the
analysis's own.  Pure logic apart from `film_speakers` (the step: it reads the cached analyses, decodes each
shot's source sound, runs the voice encoder and, for binding, the face embeddings).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.config.pipeline import PipelineConfig
from tasks.config.speaker import SpeakerConfig
from tasks.perception.content import ContentMap, audio_features, load_prior
from tasks.perception.face_analysis import ShotFaces
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.vad import RATE
from tasks.perception.verdict import content_settings, speaker_verdict
from tasks.perception.verdict_record import VerdictRecord

log = logging.getLogger(__name__)

Voices = Callable[
    [Sequence[tuple[int, int]]], np.ndarray
]  # spans of the shot -> (n, D) unit voice embeddings


@dataclass(frozen=True)
class Line:
    """A confident single-face line: frames [start, end) of ``shot`` said by face track ``track``."""

    shot: int
    start: int
    end: int
    track: int


@dataclass
class FilmShot:
    """One analysed shot as the film step reads it."""

    index: int
    faces: ShotFaces
    record: VerdictRecord
    audio: np.ndarray | None  # the source's mono sound at RATE from the shot's first frame; None: no audio
    characters: dict[int, str] = field(default_factory=dict)  # track -> character id
    voices: Voices | None = None


def _moving(faces: ShotFaces, f0: int, f1: int) -> list[int]:
    """Tracks of moving faces (not still pictures) on screen during [f0, f1)."""
    return [t.id for t in faces.tracks if not t.still and t.start_frame < f1 and t.end_frame > f0]


def _rhythm_overlap(record: VerdictRecord, seg: SpeakerSegment, same: bool) -> int:
    """Frames of ``seg`` the agreement (rhythm) route gives to its speaker (``same``) or to another face."""
    return sum(
        max(0, min(a.end_frame, seg.end_frame) - max(a.start_frame, seg.start_frame))
        for a in record.agreed
        if a.status == "speaker" and (a.speaker == seg.speaker) == same
    )


def confident_lines(
    shot: FilmShot, cmap: ContentMap, sp: SpeakerConfig, *, single: bool = True
) -> list[Line]:
    """The shot's confident lines judged with ``cmap``: confident speaker segments whose lips fit the sound's
    content.  ``single`` (the calibration's): one moving face on screen, named by the rhythm route over most of
    the segment, fitting at least `content_lone`.  Otherwise (the voice binding's) also a segment beside other
    faces whose speaker content picks out (at least `content_on`, `content_margin` ahead of every other face)
    and the rhythm route names no other face."""
    if shot.audio is None or shot.record.shapes is None:
        return []
    inp = shot.record.inputs(shot.audio, cmap, None)
    assert inp.content is not None
    cs = content_settings(sp)
    least = round(cs.min_s * inp.fps)
    out = []
    for seg in shot.faces.segments:
        if seg.status != "speaker" or seg.speaker is None:
            continue
        n = seg.end_frame - seg.start_frame
        alone = _moving(shot.faces, seg.start_frame, seg.end_frame) == [seg.speaker]
        if single and (not alone or _rhythm_overlap(shot.record, seg, True) < 0.5 * n):
            continue
        if _rhythm_overlap(shot.record, seg, False) > 0:
            continue
        fits = inp.content.scores(seg.start_frame, seg.end_frame, least)
        fit = fits[seg.speaker]
        others = [float(v) for k, v in enumerate(fits) if k != seg.speaker and np.isfinite(v)]
        if not np.isfinite(fit):
            continue
        sure = fit >= cs.lone if alone or not others else fit >= cs.on and fit - max(others) >= cs.margin
        if sure:
            out.append(Line(shot.index, seg.start_frame, seg.end_frame, seg.speaker))
    return out


def single_face_lines(shot: FilmShot, cmap: ContentMap, sp: SpeakerConfig) -> list[Line]:
    """The shot's confident single-face lines (module docstring, 1.) judged with ``cmap``."""
    return confident_lines(shot, cmap, sp, single=True)


def calibration_pairs(shot: FilmShot, lines: Sequence[Line]) -> tuple[np.ndarray, np.ndarray]:
    """(x (N, D) audio features, y (N, F) the speaking face's shapes) over the speech frames of ``lines``."""
    rec = shot.record
    if shot.audio is None or rec.shapes is None or not lines:
        return np.zeros((0, 0)), np.zeros((0, 0))
    feats = audio_features(np.asarray(shot.audio, np.float32), RATE, rec.n_frames, rec.fps)
    speech = rec.speech_prob >= 0.5
    xs, ys = [], []
    for ln in lines:
        sel = np.zeros(rec.n_frames, bool)
        sel[ln.start : ln.end] = True
        sel &= speech & np.isfinite(rec.shapes[ln.track]).all(axis=1)
        xs.append(feats[sel])
        ys.append(rec.shapes[ln.track][sel])
    return np.concatenate(xs), np.concatenate(ys)


def calibrate(
    prior: ContentMap, shots: Sequence[FilmShot], lines: Sequence[Line], sp: SpeakerConfig
) -> tuple[ContentMap | None, int]:
    """(the film's map, or None with fewer than `film_min_s` of confident speech; the frames it was fitted on)."""
    by_shot = {s.index: s for s in shots}
    pairs = [
        calibration_pairs(by_shot[i], [ln for ln in lines if ln.shot == i])
        for i in sorted({ln.shot for ln in lines})
    ]
    pairs = [p for p in pairs if len(p[0])]
    n = sum(len(x) for x, _ in pairs)
    fps = shots[0].record.fps if shots else 25.0
    if not pairs or n < sp.film_min_s * fps:
        return None, n
    x = np.concatenate([p[0] for p in pairs])
    y = np.concatenate([p[1] for p in pairs])
    return prior.calibrated(x, y, sp.film_strength), n


def rejudge(shot: FilmShot, cmap: ContentMap, sp: SpeakerConfig) -> list[SpeakerSegment]:
    """The shot's verdict run again from its kept inputs, its content judged with ``cmap``."""
    return speaker_verdict(shot.record.inputs(shot.audio, cmap, shot.voices), sp)


def bind_voices(
    lines: Sequence[Line],
    voice: Mapping[Line, np.ndarray],
    character: Mapping[tuple[int, int], str],
    sp: SpeakerConfig,
) -> dict[str, np.ndarray]:
    """{character: unit voice (the mean)} of the characters with `bind_min_lines` confident lines whose voices
    agree (every two at least `speaker.voice_min_cos`, the bar of `tasks.perception.voices`)."""
    groups: dict[str, list[np.ndarray]] = {}
    for ln in lines:
        ch = character.get((ln.shot, ln.track))
        if ch is not None and ln in voice:
            groups.setdefault(ch, []).append(np.asarray(voice[ln], np.float64))
    out = {}
    for ch, vs in groups.items():
        if len(vs) < sp.bind_min_lines:
            continue
        mean = np.mean(vs, axis=0)
        mean /= max(float(np.linalg.norm(mean)), 1e-9)
        pairs = [float(a @ b) for i, a in enumerate(vs) for b in vs[i + 1 :]]
        if (
            not pairs or min(pairs) >= sp.voice_min_cos
        ):  # one voice (the voice rule's bar), not two people under one face id
            out[ch] = mean
    return out


def bound_speaker(
    v: np.ndarray, on_screen: Mapping[int, str], bound: Mapping[str, np.ndarray], sp: SpeakerConfig
) -> int | None:
    """The on-screen track (``on_screen``: moving track -> character) whose bound voice ``v`` is, or None
    (no bound voice close enough, another bound voice too close, or that character not on screen)."""
    if not bound:
        return None
    cos = sorted(((float(v @ b), ch) for ch, b in bound.items()), reverse=True)
    best, who = cos[0]
    second = cos[1][0] if len(cos) > 1 else -1.0
    if best < sp.bind_min_cos or best - second < sp.bind_margin:
        return None
    tracks = [k for k, ch in on_screen.items() if ch == who]
    return tracks[0] if len(tracks) == 1 else None


GAP_S = 0.5  # uncertain segments this close together are one line for the voice (a pause inside a line)


def runs_of(segments: Sequence[SpeakerSegment], status: str, gap: int) -> list[list[int]]:
    """Indices of ``segments`` of ``status``, grouped into runs whose segments lie at most ``gap`` frames apart."""
    runs: list[list[int]] = []
    for i, s in enumerate(segments):
        if s.status != status:
            continue
        if runs and s.start_frame - segments[runs[-1][-1]].end_frame <= gap:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _candidates(
    shot: FilmShot, segments: Sequence[SpeakerSegment], bound: Mapping[str, Any], least: int
) -> list[tuple[tuple[int, int], list[int]]]:
    """(span, segment indices) of the lines a bound voice may settle: uncertain runs with a bound character
    on screen, and "none" runs with exactly one moving face on screen, of a bound character."""
    gap = round(GAP_S * shot.record.fps)
    out = []
    for status in ("uncertain", "none"):
        for run in runs_of(segments, status, gap):
            span = (segments[run[0]].start_frame, segments[run[-1]].end_frame)
            moving = _moving(shot.faces, *span)
            if span[1] - span[0] < least or not any(shot.characters.get(k) in bound for k in moving):
                continue
            if status == "none" and len(moving) != 1:
                continue
            out.append((span, run))
    return out


def apply_bindings(
    shot: FilmShot,
    segments: Sequence[SpeakerSegment],
    bound: Mapping[str, np.ndarray],
    sp: SpeakerConfig,
    cmap: ContentMap | None = None,
) -> list[SpeakerSegment]:
    """``segments`` with each uncertain line (a run of uncertain segments at most `GAP_S` apart, at least
    `speaker.voice_min_s` long) in the bound voice of a character on screen given to that character; and each
    such "none" line too when that character's face is the only one on screen and its lips fit the sound's
    content (at least `speaker.content_lone` with ``cmap``): the voice and the lips both say it is theirs (a
    voice-over of a character seen listening keeps "none": its lips do not say the words)."""
    fps = shot.record.fps
    out = list(segments)
    todo = _candidates(shot, out, bound, round(sp.voice_min_s * fps))
    if not todo or shot.voices is None:
        return out
    content = None
    if cmap is not None and any(out[run[0]].status == "none" for _, run in todo):
        content = shot.record.inputs(shot.audio, cmap, None).content
    voices = shot.voices([span for span, _ in todo])  # (len(todo), D)
    for (span, run), v in zip(todo, voices, strict=True):
        on = {k: shot.characters[k] for k in _moving(shot.faces, *span) if k in shot.characters}
        who = bound_speaker(np.asarray(v, np.float64), on, bound, sp)
        if who is None:
            continue
        if out[run[0]].status == "none":
            if content is None:
                continue
            fit = content.scores(span[0], span[1], round(sp.content_min_s * fps))[who]
            if not (np.isfinite(fit) and fit >= sp.content_lone):
                continue
        for i in run:
            out[i] = dataclasses.replace(out[i], status="speaker", speaker=who, runner_up=None,
                                         score=max(out[i].score, 0.6))  # fmt: skip
    return out


@dataclass(frozen=True)
class FilmVerdict:
    """The film step's result: the changed shots' segments and what it did (logged, in the estimate)."""

    segments: dict[int, list[dict[str, Any]]]  # shot index -> its segments (only shots that changed)
    calibrated_s: float  # confident single-face speech the map was calibrated on (0: the prior kept)
    lines: int  # confident single-face lines found (the calibration's)
    voice_lines: int  # confident lines long enough for a voice (the binding's)
    bound: tuple[str, ...]  # characters whose voice was bound
    bound_lines: int  # uncertain segments given to a bound character

    def to_dict(self) -> dict[str, Any]:
        return {"segments": {str(k): v for k, v in self.segments.items()}, "calibrated_s": self.calibrated_s,
                "lines": self.lines, "voice_lines": self.voice_lines, "bound": list(self.bound), "bound_lines": self.bound_lines}  # fmt: skip


def judge_film(
    shots: Sequence[FilmShot],
    sp: SpeakerConfig,
    prior: ContentMap,
    characters_of: Callable[[Sequence[int]], Mapping[tuple[int, int], str]] | None = None,
) -> FilmVerdict:
    """The film-level verdict (module docstring) over its analysed ``shots``; ``characters_of(indices)``:
    {(shot, track): character id} over those shots at least, asked for only when a binding could change
    something and only for the shots with confident voice lines or lines to settle (face embeddings cost)."""
    singles = [ln for s in shots for ln in single_face_lines(s, prior, sp)]
    cmap, n = calibrate(prior, shots, singles, sp)
    new: dict[int, list[SpeakerSegment]] = {}
    for s in shots:
        new[s.index] = rejudge(s, cmap, sp) if cmap is not None else list(s.faces.segments)
    fps = shots[0].record.fps if shots else 25.0
    # the voice binding's lines: confident lines beside other faces too, judged with the film's own map
    judged = cmap if cmap is not None else prior
    lines = [
        ln
        for s in shots
        for ln in confident_lines(
            dataclasses.replace(s, faces=dataclasses.replace(s.faces, segments=tuple(new[s.index]))),
            judged,
            sp,
            single=False,
        )
    ]
    least = round(sp.voice_min_s * fps)
    long_lines = [ln for ln in lines if ln.end - ln.start >= least]
    gap = round(GAP_S * fps)
    open_shots = {  # shots with a line a bound voice could settle (a face on screen)
        i for i, v in new.items()
        for status in ("uncertain", "none") for r in runs_of(v, status, gap)
        if v[r[-1]].end_frame - v[r[0]].start_frame >= least
        and _moving(next(s for s in shots if s.index == i).faces, v[r[0]].start_frame, v[r[-1]].end_frame)
    }  # fmt: skip
    bound: dict[str, np.ndarray] = {}
    bound_lines = 0
    if characters_of is not None and open_shots and len(long_lines) >= sp.bind_min_lines:
        chars = characters_of(sorted(open_shots | {ln.shot for ln in long_lines}))
        by_shot = {s.index: s for s in shots}
        voice: dict[Line, np.ndarray] = {}
        for i in sorted({ln.shot for ln in long_lines}):
            mine = [ln for ln in long_lines if ln.shot == i]
            if by_shot[i].voices is not None:
                voice.update(zip(mine, by_shot[i].voices([(ln.start, ln.end) for ln in mine]), strict=True))
        bound = bind_voices(long_lines, voice, chars, sp)
        for s in shots:
            s.characters = {k: ch for (i, k), ch in chars.items() if i == s.index}
            before = new[s.index]
            new[s.index] = apply_bindings(s, before, bound, sp, judged)
            bound_lines += sum(a != b for a, b in zip(before, new[s.index], strict=True))
    changed = {
        s.index: [seg.to_dict() for seg in new[s.index]]
        for s in shots
        if tuple(new[s.index]) != tuple(s.faces.segments)
    }
    return FilmVerdict(
        changed, round(n / fps, 2) if cmap is not None else 0.0, len(singles), len(long_lines),
        tuple(sorted(bound)), bound_lines,
    )  # fmt: skip


def with_film_speakers(
    overrides: Mapping[str, Any] | None, segments: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """A shot's config overrides with the film's verdict in ``cast.shot.speakers`` (its other cast.shot keys kept)."""
    out = dict(overrides or {})
    if segments is None:
        return out
    cast = dict(out.get("cast") or {})
    cast["shot"] = {**dict(cast.get("shot") or {}), "speakers": segments}
    out["cast"] = cast
    return out


# ------------------------------------------------------------------------------ the step (I/O)


def _voices(samples: np.ndarray, fps: float) -> Voices:
    cache: dict[tuple[int, int], np.ndarray] = {}

    def embed(spans):
        from model.speaker.voice_id import embed_many, load_voice_encoder  # torch: only when voices are asked

        missing = [s for s in spans if s not in cache]
        if missing:
            got = embed_many(
                load_voice_encoder(),
                [samples[round(a / fps * RATE) : round(b / fps * RATE)] for a, b in missing],
            )
            cache.update(zip(missing, got, strict=True))
        return np.stack([cache[s] for s in spans])

    return embed


def film_speakers(
    info: Any,
    shots: Sequence[tuple[int, int, int, tuple[int, int]]],
    dialogue: Callable[[int, int], np.ndarray],
    sample_rate: int,
    cfg_of: Callable[[int], PipelineConfig],
    work_dir: str | Path,
    characters: Mapping[tuple[int, int], str] | None = None,
) -> FilmVerdict:
    """`judge_film` over a film: shots ``[(index, start, end, (first, end sample))]``, ``dialogue(a, b)`` the
    dub track's samples (whether a shot needs its faces), ``cfg_of(index)`` a shot's effective config, the
    face analyses read from / written to ``work_dir``'s faces/ (`tasks.decision.shot_decision`); ``characters``:
    the planning's cast {(shot, track): character} when it linked them, else linked here when needed."""
    from tasks.decision.cast import plan_cast
    from tasks.decision.overrides import ShotOverrides, dub_action
    from tasks.decision.shot_decision import faces_path, needed_faces
    from tasks.perception.face_analysis import source_samples

    spans = {i: (s, e, ab) for i, s, e, ab in shots}
    cfg = cfg_of(-1)
    film: list[FilmShot] = []
    caches: dict[int, tuple[ShotFaces | None, Path | None]] = {}
    for index, (start, end, (a, b)) in spans.items():
        cfg_i = cfg_of(index)
        cache = faces_path(work_dir, index, start, end, cfg_i)
        own = ShotOverrides(index, action=dub_action(index, cfg_i.gate))
        _, faces = needed_faces(own, start, end, info, dialogue(a, b), sample_rate, cfg_i, cache)
        caches[index] = (faces, cache)
        if faces is None or faces.verdict is None or not faces.source_audio or cfg_i.speaker.film == "off":
            continue
        try:
            record = VerdictRecord.from_dict(faces.verdict)
        except (
            KeyError,
            TypeError,
            ValueError,
        ) as exc:  # an older or damaged record: this shot stays as analysed
            log.warning("shot %04d: verdict record unreadable (%s): not judged again", index, exc)
            continue
        samples = source_samples(info, start, end)
        fps = float(info.fps)
        film.append(
            FilmShot(index, faces, record, samples, voices=None if samples is None else _voices(samples, fps))
        )

    def characters_of(wanted: Sequence[int]) -> Mapping[tuple[int, int], str]:
        if characters:
            return characters
        picked = [(i, s, e) for i, (s, e, _) in spans.items() if i in wanted and caches[i][0] is not None]
        cast = plan_cast(info, picked, lambda i: caches[i], cfg)
        return {
            (int(i), int(k)): ch
            for i, shot in cast.shots.items()
            for k, ch in (shot.get("tracks") or {}).items()
        }

    verdict = judge_film(film, cfg.speaker, load_prior(), characters_of)
    log.info(
        "film verdict: %d confident single-face line(s), map calibrated on %.1f s; %d confident voice line(s), "
        "voices bound: %s (%d uncertain line(s) given); %d shot(s) changed", verdict.lines, verdict.calibrated_s,
        verdict.voice_lines, list(verdict.bound) or "none", verdict.bound_lines, len(verdict.segments),
    )  # fmt: skip
    return verdict


__all__ = [
    "FilmShot",
    "FilmVerdict",
    "Line",
    "apply_bindings",
    "bind_voices",
    "bound_speaker",
    "calibrate",
    "calibration_pairs",
    "cast_characters",
    "film_speakers",
    "judge_film",
    "record_spans",
    "rejudge",
    "single_face_lines",
    "runs_of",
    "with_film_speakers",
]


def record_spans(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, int, tuple[int, int]]]:
    """[(index, start frame, end frame, (first, end sample))] of the planning's per-shot records."""
    return [
        (r["index"], r["plan"]["start_frame"], r["plan"]["end_frame"], tuple(r["audio_range"]))
        for r in records
    ]


def cast_characters(records: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], str] | None:
    """{(shot, track): character} the planning's cast step linked (`cast.shot.tracks`), None when it did not run."""
    out: dict[tuple[int, int], str] = {}
    linked = False
    for r in records:
        shot = ((r.get("overrides") or {}).get("cast") or {}).get("shot")
        if shot is not None and "tracks" in shot:
            linked = True
            out.update({(int(r["index"]), int(k)): str(v) for k, v in shot["tracks"].items()})
    return out if linked else None
