"""Who speaks and what is dubbed: the dubbed region, the gate, the speaker analysis, the cast and the review
(`configs/default.yaml` holds their values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


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
    content_voice_split: (
        float  # two faces: content's speaker change needs voices either side below this cosine
    )
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
class ReviewConfig:
    """The film run's review step (`flows.review`): one pause for the uncertain turns, a deadline."""

    enabled: bool  # a deployment run asks once in the Prefect UI (local runs never wait)
    timeout_s: float  # then the run resumes itself with the policy (never Failed, never stuck)
