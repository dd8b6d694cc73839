"""Chunk planning and audio windows of a streaming run: which frames each chunk generates and keeps.

Holds `ChunkSpec`, the dubflow and official chunk planners, and the per-frame audio windows (5
wav2vec2 frames centred on every generated frame, clamped to the embedding; the official plan's
last chunk reads a mirror-extended embedding instead). Pure index arithmetic on integers and small
index tensors: it must not hold model calls, conditioning, sampling or stream state (those are
`model.sampling.conditioning`, `model.sampling.sampler` and `model.sampling.stream`), and it imports nothing from `model/`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

VAE_TIME_STRIDE = 4
AUDIO_WINDOW = 5  # frames of wav2vec2 features centred on each video frame

PlanPolicy = Literal["dubflow", "official"]


class PlanSettings(Protocol):
    """The settings a chunk plan depends on (`model.sampling.sampler.SamplerSettings` has them)."""

    @property
    def plan(self) -> PlanPolicy: ...

    @property
    def frame_num(self) -> int: ...

    @property
    def motion_frames(self) -> int: ...

    @property
    def max_frames(self) -> int: ...


def round_up_4n1(n: int) -> int:
    """Smallest 4k+1 >= n (n >= 1)."""
    return VAE_TIME_STRIDE * math.ceil((n - 1) / VAE_TIME_STRIDE) + 1


@dataclass(frozen=True)
class ChunkSpec:
    """One chunk of a streaming run.

    The chunk generates frames ``[start, start + length)`` of the shot (audio frames at 25 fps);
    its first ``motion_in`` frames re-render conditioning frames (the reference frame for chunk 0,
    the previous chunk's tail otherwise). Frames ``[keep_start, keep_end)`` of the decoded chunk
    go to the output at position ``out_start``. ``mirror_pad``: the official loop extends the audio
    embedding of this (last) chunk by mirrored frames instead of clamping at its end.
    """

    index: int
    start: int
    length: int
    motion_in: int
    keep_start: int
    keep_end: int
    out_start: int
    mirror_pad: bool = False

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def latent_frames(self) -> int:
        return 1 + (self.length - 1) // VAE_TIME_STRIDE

    @property
    def motion_latent_frames(self) -> int:
        return 1 + (self.motion_in - 1) // VAE_TIME_STRIDE

    @property
    def n_kept(self) -> int:
        return self.keep_end - self.keep_start


def plan_chunks(n_frames: int, frame_num: int = 81, motion_frames: int = 9) -> list[ChunkSpec]:
    """dubflow chunking: every frame of an ``n_frames`` shot is output exactly once.

    Full chunks of ``frame_num`` frames advance by ``frame_num - motion_frames``. A shot that
    fits in one chunk gets a single chunk of ``round_up_4n1(n_frames)`` frames. When a full chunk
    would run past the shot, the final chunk is shortened to ``round_up_4n1(motion_frames + r)``
    frames (r = frames still missing), so at most 3 generated frames are discarded instead of the
    official full chunk on mirrored audio. Audio windows of frames past the shot are clamped.
    """
    if n_frames < 1:
        raise ValueError(f"plan_chunks: n_frames must be >= 1, got {n_frames}")
    if frame_num < 1 or (frame_num - 1) % VAE_TIME_STRIDE or not 1 <= motion_frames < frame_num:
        raise ValueError(
            f"plan_chunks: need frame_num=4n+1 > motion_frames>=1, got {frame_num}, {motion_frames}"
        )
    if n_frames <= frame_num:
        length = round_up_4n1(n_frames)
        return [ChunkSpec(0, 0, length, 1, 0, n_frames, 0)]
    chunks = [ChunkSpec(0, 0, frame_num, 1, 0, frame_num, 0)]
    done = frame_num
    while done < n_frames:
        start = done - motion_frames
        length = min(frame_num, round_up_4n1(n_frames - start))
        keep_end = min(length, n_frames - start)
        chunks.append(ChunkSpec(len(chunks), start, length, motion_frames, motion_frames, keep_end, done))
        done = start + keep_end
    return chunks


def plan_chunks_official(
    n_audio: int, frame_num: int = 81, motion_frames: int = 9, max_frames: int = 1000
) -> list[ChunkSpec]:
    """generate_infinitetalk's chunking for an ``n_audio``-frame embedding (parity mode).

    All chunks have ``frame_num`` frames and advance by ``frame_num - motion_frames``; the chunk
    whose end reaches ``min(max_frames, n_audio)`` is the last and gets mirrored audio padding;
    with ``max_frames <= frame_num`` (clip mode) only one chunk runs. The output is cut to
    ``min(max_frames, n_audio)`` frames (clip mode: ``min(max_frames, frame_num)``).
    """
    if n_audio <= frame_num:
        raise ValueError(
            f"official plan needs an audio embedding longer than frame_num={frame_num}, got {n_audio} frames"
        )
    starts, mirror = [0], [False]
    if max_frames > frame_num:
        while not mirror[-1]:
            start = starts[-1] + frame_num - motion_frames
            starts.append(start)
            mirror.append(start + frame_num >= min(max_frames, n_audio))
        total = min(max_frames, n_audio)
    else:
        total = min(max_frames, frame_num)
    chunks, done = [], 0
    for k, (start, pad) in enumerate(zip(starts, mirror, strict=True)):
        motion = 1 if k == 0 else motion_frames
        keep_start = 0 if k == 0 else motion_frames
        keep_end = min(frame_num, keep_start + total - done)
        chunks.append(ChunkSpec(k, start, frame_num, motion, keep_start, keep_end, done, pad))
        done += keep_end - keep_start
    return chunks


def plan_for(settings: PlanSettings, n_frames: int) -> list[ChunkSpec]:
    """The chunk plan `settings.plan` asks for (n_frames = shot length, or audio length if official)."""
    if settings.plan == "official":
        return plan_chunks_official(n_frames, settings.frame_num, settings.motion_frames, settings.max_frames)
    return plan_chunks(n_frames, settings.frame_num, settings.motion_frames)


def audio_window_indices(start: int, stop: int, emb_len: int, window: int = AUDIO_WINDOW) -> torch.Tensor:
    """Indices of the ``window`` audio frames centred on each frame in [start, stop), clamped.

    Returns (stop - start, window) int64 in [0, emb_len - 1].
    """
    half = window // 2
    centres = torch.arange(start, stop, dtype=torch.int64)[:, None]  # (F, 1)
    return (centres + torch.arange(-half, half + 1, dtype=torch.int64)[None]).clamp(0, emb_len - 1)


def mirror_pad_length(chunk_end: int, emb_len: int) -> int:
    """Official end-of-audio padding: frames appended when a last chunk ends at/after the audio."""
    return chunk_end - emb_len + 3 if chunk_end >= emb_len else 0


def chunk_audio_indices(spec: ChunkSpec, emb_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Audio windows of one chunk for an ``emb_len``-frame embedding.

    Returns (indices into the possibly mirror-extended embedding, the same resolved to frames of
    the original embedding), both (spec.length, 5) int64. With ``spec.mirror_pad`` the embedding
    is extended by `mirror_pad_length` frames in reverse order (frame j >= L is frame 2L-1-j).
    """
    source = torch.arange(emb_len, dtype=torch.int64)
    if spec.mirror_pad:
        miss = mirror_pad_length(spec.end, emb_len)
        if miss:
            source = torch.cat([source, source[max(emb_len - miss, 0) :].flip(0)])
    idx = audio_window_indices(spec.start, spec.end, source.numel())
    return idx, source[idx]


def chunk_audio(embeddings: Sequence[torch.Tensor], spec: ChunkSpec) -> torch.Tensor:
    """Windowed audio features of every speaker: (S, length, 5, *feature_dims)."""
    windows = [emb[chunk_audio_indices(spec, emb.shape[0])[1].to(emb.device)] for emb in embeddings]
    return torch.stack(windows, dim=0)


def null_audio(audio: torch.Tensor) -> torch.Tensor:
    """Null-audio input: zeros of batch 1, so null-audio calls take the single-speaker path."""
    return torch.zeros_like(audio[-1:])
