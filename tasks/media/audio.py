"""The dubbed dialogue track: decode, check its length against the picture, slice it per shot.

Any container/codec ffmpeg reads (wav, flac, mp3, m4a, ...) at any rate/channel count is decoded
to float32 PCM at the configured rate; the dialogue track the model hears as the official pipeline's
`librosa.load(path, sr=16000)` does (channel mean, soxr high quality: `audio.resampler`). Its length must match the picture (frame_count / fps)
within one frame's duration unless the policy says otherwise: `error` (default), `pad` (append
silence to a short track), `trim` (cut a long one), `fit` (either), each logged as a warning.

Per-shot slices use sample positions derived from frame boundaries with the exact rational frame
rate, `sample(f) = round(f * sr / fps)` (halves round up), the last boundary being the track's
own end, so consecutive slices tile the track exactly.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np
import soundfile as sf

from tasks.config import AudioConfig
from tasks.errors import AudioLengthError, DecodeError, MediaError, NoAudioStream
from tasks.files import atomic_path, atomic_temp
from tasks.media import ffmpeg
from tasks.media.probe import read_header

log = logging.getLogger(__name__)

Action = Literal["ok", "pad", "trim"]


def sample_at_frame(frame: int, fps: Fraction, sample_rate: int) -> int:
    """Sample index at the start of `frame`: round(frame * sr / fps), halves up, exact integers."""
    num, den = fps.numerator, fps.denominator
    return (2 * frame * sample_rate * den + num) // (2 * num)


def slice_bounds(
    frame_edges: list[int], fps: Fraction, sample_rate: int, total_samples: int
) -> list[tuple[int, int]]:
    """Sample ranges for consecutive frame ranges `[e0, e1), [e1, e2), ...` tiling the whole track.

    `frame_edges` starts at 0 and ends at the film's frame count; the first bound is 0 and the
    last is `total_samples` (a track within a frame of the picture absorbs the difference in the
    last slice), inner bounds are `sample_at_frame` clamped to the track.
    """
    if not frame_edges or frame_edges[0] != 0:
        raise ValueError("frame_edges must start at 0")
    inner = [min(max(sample_at_frame(f, fps, sample_rate), 0), total_samples) for f in frame_edges[1:-1]]
    edges = [0, *inner, total_samples]
    return list(zip(edges[:-1], edges[1:], strict=True))


@dataclass(frozen=True)
class LengthDecision:
    """What to do with a track whose length was checked against the picture."""

    action: Action
    source_samples: int
    target_samples: int  # samples the conformed track has
    picture_samples: int  # round(frame_count * sr / fps)
    diff_s: float  # source - picture, seconds


def check_length(
    n_samples: int, sample_rate: int, frame_count: int, fps: Fraction, policy: str, *, path: str | Path
) -> LengthDecision:
    """Apply the length policy (pure). Raises AudioLengthError naming `path` when not allowed."""
    picture = sample_at_frame(frame_count, fps, sample_rate)
    diff = n_samples - picture
    diff_s = diff / sample_rate
    one_frame = sample_rate / fps
    if abs(diff) <= one_frame:
        return LengthDecision("ok", n_samples, n_samples, picture, diff_s)
    if diff < 0 and policy in ("pad", "fit"):
        return LengthDecision("pad", n_samples, picture, picture, diff_s)
    if diff > 0 and policy in ("trim", "fit"):
        return LengthDecision("trim", n_samples, picture, picture, diff_s)
    pic_s = float(frame_count / fps)
    what = "shorter" if diff < 0 else "longer"
    hint = "pad" if diff < 0 else "trim"
    raise AudioLengthError(
        path,
        f"audio is {n_samples / sample_rate:.3f} s, {abs(diff_s):.3f} s {what} than the picture "
        f"({pic_s:.3f} s = {frame_count} frames at {fps} fps; tolerance one frame = {float(1 / fps):.3f} s); "
        f"set audio.length_policy={hint} or fit to conform it",
    )


def conform(samples: np.ndarray, decision: LengthDecision) -> np.ndarray:
    """Pad with silence / trim (n, ch) samples to the decision's target length."""
    n = decision.target_samples
    if samples.shape[0] >= n:
        return samples[:n]
    pad = np.zeros((n - samples.shape[0], samples.shape[1]), samples.dtype)
    return np.concatenate([samples, pad])


def _soxr_hq(samples: np.ndarray, rate: int, sample_rate: int, channels: int) -> np.ndarray:
    """`librosa.load(path, sr=sample_rate)` from decoded (n, ch) float32 at its own `rate`: the channel
    mean when `channels` is 1 (`librosa.to_mono`), then `librosa.resample(res_type="soxr_hq")`."""
    import librosa  # the model's audio path only

    y = samples.mean(axis=1, dtype=np.float32) if channels == 1 else samples.T  # (n,) or (ch, n)
    y = librosa.resample(y, orig_sr=rate, target_sr=sample_rate, res_type="soxr_hq")
    return np.ascontiguousarray(y.reshape(-1, 1) if channels == 1 else y.T, dtype=np.float32)


def decode_audio(
    path: str | Path, *, sample_rate: int, channels: int, resampler: str = "ffmpeg"
) -> np.ndarray:
    """Decode the first audio stream of `path` to float32 PCM (n, channels) at `sample_rate`.

    `resampler` "ffmpeg": ffmpeg's own down-mix and resampler; "soxr_hq": the samples at the file's own
    rate and channels (ffmpeg decodes PCM to the values soundfile reads), then `librosa.load`'s mono mix
    and soxr high-quality resampling (`_soxr_hq`): the official InfiniteTalk audio path.
    """
    p = Path(path)
    head = read_header(p)
    if not head.audio:
        raise NoAudioStream(p, f"no audio stream ({head.container})")
    stream = head.audio[0]
    native = resampler == "soxr_hq"
    rate, ch = (stream.sample_rate, stream.channels) if native else (sample_rate, channels)
    args = ["-v", "error", "-i", str(p), "-map", f"0:{stream.index}", "-vn", "-sn", "-dn"]
    args += ["-ac", str(ch), "-ar", str(rate), "-f", "f32le", "-"]
    block = rate * ch * 4
    try:
        data = b"".join(ffmpeg.read_blocks(args, block, path=p, what="decoding audio", partial_tail=True))
    except DecodeError as ex:
        raise DecodeError(p, f"cannot decode audio: {ex.problem}") from ex
    samples = np.frombuffer(data, np.float32).reshape(-1, ch)
    if samples.shape[0] == 0:
        raise MediaError(p, "audio stream contains no samples")
    if native and (rate != sample_rate or ch != channels):
        samples = _soxr_hq(samples, rate, sample_rate, channels)
    bad = ~np.isfinite(samples).all(axis=1)
    if bad.any():  # NaN/inf would make every shot "too quiet" and the final encode fail
        first = int(np.argmax(bad))
        raise MediaError(
            p,
            f"{int(bad.sum())} audio sample(s) are NaN or infinite, the first at {first / sample_rate:.3f} s",
        )
    return samples


@dataclass(frozen=True)
class DialogueTrack:
    """The dialogue track decoded, length-checked and stored as a float32 WAV (serialisable)."""

    path: str  # the decoded float32 wav in the workspace
    source: str  # the user's file
    sample_rate: int
    channels: int
    n_samples: int
    action: Action
    source_duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DialogueTrack:
        return cls(**d)


def prepare_dialogue(
    audio_path: str | Path, *, frame_count: int, fps: Fraction, cfg: AudioConfig, out_wav: str | Path
) -> DialogueTrack:
    """Decode the dub, apply the length policy, write it atomically as float32 WAV at `out_wav`."""
    samples = decode_audio(
        audio_path, sample_rate=cfg.sample_rate, channels=cfg.channels, resampler=cfg.resampler
    )
    decision = check_length(
        samples.shape[0], cfg.sample_rate, frame_count, fps, cfg.length_policy, path=audio_path
    )
    if decision.action != "ok":
        log.warning(
            "%s: audio differs from the picture by %+.3f s; %s to %.3f s (audio.length_policy=%s)",
            audio_path,
            decision.diff_s,
            "padding with silence" if decision.action == "pad" else "trimming",
            decision.target_samples / cfg.sample_rate,
            cfg.length_policy,
        )
    samples = conform(samples, decision)
    out = Path(out_wav)
    tmp = atomic_temp(out)
    try:
        fmt = "WAV" if samples.nbytes < 3_500_000_000 else "RF64"
        sf.write(str(tmp), samples, cfg.sample_rate, subtype="FLOAT", format=fmt)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return DialogueTrack(
        path=str(out),
        source=str(audio_path),
        sample_rate=cfg.sample_rate,
        channels=cfg.channels,
        n_samples=int(samples.shape[0]),
        action=decision.action,
        source_duration_s=decision.source_samples / cfg.sample_rate,
    )


def check_mix(mix_path: str | Path, *, frame_count: int, fps: Fraction, policy: str) -> LengthDecision:
    """Check the final mix's length (decoded at 8 kHz mono: enough to measure it exactly)."""
    rate = 8000
    samples = decode_audio(mix_path, sample_rate=rate, channels=1)
    return check_length(samples.shape[0], rate, frame_count, fps, policy, path=mix_path)


def read_samples(track: DialogueTrack, start: int, end: int) -> np.ndarray:
    """Samples [start, end) of the decoded dialogue track: float32 (n, channels)."""
    with sf.SoundFile(track.path) as f:
        f.seek(start)
        return f.read(end - start, dtype="float32", always_2d=True)


def write_post_wav(audio_path: str | Path, out_wav: str | Path, *, duration_s: float, pad: bool) -> Path:
    """The delivered audio for audio post: 48 kHz, 24-bit PCM WAV, cut (or padded with silence, when
    the length policy padded it) to the picture's duration, written atomically."""
    out = Path(out_wav)
    af = [f"apad=whole_dur={duration_s:.6f}"] if pad else []
    af.append(f"atrim=end={duration_s:.6f}")
    with atomic_path(out) as tmp:
        ffmpeg.run(
            ["-v", "error", "-y", "-i", str(audio_path), "-map", "0:a:0", "-af", ",".join(af),
             "-ar", "48000", "-c:a", "pcm_s24le", "-f", "wav", str(tmp)],
            path=audio_path, what="writing the audio-post WAV",
        )  # fmt: skip
    return out
