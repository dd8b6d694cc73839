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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np
import soundfile as sf

from tasks.config.media import AudioConfig
from tasks.errors import AudioLengthError, DecodeError, MediaError, NoAudioStream
from tasks.files import atomic_path
from tasks.media import ffmpeg
from tasks.media.probe import ContainerHeader, read_header

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


def _blocks(path: Path, head: ContainerHeader, sample_rate: int, channels: int) -> Iterator[np.ndarray]:
    """The first audio stream of `path` as float32 (n, channels) blocks of one second (streamed), each
    checked for NaN/inf (they would make every shot "too quiet" and the final encode fail)."""
    if not head.audio:
        raise NoAudioStream(path, f"no audio stream ({head.container})")
    args = ["-v", "error", "-i", str(path), "-map", f"0:{head.audio[0].index}", "-vn", "-sn", "-dn"]
    args += ["-ac", str(channels), "-ar", str(sample_rate), "-f", "f32le", "-"]
    done = 0
    try:
        for raw in ffmpeg.read_blocks(
            args, sample_rate * channels * 4, path=path, what="decoding audio", partial_tail=True
        ):
            block = np.frombuffer(raw, np.float32).reshape(-1, channels)
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                first = done + int(np.argmax(bad))
                raise MediaError(
                    path,
                    f"{int(bad.sum())} audio sample(s) are NaN or infinite, the first at {first / sample_rate:.3f} s",
                )
            done += block.shape[0]
            yield block
    except DecodeError as ex:
        raise DecodeError(path, f"cannot decode audio: {ex.problem}") from ex


def _soxr_hq(samples: np.ndarray, rate: int, sample_rate: int, channels: int) -> np.ndarray:
    """`librosa.load(path, sr=sample_rate)` from decoded (n, ch) float32 at its own `rate`: the channel
    mean when `channels` is 1 (`librosa.to_mono`), then `librosa.resample(res_type="soxr_hq")`."""
    import librosa  # the model's audio path only

    y = samples.mean(axis=1, dtype=np.float32) if channels == 1 else samples.T  # (n,) or (ch, n)
    y = librosa.resample(y, orig_sr=rate, target_sr=sample_rate, res_type="soxr_hq")
    return np.ascontiguousarray(y.reshape(-1, 1) if channels == 1 else y.T, dtype=np.float32)


def _resampled_blocks(
    path: Path,
    head: ContainerHeader,
    sample_rate: int,
    channels: int,
    resampler: str,
    limit: int | None = None,
) -> Iterator[np.ndarray]:
    """The first audio stream as float32 (n, channels) blocks at `sample_rate`. `resampler` "ffmpeg":
    ffmpeg's own down-mix and resampler, streamed in one-second blocks; "soxr_hq": the samples at the
    file's own rate and channels (ffmpeg decodes PCM to the values soundfile reads), then `librosa.load`'s
    mono mix and soxr high-quality resampling (`_soxr_hq`, the official InfiniteTalk audio path), as one
    block; its decode stops past `limit` output samples (when given), so memory stays bounded."""
    if resampler != "soxr_hq":
        yield from _blocks(path, head, sample_rate, channels)
        return
    if not head.audio:
        raise NoAudioStream(path, f"no audio stream ({head.container})")
    rate, ch = head.audio[0].sample_rate, head.audio[0].channels
    native_limit = None if limit is None else -(-limit * rate // sample_rate) + rate  # ceil, plus 1 s
    got, m = [], 0
    for block in _blocks(path, head, rate, ch):
        got.append(block)
        m += block.shape[0]
        if native_limit is not None and m >= native_limit:
            break
    if not got:
        return
    samples = np.concatenate(got)
    yield _soxr_hq(samples, rate, sample_rate, channels) if (rate, ch) != (sample_rate, channels) else samples


def decode_audio(
    path: str | Path, *, sample_rate: int, channels: int, resampler: str = "ffmpeg"
) -> np.ndarray:
    """Decode the first audio stream of `path` to float32 PCM (n, channels) at `sample_rate`
    (`resampler`: see `_resampled_blocks`)."""
    p = Path(path)
    blocks = list(_resampled_blocks(p, read_header(p), sample_rate, channels, resampler))
    if not blocks:
        raise MediaError(p, "audio stream contains no samples")
    return np.concatenate(blocks)


def check_header_length(
    path: Path, head: ContainerHeader, frame_count: int, fps: Fraction, policy: str
) -> None:
    """Refuse a track whose header duration is far from the picture's, before decoding anything.

    The header's duration can be an estimate (e.g. VBR mp3), so only a difference beyond
    max(1 s, 2 %) counts here; the exact check follows on the decoded samples (`check_length`).
    """
    if head.duration_s is None:
        return
    picture = float(frame_count / fps)
    diff = head.duration_s - picture
    if abs(diff) <= max(1.0, 0.02 * picture):
        return
    if (diff < 0 and policy in ("pad", "fit")) or (diff > 0 and policy in ("trim", "fit")):
        return
    what, hint = ("shorter", "pad") if diff < 0 else ("longer", "trim")
    raise AudioLengthError(
        path,
        f"audio is {head.duration_s:.3f} s by its header, {abs(diff):.3f} s {what} than the picture "
        f"({picture:.3f} s = {frame_count} frames at {fps} fps): refused before decoding; "
        f"set audio.length_policy={hint} or fit to conform it",
    )


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
    """Decode the dub, apply the length policy, write it atomically as float32 WAV at `out_wav`.

    The header's duration is checked first (`check_header_length`), then the track is decoded in
    blocks straight into the WAV: memory stays at one block, and decoding stops as soon as the track
    is more than a frame longer than the picture (the rest could only be trimmed or refused).
    """
    p, sr, channels = Path(audio_path), cfg.sample_rate, cfg.channels
    head = read_header(p)
    if not head.audio:
        raise NoAudioStream(p, f"no audio stream ({head.container})")
    check_header_length(p, head, frame_count, fps, cfg.length_policy)
    picture = sample_at_frame(frame_count, fps, sr)
    limit = picture + int(sr / fps) + 1  # this many samples or more can never be "ok"
    out = Path(out_wav)
    tail: list[np.ndarray] = []  # samples after the picture's end (at most a frame's worth), kept aside
    n = 0
    with atomic_path(out) as tmp:
        fmt = "WAV" if limit * channels * 4 < 3_500_000_000 else "RF64"
        with sf.SoundFile(str(tmp), "w", sr, channels, subtype="FLOAT", format=fmt) as wav:
            for block in _resampled_blocks(p, head, sr, channels, cfg.resampler, limit):
                keep = block[: max(0, picture - n)]
                wav.write(keep)
                tail.append(block[keep.shape[0] : keep.shape[0] + max(0, limit - max(n, picture))])
                n += block.shape[0]
                if n >= limit:
                    break
            if n == 0:
                raise MediaError(p, "audio stream contains no samples")
            if n >= limit and cfg.length_policy not in ("trim", "fit"):
                raise AudioLengthError(
                    p,
                    f"audio is more than {n / sr:.3f} s (decoding stopped there), over a frame longer than "
                    f"the picture ({picture / sr:.3f} s = {frame_count} frames at {fps} fps); "
                    "set audio.length_policy=trim or fit to conform it",
                )
            decision = check_length(n, sr, frame_count, fps, cfg.length_policy, path=p)
            if decision.action == "ok":
                if n > picture:
                    wav.write(np.concatenate(tail))
            elif decision.action == "pad":
                wav.write(np.zeros((picture - n, channels), np.float32))
        if decision.action != "ok":
            log.warning(
                "%s: audio differs from the picture by %s%+.3f s; %s to %.3f s (audio.length_policy=%s)",
                p, "more than " if n >= limit else "", decision.diff_s,
                "padding with silence" if decision.action == "pad" else "trimming",
                decision.target_samples / sr, cfg.length_policy,
            )  # fmt: skip
    return DialogueTrack(
        path=str(out),
        source=str(audio_path),
        sample_rate=sr,
        channels=channels,
        n_samples=int(decision.target_samples),
        action=decision.action,
        source_duration_s=decision.source_samples / sr,
    )


def check_mix(mix_path: str | Path, *, frame_count: int, fps: Fraction, policy: str) -> LengthDecision:
    """Check the final mix's length (decoded at 8 kHz mono: enough to measure it exactly)."""
    rate, p = 8000, Path(mix_path)
    head = read_header(p)
    check_header_length(p, head, frame_count, fps, policy)
    n = sum(block.shape[0] for block in _blocks(p, head, rate, 1))  # streamed: one block in memory
    if n == 0:
        raise MediaError(p, "audio stream contains no samples")
    return check_length(n, rate, frame_count, fps, policy, path=mix_path)


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
