"""InfiniteTalk sampler: flow-matching schedule, chunk planning and the streaming loop.

The loop takes the DiT, the VAE, the colour corrector and the reference-frame source as
arguments; it never loads files, calls text/image encoders per step, or touches ffmpeg.

Model contract (see `model/dit.py`)::

    model(x (B,16,F,h,w), t=(B,), context=(B,Lt,Dt), clip_fea=(B,257,1280), y=(B,20,F,h,w),
          audio=(S,F_pix,5,12,768), ref_target_masks=(M,h,w), teacache=..., branch=name)
          -> (B,16,F,h,w)

VAE contract (see `model/vae.py`): ``encode(video (B,3,T,H,W) in [-1,1]) -> (B,16,F,h,w)`` scaled
latent, ``decode(latent) -> (B,3,T,H,W)`` clamped to [-1,1].

Streaming (one shot = one `stream_generate` run):

* chunk k generates ``length`` frames starting at frame ``start``; chunk 0 is conditioned on the
  reference frame only, later chunks on the last ``motion_frames`` decoded (colour-corrected)
  frames of the previous chunk, whose clean VAE latent is written into the first
  ``1 + (motion_frames-1)//4`` latent frames before every DiT call and after every update;
* ``y`` = [4-channel first-frame mask, VAE(reference frame followed by zero frames)];
* audio windows: 5 frames centred on every generated frame, clamped to the embedding;
* the state between chunks (`StreamState`) is explicit and serialisable, so a run can be
  checkpointed after any chunk and resumed with bit-identical results.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from model.guidance import APGState, apg_combine, cfg_combine, guidance_branches

logger = logging.getLogger(__name__)

LATENT_CHANNELS = 16
VAE_TIME_STRIDE = 4
VAE_SPACE_STRIDE = 8
AUDIO_WINDOW = 5  # frames of wav2vec2 features centred on each video frame

PlanPolicy = Literal["dubflow", "official"]
ColorReference = Literal["chunk", "first"]


class VelocityModel(Protocol):
    """The DiT as the sampler calls it (`model.dit.InfiniteTalkDiT`)."""

    def __call__(
        self,
        x: torch.Tensor,
        *,
        t: torch.Tensor,
        context: torch.Tensor,
        clip_fea: torch.Tensor,
        y: torch.Tensor,
        audio: torch.Tensor,
        ref_target_masks: torch.Tensor | None,
        teacache: object | None,
        branch: str,
    ) -> torch.Tensor: ...


class LatentCodec(Protocol):
    """The VAE as the sampler uses it (`model.vae.WanVAE`)."""

    def encode(self, video: torch.Tensor) -> torch.Tensor: ...

    def decode(self, latent: torch.Tensor) -> torch.Tensor: ...


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplerSettings:
    """Sampling parameters of one run (defaults = official InfiniteTalk 480p CLI defaults).

    plan: ``"dubflow"`` sizes the final chunk to the shot (see `plan_chunks`); ``"official"``
        reproduces generate_infinitetalk's chunking, mirrored audio padding and final cut.
    color_reference: ``"chunk"`` matches each chunk's colours to its own reference frame
        (dubflow default); ``"first"`` to the first chunk's (what the official code does).
    denoise_strength: 1.0 starts from pure noise; s < 1 starts from the source chunk's latent
        noised to the schedule's timestep at step ``N - int(N*s)`` and skips earlier steps.
    max_frames: only for the official plan (its ``max_frames_num``).
    batch_branches: evaluate a step's 2-3 guidance branches as one batched DiT call (same numbers
        up to float rounding; one TeaCache decision per step, under the branch name
        ``"cond+drop_text+uncond"``) instead of one call per branch.
    """

    frame_num: int = 81
    motion_frames: int = 9
    sampling_steps: int = 40
    shift: float = 7.0
    text_guide_scale: float = 5.0
    audio_guide_scale: float = 4.0
    use_apg: bool = False
    apg_momentum: float = -0.75
    apg_norm_threshold: float = 55.0
    color_correction_strength: float = 1.0
    color_reference: ColorReference = "chunk"
    denoise_strength: float = 1.0
    seed: int = 42
    plan: PlanPolicy = "dubflow"
    max_frames: int = 1000
    num_train_timesteps: int = 1000
    batch_branches: bool = False

    def __post_init__(self) -> None:
        if self.frame_num < 1 or (self.frame_num - 1) % VAE_TIME_STRIDE:
            raise ValueError(f"SamplerSettings.frame_num must be 4n+1, got {self.frame_num}")
        if not 1 <= self.motion_frames < self.frame_num:
            raise ValueError(
                f"SamplerSettings.motion_frames must be in [1, frame_num), got {self.motion_frames}"
            )
        if self.sampling_steps < 1:
            raise ValueError(f"SamplerSettings.sampling_steps must be >= 1, got {self.sampling_steps}")
        if not 0.0 < self.denoise_strength <= 1.0:
            raise ValueError(
                f"SamplerSettings.denoise_strength must be in (0, 1], got {self.denoise_strength}"
            )
        if not 0.0 <= self.color_correction_strength <= 1.0:
            raise ValueError(
                "SamplerSettings.color_correction_strength must be in [0, 1], "
                f"got {self.color_correction_strength}"
            )
        if self.color_reference not in ("chunk", "first"):
            raise ValueError(
                f"SamplerSettings.color_reference must be chunk|first, got {self.color_reference!r}"
            )
        if self.plan not in ("dubflow", "official"):
            raise ValueError(f"SamplerSettings.plan must be dubflow|official, got {self.plan!r}")

    @property
    def start_step(self) -> int:
        """Index of the first schedule step run (0 unless denoise_strength < 1)."""
        n = self.sampling_steps
        return n - min(int(n * self.denoise_strength), n)


SAMPLER_PRESETS: dict[str, SamplerSettings] = {
    "infinitetalk-480": SamplerSettings(shift=7.0),
    "infinitetalk-720": SamplerSettings(shift=11.0),
    "tiny": SamplerSettings(frame_num=13, motion_frames=5, sampling_steps=3),
}


def sampler_preset(name: str, **overrides: object) -> SamplerSettings:
    """A named preset (``infinitetalk-480``, ``infinitetalk-720``, ``tiny``) with field overrides."""
    if name not in SAMPLER_PRESETS:
        raise KeyError(f"unknown sampler preset {name!r}; known: {sorted(SAMPLER_PRESETS)}")
    return replace(SAMPLER_PRESETS[name], **overrides)


# --------------------------------------------------------------------------------------------
# Schedule and Euler update
# --------------------------------------------------------------------------------------------


def timestep_schedule(sampling_steps: int, shift: float, num_train_timesteps: int = 1000) -> torch.Tensor:
    """Shifted flow-matching timesteps: ``sampling_steps`` model timesteps then a final 0.

    ``t = linspace(T, 1, N)`` (float32) + [0], each mapped by ``T * s t' / (1 + (s-1) t')`` with
    ``t' = t/T`` in float32. Returns (N+1,) float32.
    """
    raw = np.linspace(num_train_timesteps, 1, sampling_steps, dtype=np.float32)
    t = torch.from_numpy(np.append(raw, np.float32(0.0)).astype(np.float32))  # (N+1,)
    t = t / num_train_timesteps
    t = shift * t / (1 + (shift - 1) * t)
    return t * num_train_timesteps


def add_noise(
    original: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, num_train_timesteps: int = 1000
) -> torch.Tensor:
    """Flow-matching forward process ``(1 - t/T) x + (t/T) noise``.

    t: (B,) or (1,) timesteps, broadcast over the remaining dims of `original`.
    """
    s = t.float() / num_train_timesteps
    s = s.view(s.shape + (1,) * (original.dim() - s.dim()))
    return (1 - s) * original + s * noise


def euler_update(
    latent: torch.Tensor,
    velocity: torch.Tensor,
    t: torch.Tensor,
    t_next: torch.Tensor,
    num_train_timesteps: int = 1000,
) -> torch.Tensor:
    """One Euler step ``x + (-v) (t - t_next)/T``; t, t_next: (1,) or (B,) tensors."""
    dt = (t - t_next) / num_train_timesteps
    dt = dt.view(dt.shape + (1,) * (latent.dim() - dt.dim()))
    return latent + (-velocity) * dt


# --------------------------------------------------------------------------------------------
# Chunk planning and audio windows
# --------------------------------------------------------------------------------------------


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


def plan_for(settings: SamplerSettings, n_frames: int) -> list[ChunkSpec]:
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


# --------------------------------------------------------------------------------------------
# Speaker masks
# --------------------------------------------------------------------------------------------


def official_bbox_to_xyxy(bbox: Sequence[float]) -> tuple[float, float, float, float]:
    """Map an official ``input_data['bbox']`` entry to [x0, y0, x1, y1] (x = column).

    The official pipeline names its box ``[x_min, y_min, x_max, y_max]`` but indexes rows with the
    x pair and columns with the y pair, so its ``[a, b, c, d]`` is the column/row box
    ``[b, a, d, c]`` here.
    """
    a, b, c, d = bbox
    return (b, a, d, c)


def _center_crop(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Centre crop of the last two dims with torchvision's offset rounding (round half to even)."""
    th, tw = size
    h, w = x.shape[-2:]
    top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
    return x[..., top : top + th, left : left + tw]


def speaker_masks(
    boxes: Sequence[Sequence[float]] | None,
    n_speakers: int,
    source_hw: tuple[int, int],
    target_hw: tuple[int, int],
    latent_hw: tuple[int, int],
    face_scale: float = 0.05,
) -> torch.Tensor:
    """Speaker/background masks at latent resolution, built as the official pipeline does.

    boxes: one [x0, y0, x1, y1] pixel box per speaker in the *source* frame (x = column; use
    `official_bbox_to_xyxy` for official bbox entries), or None. One speaker: three all-ones masks.
    Two speakers without boxes: left/right halves inset by ``face_scale``. Masks are resized to
    cover ``target_hw`` (nearest), centre-cropped, resized (nearest) to ``latent_hw`` and
    binarised. Returns (3, h, w) float32: speaker 1, speaker 2, background.
    """
    src_h, src_w = source_hw
    if n_speakers == 1:
        masks = torch.ones(3, src_h, src_w)
    elif n_speakers == 2:
        humans = []
        if boxes is not None:
            if len(boxes) != n_speakers:
                raise ValueError(f"speaker_masks: {len(boxes)} boxes for {n_speakers} speakers")
            for x0, y0, x1, y1 in boxes:
                m = torch.zeros(src_h, src_w)
                m[int(y0) : int(y1), int(x0) : int(x1)] = 1
                humans.append(m)
        else:
            r0, r1 = int(src_h * face_scale), int(src_h * (1 - face_scale))
            half = src_w // 2
            for off in (0, half):
                m = torch.zeros(src_h, src_w)
                m[r0:r1, int(half * face_scale + off) : int(half * (1 - face_scale) + off)] = 1
                humans.append(m)
        background = (sum(humans) == 0).float()
        masks = torch.stack([*humans, background])  # (3, H_src, W_src)
    else:
        raise ValueError(f"speaker_masks: 1 or 2 speakers supported, got {n_speakers}")
    th, tw = target_hw
    scale = max(th / src_h, tw / src_w)
    covered = F.interpolate(
        masks[None], size=(math.ceil(scale * src_h), math.ceil(scale * src_w)), mode="nearest"
    )
    cropped = _center_crop(covered, (th, tw))  # (1, 3, H, W)
    latent = F.interpolate(cropped, size=latent_hw, mode="nearest")[0]  # (3, h, w)
    return (latent > 0).float()


# --------------------------------------------------------------------------------------------
# Conditioning and per-step pieces
# --------------------------------------------------------------------------------------------


def first_frame_mask(
    length: int, latent_hw: tuple[int, int], device: torch.device | None = None
) -> torch.Tensor:
    """The 4-channel mask of ``y``: ones on pixel frame 0 only. Returns (1, 4, F_lat, h, w)."""
    h, w = latent_hw
    f_lat = 1 + (length - 1) // VAE_TIME_STRIDE
    msk = torch.zeros(1, 4, f_lat, h, w, device=device)
    msk[:, :, 0] = 1  # pixel frame 0 repeated 4x fills the 4 slots of latent frame 0
    return msk


def build_y(vae: LatentCodec, reference: torch.Tensor, length: int) -> torch.Tensor:
    """Image condition ``[mask, VAE(reference, zeros...)]``: (1, 20, F_lat, h, w).

    reference: (1, 3, 1, H, W) in [-1, 1].
    """
    _, c, _, h, w = reference.shape
    pixels = torch.cat([reference, reference.new_zeros(1, c, length - 1, h, w)], dim=2)  # (1,3,L,H,W)
    lat = vae.encode(pixels)  # (1, 16, F_lat, h, w)
    msk = first_frame_mask(length, lat.shape[-2:], device=lat.device).to(lat.dtype)
    return torch.cat([msk, lat], dim=1)


def branch_inputs(
    branches: Sequence[str], context: torch.Tensor, context_null: torch.Tensor, audio: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(context, audio) each guidance branch is called with; null audio is `null_audio(audio)`."""
    silent = null_audio(audio)
    table = {
        "cond": (context, audio),
        "drop_text": (context_null, audio),
        "uncond": (context_null, silent),
        "drop_audio": (context, silent),
    }
    return {b: table[b] for b in branches}


@dataclass
class Conditioning:
    """Per-shot inputs that stay fixed across chunks (encoders already run by the caller).

    context / context_null: T5 features (1, Lt, Dt) or (Lt, Dt). audio: one (L, 12, 768) wav2vec2
    embedding per speaker at 25 fps. ref_target_masks: (3, h, w) from `speaker_masks`.
    clip_fn: reference (1, 3, 1, H, W) -> CLIP features (1, 257, 1280).
    n_frames: shot length (default: the first speaker's audio length; the official plan always
    uses the audio length). source_video_fn: (start, stop) -> source frames (3, T<=stop-start, H, W)
    in [-1, 1], needed only for denoise_strength < 1 (short returns are padded with the last frame).
    """

    context: torch.Tensor
    context_null: torch.Tensor
    audio: list[torch.Tensor]
    ref_target_masks: torch.Tensor
    clip_fn: Callable[[torch.Tensor], torch.Tensor]
    n_frames: int | None = None
    source_video_fn: Callable[[int, int], torch.Tensor] | None = None

    def shot_frames(self, settings: SamplerSettings) -> int:
        if settings.plan == "official" or self.n_frames is None:
            return int(self.audio[0].shape[0])
        return self.n_frames


# --------------------------------------------------------------------------------------------
# Streaming state and results
# --------------------------------------------------------------------------------------------


@dataclass
class StreamState:
    """Everything needed to continue a streaming run after a chunk boundary.

    next_chunk: index of the next chunk to generate; frames_emitted: output frames so far;
    motion_frames: last ``motion_frames`` decoded, colour-corrected frames (1, 3, m, H, W) that
    condition the next chunk; color_reference: the first chunk's reference (1, 3, 1, H, W) when
    colours follow the first chunk; rng_state: the noise generator's state; plan_key: (n_frames,
    frame_num, motion_frames) the run was planned with, checked on resume.
    """

    next_chunk: int = 0
    frames_emitted: int = 0
    motion_frames: torch.Tensor | None = None
    color_reference: torch.Tensor | None = None
    rng_state: torch.Tensor | None = None
    plan_key: tuple[int, int, int] = (0, 0, 0)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (None fields omitted): fits `torch.save` and `safetensors.save_file`."""
        out = {
            "next_chunk": torch.tensor(self.next_chunk, dtype=torch.int64),
            "frames_emitted": torch.tensor(self.frames_emitted, dtype=torch.int64),
            "plan_key": torch.tensor(self.plan_key, dtype=torch.int64),
        }
        for name in ("motion_frames", "color_reference", "rng_state"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value.detach().cpu().contiguous()
        return out

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> StreamState:
        try:
            return cls(
                next_chunk=int(sd["next_chunk"]),
                frames_emitted=int(sd["frames_emitted"]),
                motion_frames=sd.get("motion_frames"),
                color_reference=sd.get("color_reference"),
                rng_state=sd.get("rng_state"),
                plan_key=tuple(int(v) for v in sd["plan_key"]),  # type: ignore[arg-type]
            )
        except KeyError as e:
            raise ValueError(f"StreamState.from_state_dict: missing key {e.args[0]!r}") from e


@dataclass
class ChunkOutput:
    """What one chunk produced: kept frames (3, n_kept, H, W), final latent (16, F, h, w), state after it."""

    spec: ChunkSpec
    frames: torch.Tensor
    latent: torch.Tensor
    state: StreamState


@dataclass
class StreamResult:
    """Frames (3, T, H, W) and latents generated by this call (empty when ``collect=False``)."""

    video: torch.Tensor | None
    latents: list[torch.Tensor] = field(default_factory=list)
    chunks: list[ChunkSpec] = field(default_factory=list)
    state: StreamState = field(default_factory=StreamState)
    total_chunks: int = 0

    @property
    def done(self) -> bool:
        """True once the last chunk of the plan has been generated."""
        return self.state.next_chunk >= self.total_chunks


# --------------------------------------------------------------------------------------------
# The streaming loop
# --------------------------------------------------------------------------------------------


def _batched(x: torch.Tensor, ndim: int) -> torch.Tensor:
    return x if x.dim() == ndim else x.unsqueeze(0)


def _source_chunk(cond: Conditioning, spec: ChunkSpec) -> torch.Tensor:
    """Source frames of a chunk (1, 3, length, H, W), repeating the last one past the shot end."""
    if cond.source_video_fn is None:
        raise ValueError("denoise_strength < 1 needs Conditioning.source_video_fn")
    src = cond.source_video_fn(spec.start, spec.end)  # (3, T, H, W)
    if src.shape[1] < spec.length:
        pad = src[:, -1:].expand(-1, spec.length - src.shape[1], -1, -1)
        src = torch.cat([src, pad], dim=1)
    return src[None]


def _batched_branches(
    model: VelocityModel,
    latent: torch.Tensor,
    t: torch.Tensor,
    calls: dict[str, tuple[torch.Tensor, torch.Tensor]],
    clip_fea: torch.Tensor,
    y: torch.Tensor,
    ref_target_masks: torch.Tensor,
    teacache=None,
) -> dict[str, torch.Tensor]:
    """All guidance branches of one step as one DiT call of batch len(calls).

    Contexts are zero-padded to a common length (the DiT zero-pads to text_len anyway); audio is
    stacked per sample (B, S_max, F_pix, 5, 12, 768) with zero slots for branches with fewer
    speakers, which `audio_speakers` tells the DiT to ignore (null audio stays one speaker).
    """
    names = list(calls)
    contexts = [_batched(c, 3) for c, _ in calls.values()]  # (1, Lt_i, Dt) each
    length = max(c.shape[1] for c in contexts)
    context = torch.cat([F.pad(c, (0, 0, 0, length - c.shape[1])) for c in contexts])  # (B, Lt, Dt)
    audios = [a for _, a in calls.values()]  # (S_i, F_pix, 5, 12, 768) each
    slots = max(a.shape[0] for a in audios)
    audio = torch.stack([F.pad(a, (0, 0) * (a.dim() - 1) + (0, slots - a.shape[0])) for a in audios])
    out = model(
        latent.expand(len(names), -1, -1, -1, -1),
        t=t.expand(len(names)),
        context=context,
        clip_fea=clip_fea,
        y=y,
        audio=audio,  # (B, S_max, F_pix, 5, 12, 768)
        ref_target_masks=ref_target_masks,
        audio_speakers=[a.shape[0] for a in audios],
        teacache=teacache,
        branch="+".join(names),
    ).float()  # (B, 16, F, h, w)
    return {name: out[i : i + 1] for i, name in enumerate(names)}


def denoise_chunk(
    model: VelocityModel,
    latent: torch.Tensor,
    motion_latent: torch.Tensor,
    timesteps: torch.Tensor,
    *,
    start_step: int,
    context: torch.Tensor,
    context_null: torch.Tensor,
    clip_fea: torch.Tensor,
    y: torch.Tensor,
    audio: torch.Tensor,
    ref_target_masks: torch.Tensor,
    settings: SamplerSettings,
    generator: torch.Generator,
    draw_motion_noise: bool,
    teacache=None,
) -> torch.Tensor:
    """Euler sampling of one chunk from ``timesteps[start_step]`` to 0.

    latent: (1, 16, F, h, w) initial latent; motion_latent: (1, 16, T_m, h, w), written clean into
    the first T_m latent frames before every step and after every update. With
    ``draw_motion_noise`` one ``randn`` of the motion-latent shape is drawn before the loop and
    after every update: the official loop writes ``add_noise(motion, that noise, t)`` there and
    immediately overwrites it with the clean latent, so only the draws matter (they shift the
    noise of later chunks); the dead write is skipped.
    """
    t_m = motion_latent.shape[2]
    # official plan mode keeps the official call pattern (it never drops below 2 calls)
    audio_scale = None if settings.plan == "official" else settings.audio_guide_scale
    branches = guidance_branches(settings.text_guide_scale, audio_scale)
    calls = branch_inputs(branches, context, context_null, audio)
    apg = APGState(settings.apg_momentum, settings.apg_norm_threshold) if settings.use_apg else None

    def motion_noise() -> None:
        if draw_motion_noise:
            torch.randn(
                motion_latent.shape, generator=generator, dtype=torch.float32, device=generator.device
            )

    motion_noise()
    latent = latent.clone()
    batched = settings.batch_branches and len(calls) > 1
    if teacache is not None and hasattr(model, "timestep_modulation"):  # TeaCache decisions: no sync per call
        teacache.prepare_schedule(
            model.timestep_modulation,
            timesteps[start_step : settings.sampling_steps],
            len(calls) if batched else 1,
        )
    for i in range(start_step, settings.sampling_steps):
        t, t_next = timesteps[i : i + 1], timesteps[i + 1 : i + 2]  # (1,), (1,)
        latent[:, :, :t_m] = motion_latent
        if batched:
            preds = _batched_branches(model, latent, t, calls, clip_fea, y, ref_target_masks, teacache)
        else:
            preds = {
                name: model(
                    latent,
                    t=t,
                    context=ctx,
                    clip_fea=clip_fea,
                    y=y,
                    audio=aud,
                    ref_target_masks=ref_target_masks,
                    teacache=teacache,
                    branch=name,
                ).float()
                for name, (ctx, aud) in calls.items()
            }
        if apg is not None:
            velocity = apg_combine(preds, settings.text_guide_scale, settings.audio_guide_scale, apg)
        else:
            velocity = cfg_combine(preds, settings.text_guide_scale, settings.audio_guide_scale)
        latent = euler_update(latent, velocity, t, t_next, settings.num_train_timesteps)
        motion_noise()
        latent[:, :, :t_m] = motion_latent
    return latent


@torch.no_grad()
def stream_generate(
    model: VelocityModel,
    vae: LatentCodec,
    *,
    cond: Conditioning,
    settings: SamplerSettings,
    reference_frame_fn: Callable[[int, int], torch.Tensor],
    color_fn: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None,
    state: StreamState | None = None,
    on_chunk: Callable[[ChunkOutput], None] | None = None,
    generator: torch.Generator | None = None,
    teacache=None,
    collect: bool = True,
    max_chunks: int | None = None,
) -> StreamResult:
    """Generate a shot chunk by chunk (or continue it from `state`).

    reference_frame_fn(chunk_index, start_frame) -> (3, 1, H, W) in [-1, 1]: the sliding
    reference frame (the official loop reads frame ``start`` of the conditioning video).
    color_fn(video (1,3,T,H,W), reference (1,3,1,H,W), strength) -> video, e.g.
    ``tasks.color.match_and_blend``; skipped when None or the strength is 0.
    generator: noise source (default: seeded with ``settings.seed`` on the context's device, as
    the official loop's global generator). Noise is drawn on the generator's device and moved, so a
    CPU generator gives the same noise on any device. On resume the state's RNG state is loaded
    into `generator` (pass one on the original run's generator device) or a new one on the
    context's device.
    teacache: optional step cache (`model.teacache.TeaCache`) handed to every model call with its
    branch name and reset at the start of each chunk (the official counters restart every chunk
    too); build it for ``sampling_steps - settings.start_step`` steps. `denoise_chunk` prepares its
    distances from the model's ``timestep_modulation`` (if it has one) before the step loop, so the
    loop makes no host sync for it.
    on_chunk: called after every chunk with its kept frames, latent and the state to checkpoint.
    max_chunks: stop after this many chunks (the returned state continues the run).
    """
    device = cond.context.device
    n_frames = cond.shot_frames(settings)
    plan = plan_for(settings, n_frames)
    key = (n_frames, settings.frame_num, settings.motion_frames)
    if state is None:
        state = StreamState(plan_key=key)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(settings.seed)
    else:
        if tuple(state.plan_key) != key:
            raise ValueError(f"stream_generate: state was planned for {state.plan_key}, settings give {key}")
        if state.rng_state is None:
            raise ValueError("stream_generate: resumed state has no rng_state")
        generator = generator if generator is not None else torch.Generator(device=device)
        generator.set_state(state.rng_state)

    context = _batched(cond.context, 3)  # (1, Lt, Dt)
    context_null = _batched(cond.context_null, 3)
    masks = cond.ref_target_masks.to(device)
    timesteps = timestep_schedule(settings.sampling_steps, settings.shift, settings.num_train_timesteps).to(
        device
    )
    start_step = settings.start_step

    frames_out, latents_out, specs_out = [], [], []
    todo = plan[state.next_chunk :]
    if max_chunks is not None:
        todo = todo[:max_chunks]
    for spec in todo:
        logger.debug(
            "chunk %d: frames [%d, %d), keep [%d, %d)",
            spec.index,
            spec.start,
            spec.end,
            spec.keep_start,
            spec.keep_end,
        )
        # 1. audio windows and initial noise (official RNG order: noise first)
        audio = chunk_audio([a.to(device) for a in cond.audio], spec)  # (S, L, 5, 12, 768)
        reference = _batched(reference_frame_fn(spec.index, spec.start), 5).to(device, torch.float32)
        if reference.shape[:3] != (1, 3, 1):
            raise ValueError(f"reference_frame_fn must return (3, 1, H, W), got {tuple(reference.shape)}")
        h, w = reference.shape[-2] // VAE_SPACE_STRIDE, reference.shape[-1] // VAE_SPACE_STRIDE
        noise = torch.randn(
            (1, LATENT_CHANNELS, spec.latent_frames, h, w),
            generator=generator,
            dtype=torch.float32,
            device=generator.device,
        ).to(device)
        # 2. image conditions
        clip_fea = cond.clip_fn(reference)  # (1, 257, 1280)
        y = build_y(vae, reference, spec.length)  # (1, 20, F, h, w)
        if spec.index == 0:
            motion_latent = vae.encode(reference)  # (1, 16, 1, h, w)
        else:
            if state.motion_frames is None:
                raise ValueError(f"stream_generate: chunk {spec.index} needs motion frames in the state")
            motion_latent = vae.encode(state.motion_frames.to(device))  # (1, 16, T_m, h, w)
        motion_latent = motion_latent.float()
        # 3. initial latent: pure noise, or the source chunk noised to the start timestep (v2v)
        latent = noise
        if start_step > 0:
            source = vae.encode(_source_chunk(cond, spec).to(device)).float()
            latent = add_noise(
                source, noise, timesteps[start_step : start_step + 1], settings.num_train_timesteps
            )
        # 4. denoise
        if teacache is not None:
            teacache.reset()
        x0 = denoise_chunk(
            model,
            latent,
            motion_latent,
            timesteps,
            start_step=start_step,
            context=context,
            context_null=context_null,
            clip_fea=clip_fea,
            y=y,
            audio=audio,
            ref_target_masks=masks,
            settings=settings,
            generator=generator,
            draw_motion_noise=spec.index > 0,
            teacache=teacache,
        )
        # 5. decode, colour-correct, keep
        video = vae.decode(x0).float()  # (1, 3, L, H, W)
        first_reference = state.color_reference
        if spec.index == 0 and settings.color_reference == "first":
            first_reference = reference.detach().clone()
        color_ref = first_reference if settings.color_reference == "first" else reference
        if color_fn is not None and settings.color_correction_strength > 0:
            if color_ref is None:
                raise ValueError(
                    "stream_generate: color_reference='first' but the state has no colour reference"
                )
            video = color_fn(video, color_ref.to(video.device), settings.color_correction_strength)
        frames = video[0, :, spec.keep_start : spec.keep_end]  # (3, n_kept, H, W)
        # 6. state for the next chunk
        last = spec.index == plan[-1].index
        state = StreamState(
            next_chunk=spec.index + 1,
            frames_emitted=state.frames_emitted + spec.n_kept,
            motion_frames=None if last else video[:, :, -settings.motion_frames :].detach().clone(),
            color_reference=first_reference,
            rng_state=generator.get_state(),
            plan_key=key,
        )
        if on_chunk is not None:
            on_chunk(ChunkOutput(spec, frames, x0[0], state))
        specs_out.append(spec)
        if collect:  # kept on the host: a long shot's frames would not fit next to the model
            frames_out.append(frames.cpu())
            latents_out.append(x0[0].cpu())
    video_out = torch.cat(frames_out, dim=1) if frames_out else None
    return StreamResult(video_out, latents_out, specs_out, state, len(plan))
