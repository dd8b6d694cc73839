"""Face analysis of a shot on the CPU: faces, tracks, mouth activity and speakers, as one JSON-able record.

Holds `SpeakerConfig` -> settings conversion, the source's speech timeline (Silero VAD over the film's own
first audio stream, streamed, one probability per 32 ms), and `analyse_shot`: decode the shot once at
analysis size in display orientation (rotation and SAR applied, longest side `detect_max_side`), detect
faces on every `detect_every`-th frame, link tracks, measure mouth activity on every frame from the
interpolated landmarks, and find the speaker segments (`tasks.perception.speaker`), judged again on each
face's audio-visual agreement with the film's own audio (`tasks.perception.av_sync`, its envelope decoded
here) when the speech timeline is the source's, and, with `speaker.asd` (the default), on a learned
speaking score per face and frame (`tasks.perception.asd`, Light-ASD on grey face crops cut here while the
frames stream + the source audio's MFCCs).  The result (`ShotFaces`) keeps
boxes in display pixels, so the estimate, the shot table, the QC sheet and the region planner read them
without decoding again.  Runs in planning; the GPU path only reads the record.
Must not decide whether a shot is dubbed (that is `tasks.decision.gate`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import cv2
import numpy as np

from tasks.config.speaker import SpeakerConfig
from tasks.media import ffmpeg
from tasks.media.frames import iter_frames
from tasks.media.probe import VideoInfo
from tasks.perception.asd import FaceCrops, asd_scores
from tasks.perception.av_sync import SyncSettings, agreement, mouth_motion, speech_envelope
from tasks.perception.content import ContentMap, audio_features, content_rows, load_prior, track_shapes
from tasks.perception.content_fusion import ContentEvidence
from tasks.perception.faces import FaceDetector
from tasks.perception.lips import MouthMeter, mouth_activity
from tasks.perception.mouth_shapes import MouthShapes
from tasks.perception.speaker import (
    AvSettings,
    SpeakerSegment,
    SpeakerSettings,
    find_speakers,
    refine_with_agreement,
    still_tracks,
)
from tasks.perception.tracks import Tracker, appearance
from tasks.perception.vad import RATE, StreamingVad, at_frames
from tasks.perception.verdict import VerdictInputs, asd_settings, speaker_settings, speaker_verdict
from tasks.perception.verdict_record import VerdictRecord
from tasks.perception.voices import VoicesOf

log = logging.getLogger(__name__)

Box = tuple[int, int, int, int]


def sync_settings(cfg: SpeakerConfig) -> SyncSettings:
    return SyncSettings(cfg.av_lag_s, cfg.av_window_s, cfg.av_margin_s, cfg.av_min_window_s)


def av_settings(cfg: SpeakerConfig) -> AvSettings:
    return AvSettings(cfg.av_on, cfg.av_off, cfg.av_scale, cfg.av_margin)


def _source_audio_args(info: VideoInfo, start: int, end: int) -> list[str]:
    """ffmpeg arguments decoding the film's first audio stream over frames [start, end) to mono f32 at RATE."""
    t0 = info.seek_offset_s + float(start / info.fps)
    dur = float((end - start) / info.fps)
    args = ["-v", "error", "-ss", f"{max(0.0, t0):.6f}", "-i", info.path, "-map", f"0:{info.audio[0].index}"]
    return args + ["-t", f"{dur:.6f}", "-vn", "-sn", "-dn", "-ac", "1", "-ar", str(RATE), "-f", "f32le", "-"]


def source_samples(info: VideoInfo, start: int, end: int) -> np.ndarray | None:
    """The film's own first audio stream over frames [start, end), mono float32 at RATE; None when the film
    has no audio stream."""
    if not info.audio:
        return None
    args = _source_audio_args(info, start, end)
    blocks = ffmpeg.read_blocks(args, RATE * 4 * 10, path=info.path, what="decoding audio", partial_tail=True)
    return np.concatenate([np.frombuffer(b, np.float32) for b in blocks] or [np.zeros(0, np.float32)])


def source_envelope(info: VideoInfo, start: int, end: int) -> np.ndarray | None:
    """(2, end - start) speech envelope of the film's own audio over frames [start, end)
    (`tasks.perception.av_sync.speech_envelope`); None when the film has no audio stream."""
    samples = source_samples(info, start, end)
    return None if samples is None else speech_envelope(samples, RATE, end - start, float(info.fps))


def source_speech(info: VideoInfo, start: int, end: int) -> np.ndarray | None:
    """Speech probability at each of the film's frames [start, end), from its own first audio stream (Silero
    VAD over that stretch only); None when the film has no audio stream."""
    if not info.audio:
        return None
    args = _source_audio_args(info, start, end)
    vad = StreamingVad()
    blocks = ffmpeg.read_blocks(args, RATE * 4 * 10, path=info.path, what="decoding audio", partial_tail=True)
    probs = np.concatenate([*(vad.feed(np.frombuffer(buf, np.float32)) for buf in blocks), vad.finish()])
    return at_frames(probs, end - start, float(info.fps))


@dataclass(frozen=True)
class TrackInfo:
    """One face track of a shot, in display pixels and shot-relative frames."""

    id: int
    start_frame: int
    end_frame: int  # exclusive
    side_px: float  # median face size (display pixels)
    still: bool  # never changes: a poster, a photo, a paused screen
    frames: tuple[int, ...]  # frames with a detection
    boxes: tuple[Box, ...]  # face box at each of those frames

    def samples(self, start: int = 0, end: int | None = None) -> list[tuple[int, Box]]:
        """[(frame, face box)] of the detections in [start, end)."""
        end = self.end_frame if end is None else end
        return [(t, b) for t, b in zip(self.frames, self.boxes, strict=True) if start <= t < end]


@dataclass(frozen=True)
class ShotFaces:
    """Everything the face analysis found in one shot (JSON round trip with to_dict / from_dict)."""

    num_frames: int
    fps: float
    display_hw: tuple[int, int]
    analysis_hw: tuple[int, int]
    source_audio: bool  # False: the film has no audio, the speech timeline is the dub track's
    tracks: tuple[TrackInfo, ...]
    segments: tuple[SpeakerSegment, ...]
    speech: tuple[float, ...]  # speech probability per step_s step (QC timeline)
    activity: tuple[tuple[float | None, ...], ...]  # per track, mouth activity per step (None: absent)
    step_frames: int
    cpu_s: float
    # per track, audio-visual agreement with the source's speech per step (None: absent, no speech, or no
    # source audio); empty when the speakers were found from mouth activity alone (no source audio)
    agreement: tuple[tuple[float | None, ...], ...] = ()
    # per track, the learned speaking score (Light-ASD, > 0: speaking) per step (None: absent); empty when the
    # speakers were not found by it (speaker.asd off, or no source audio)
    asd: tuple[tuple[float | None, ...], ...] = ()
    # per track, the content fit (mouth shapes against the source audio's content, tasks.perception.content)
    # per step (None: absent, no speech); empty when the content route did not run
    content: tuple[tuple[float | None, ...], ...] = ()
    # the verdict's inputs (`tasks.perception.verdict_record.VerdictRecord` JSON): kept in the planning's
    # analysis cache so the film can judge the shot again (`tasks.decision.film_speakers`), never in `to_dict`
    # (the decision's JSON stays small); None when no verdict stage ran
    verdict: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def track(self, track_id: int) -> TrackInfo:
        return next(t for t in self.tracks if t.id == track_id)

    def mean_agreement(self) -> dict[int, float]:
        """{track id: mean audio-visual agreement over the steps it was measured in} (the shot table's)."""
        out = {}
        for tr, row in zip(self.tracks, self.agreement, strict=False):
            vals = [v for v in row if v is not None]
            if vals:
                out[tr.id] = round(float(np.mean(vals)), 2)
        return out

    def mean_asd(self) -> dict[int, float]:
        """{track id: mean speaking score over the speech steps it was scored in} (the shot table's)."""
        out = {}
        speech = np.array(self.speech) >= 0.5
        for tr, row in zip(self.tracks, self.asd, strict=False):
            vals = [v for v, sp in zip(row, speech, strict=False) if v is not None and sp]
            if vals:
                out[tr.id] = round(float(np.mean(vals)), 2)
        return out

    def mean_content(self) -> dict[int, float]:
        """{track id: mean content fit over the steps it was measured in} (the shot table's)."""
        out = {}
        for tr, row in zip(self.tracks, self.content, strict=False):
            vals = [v for v in row if v is not None]
            if vals:
                out[tr.id] = round(float(np.mean(vals)), 2)
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("verdict")
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShotFaces:
        tracks = tuple(
            TrackInfo(
                int(t["id"]),
                int(t["start_frame"]),
                int(t["end_frame"]),
                float(t["side_px"]),
                bool(t["still"]),
                tuple(int(f) for f in t["frames"]),
                tuple(tuple(int(v) for v in b) for b in t["boxes"]),  # type: ignore[misc]
            )  # fmt: skip
            for t in d["tracks"]
        )
        return cls(
            int(d["num_frames"]), float(d["fps"]), (int(d["display_hw"][0]), int(d["display_hw"][1])),
            (int(d["analysis_hw"][0]), int(d["analysis_hw"][1])), bool(d["source_audio"]), tracks,
            tuple(SpeakerSegment.from_dict(s) for s in d["segments"]), tuple(float(v) for v in d["speech"]),
            tuple(tuple(None if v is None else float(v) for v in row) for row in d["activity"]),
            int(d["step_frames"]), float(d["cpu_s"]),
            tuple(tuple(None if v is None else float(v) for v in row) for row in d.get("agreement") or ()),
            tuple(tuple(None if v is None else float(v) for v in row) for row in d.get("asd") or ()),
            tuple(tuple(None if v is None else float(v) for v in row) for row in d.get("content") or ()),
            d.get("verdict") if isinstance(d.get("verdict"), dict) else None,
        )  # fmt: skip


def analysis_size(display_hw: tuple[int, int], max_side: int) -> tuple[int, int]:
    """(h, w) of the analysis frames: the display size scaled to at most ``max_side`` (even sides)."""
    h, w = display_hw
    s = min(1.0, max_side / max(h, w))
    return max(2, round(h * s / 2) * 2), max(2, round(w * s / 2) * 2)


def display_frames(info: VideoInfo, start: int, end: int, hw: tuple[int, int]) -> Iterator[np.ndarray]:
    """Frames [start, end) as RGB uint8 at analysis size ``hw`` (display orientation)."""
    k = (info.rotation // 90) % 4
    coded_hw = hw if k % 2 == 0 else hw[::-1]  # size before the rotation
    for frame in iter_frames(info, start, end, width=min(info.width, max(coded_hw[1], 2))):
        if frame.shape[:2] != coded_hw:  # SAR (and rounding): stretch to square pixels
            frame = cv2.resize(frame, (coded_hw[1], coded_hw[0]), interpolation=cv2.INTER_AREA)
        yield np.ascontiguousarray(np.rot90(frame, k)) if k else frame


def _to_display(box: np.ndarray, scale: tuple[float, float], display_hw: tuple[int, int]) -> Box:
    sx, sy = scale
    h, w = display_hw
    x0, y0, x1, y1 = box
    return (
        int(np.clip(round(x0 * sx), 0, w - 1)), int(np.clip(round(y0 * sy), 0, h - 1)),
        int(np.clip(round(x1 * sx), 1, w)), int(np.clip(round(y1 * sy), 1, h)),
    )  # fmt: skip


def _measure(
    meter: MouthMeter,
    tracker: Tracker,
    pending: list[tuple[int, np.ndarray]],
    crops: FaceCrops | None,
    shapes: MouthShapes | None = None,
) -> None:
    """Mouth activity (and face crops, mouth shapes) of the buffered frames, from the live tracks' landmarks
    and boxes (interpolated up to now)."""
    for t, frame in pending:
        ft = np.array([t], np.float64)
        live = {tr.id: (tr.landmarks_at(ft)[0], tr.boxes_at(ft)[0]) for tr in tracker.live if tr.start <= t}
        meter.feed(t, frame, live)
        if crops is not None:
            crops.feed(t, frame, live)
        if shapes is not None:
            shapes.feed(t, frame, live)


def _step_rows(
    rows: np.ndarray, n_frames: int, step: int, digits: int
) -> tuple[tuple[float | None, ...], ...]:
    """Each row's mean per step of ``step`` frames (None where all NaN), rounded."""
    return tuple(
        tuple(
            None if np.isnan(r[s : s + step]).all() else round(float(np.nanmean(r[s : s + step])), digits)
            for s in range(0, n_frames, step)
        )
        for r in rows
    )


def scored_tracks(
    activity: np.ndarray,
    change: np.ndarray,
    speech_prob: np.ndarray,
    settings: SpeakerSettings,
    most: int,
    agree: np.ndarray | None = None,
) -> list[int]:
    """Indices of the (at most ``most``) tracks the learned route scores (the network's cost is per face,
    so a crowd must not multiply it): not still pictures; the best mean audio-visual agreement over the
    source's speech first (``agree`` (n_tracks, n_steps), NaN where absent or no speech), then the highest
    mean mouth activity over it.  By activity alone the speaker was the one left out in five of nine
    three-face cases (the listeners' mouths moved more); by agreement in one, by a hair."""
    if activity.shape[0] == 0 or most <= 0:
        return []
    still = still_tracks(change, settings)
    speech = np.asarray(speech_prob) >= 0.5
    with np.errstate(invalid="ignore"):
        rows = activity[:, speech] if speech.any() else activity
        act = np.array([np.nanmean(r) if np.isfinite(r).any() else -np.inf for r in rows])
        agr = np.full(len(act), -np.inf)
        if agree is not None:
            agr = np.array([np.nanmean(r) if np.isfinite(r).any() else -np.inf for r in agree])
    order = [int(k) for k in np.lexsort((-act, -agr)) if not still[k] and np.isfinite(act[k])]
    return sorted(order[:most])


def _voices_of(samples: np.ndarray, fps: float) -> VoicesOf:
    """voices_of(spans): the GE2E embeddings (n, 256) of the shot's audio (mono at RATE) over spans of frames."""
    from model.speaker.voice_id import RATE as VOICE_RATE
    from model.speaker.voice_id import (  # torch: only where a face has confident lines
        embed_many,
        load_voice_encoder,
    )

    assert VOICE_RATE == RATE, "the dialogue is decoded at the voice encoder's rate"

    def embed(spans):  # the encoder loads on the first call: only a shot with confident lines needs it
        return embed_many(
            load_voice_encoder(),
            [samples[round(f0 / fps * RATE) : round(f1 / fps * RATE)] for f0, f1 in spans],
        )

    return embed


def analyse_frames(
    frames: Iterable[np.ndarray],
    n_frames: int,
    speech_prob: np.ndarray,
    fps: float,
    cfg: SpeakerConfig,
    display_hw: tuple[int, int],
    envelope: np.ndarray | None = None,
    audio: np.ndarray | None = None,
    content_map: ContentMap | None = None,
) -> ShotFaces:
    """`analyse_shot` on decoded analysis frames (RGB uint8, display orientation), streamed.

    ``envelope`` (2, n_frames): the source's speech envelope (`source_envelope`); with it the speakers are
    found by mouth activity (`find_speakers`) and judged again on audio-visual agreement
    (`refine_with_agreement`); without it by mouth activity alone.  ``audio``: the source's mono samples
    at RATE from the first frame; with it (and `speaker.asd` not off) the learned speaking scores give a
    second verdict (`find_asd_speakers`), joined with the first frame by frame (`fuse_asd`).
    With ``audio`` and `speaker.content` not off, each face's mouth shapes are measured
    (`tasks.perception.mouth_shapes`) and judged against the audio's content through ``content_map`` (the
    shipped prior when None, or a film's calibrated map).  The verdict's stages run as one sequence
    (`tasks.perception.verdict.speaker_verdict`).
    Only the frames since the last detection are held: they are measured once the next detection has
    placed every live track at both ends.
    """
    t0 = time.process_time()
    detector = FaceDetector(cfg.detect_threshold, cfg.min_face_px)
    tracker = Tracker(cfg.track_max_miss)
    meter = MouthMeter(n_frames, round(cfg.mouth_lag_s * fps))
    crops = FaceCrops(n_frames, fps) if audio is not None and cfg.asd != "off" else None
    shapes = MouthShapes(n_frames, fps) if audio is not None and cfg.content != "off" else None
    pending: list[tuple[int, np.ndarray]] = []
    hw = (1, 1)
    for t, frame in enumerate(frames):
        hw = frame.shape[:2]
        pending.append((t, frame))
        if t % cfg.detect_every == 0 or t == n_frames - 1:
            faces = detector(frame)
            tracker.update(t, faces, [appearance(frame, f.box) for f in faces])
            _measure(meter, tracker, pending, crops, shapes)
            pending = []
    _measure(meter, tracker, pending, crops, shapes)
    if shapes is not None:
        shapes.close()
    tracks = tracker.finish()
    settings = speaker_settings(cfg)
    mouth, upper = meter.rows([tr.id for tr in tracks])
    activity = mouth_activity(mouth, upper)
    change = mouth + upper
    speech_prob = np.asarray(speech_prob, np.float64)[:n_frames]
    step = max(1, round(cfg.step_s * fps))
    agree_rows: tuple[tuple[float | None, ...], ...] = ()
    agree: np.ndarray | None = None
    if envelope is not None:
        env = np.asarray(envelope, np.float64)[:, :n_frames]
        motion = mouth_motion(meter.motion_rows([tr.id for tr in tracks]))
        agree = agreement(motion, env, speech_prob >= 0.5, fps, step, sync_settings(cfg))
        segments = find_speakers(activity, change, speech_prob, fps, settings)
        segments = refine_with_agreement(segments, activity, change, agree, fps, settings, av_settings(cfg))
        agree_rows = tuple(tuple(None if np.isnan(v) else round(float(v), 3) for v in row) for row in agree)
    else:
        segments = find_speakers(activity, change, speech_prob, fps, settings)
    asd_rows: tuple[tuple[float | None, ...], ...] = ()
    scores: np.ndarray | None = (
        None  # (n_tracks, n_frames) the learned route's scores and sync leads, when it ran
    )
    lead: np.ndarray | None = None
    if crops is not None and audio is not None:
        ids = scored_tracks(activity, change, speech_prob, settings, cfg.asd_max_faces, agree)
        from model.speaker.light_asd import load_light_asd  # torch: only where a face's crops are scored

        scores = np.full((len(tracks), n_frames), np.nan)
        lead = scores.copy()
        if ids:
            got = asd_scores(load_light_asd(), crops, ids, np.asarray(audio, np.float32), RATE)
            scores[ids], lead[ids] = got
        asd_rows = _step_rows(scores, n_frames, step, 2)
    evidence = None
    content_steps: tuple[tuple[float | None, ...], ...] = ()
    if shapes is not None and audio is not None:
        cmap = content_map if content_map is not None else load_prior()
        feats = audio_features(np.asarray(audio, np.float32), RATE, n_frames, fps)
        observed = track_shapes(shapes.rows([tr.id for tr in tracks]))
        evidence = ContentEvidence(
            cmap.predict(feats),
            observed,
            speech_prob >= 0.5,
            fps,
            still_tracks(change, settings)
            | np.array([tr.side() < cfg.content_min_px for tr in tracks], bool),
        )
        content_steps = _step_rows(
            content_rows(evidence.pred, observed, evidence.speech, fps), n_frames, step, 3
        )
    voices = None
    if audio is not None and cfg.voice_min_cos > 0:
        voices = _voices_of(np.asarray(audio, np.float32), fps)
    inputs = VerdictInputs(
        n_frames, fps, list(segments), change, speech_prob, scores, lead, evidence, voices
    )  # fmt: skip
    segments = speaker_verdict(inputs, cfg)
    record = VerdictRecord.of(inputs).to_dict()
    still = still_tracks(change, settings)
    scale = (display_hw[1] / hw[1], display_hw[0] / hw[0])
    infos = tuple(
        TrackInfo(
            k,
            tr.start,
            tr.end,
            round(tr.side() * (scale[0] + scale[1]) / 2, 1),
            bool(still[k]),
            tuple(tr.frames),
            tuple(_to_display(b, scale, display_hw) for b in tr.boxes),
        )  # fmt: skip
        for k, tr in enumerate(tracks)
    )
    steps = range(0, n_frames, step)
    speech_steps = tuple(round(float(np.mean(speech_prob[s : s + step])), 2) for s in steps)
    act_steps = tuple(
        tuple(
            None if np.isnan(r[s : s + step]).all() else round(float(np.nanmean(r[s : s + step])), 4)
            for s in steps
        )
        for r in activity
    )
    return ShotFaces(
        n_frames, fps, display_hw, (int(hw[0]), int(hw[1])), True, infos, tuple(segments), speech_steps,
        act_steps, step, round(time.process_time() - t0, 3), agree_rows, asd_rows, content_steps, record,
    )  # fmt: skip


def analyse_shot(
    info: VideoInfo,
    start: int,
    end: int,
    speech_prob: np.ndarray,
    cfg: SpeakerConfig,
    *,
    source_audio: bool = True,
) -> ShotFaces:
    """Faces, tracks and speakers of the film's frames [start, end); ``speech_prob`` is per shot frame.

    With ``source_audio`` (the speech timeline is the film's own), the speakers are those whose lips agree
    with that audio (its envelope decoded here); otherwise mouth activity decides.
    ``cpu_s`` counts this process's CPU time, decoding included except ffmpeg's own (a child process).
    """
    w, h = info.display_size
    hw = analysis_size((h, w), cfg.detect_max_side)
    t0 = time.process_time()
    want_audio = source_audio and (cfg.av_agreement or cfg.asd != "off" or cfg.content != "off")
    samples = source_samples(info, start, end) if want_audio else None
    envelope = None
    if samples is not None and cfg.av_agreement:
        envelope = speech_envelope(samples, RATE, end - start, float(info.fps))
    audio = samples if cfg.asd != "off" or cfg.content != "off" else None
    frames = display_frames(info, start, end, hw)
    out = analyse_frames(frames, end - start, speech_prob, float(info.fps), cfg, (h, w), envelope, audio)
    cpu = round(time.process_time() - t0, 3)
    log.debug(
        "frames %d-%d: %d tracks, %d segments, %.2f CPU-s",
        start,
        end,
        len(out.tracks),
        len(out.segments),
        cpu,
    )
    return dataclasses.replace(out, source_audio=source_audio, cpu_s=cpu)


__all__ = [
    "ShotFaces",
    "TrackInfo",
    "analyse_frames",
    "analyse_shot",
    "analysis_size",
    "display_frames",
    "scored_tracks",
    "asd_settings",
    "av_settings",
    "source_envelope",
    "source_samples",
    "source_speech",
    "speaker_settings",
    "sync_settings",
]
