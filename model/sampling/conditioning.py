"""Per-shot conditioning of the sampler: speaker masks, the image condition ``y`` and branch inputs.

Holds the official bbox mapping and `speaker_masks` (speaker/background masks at latent
resolution), ``y`` = [4-channel first-frame mask, VAE(reference frame followed by zero frames)]
(`first_frame_mask`, `build_y`), the (context, audio) pair each guidance branch is called with
(`branch_inputs`), and `Conditioning`, the inputs that stay fixed across a shot's chunks. It must
not run encoders itself (the caller hands it features and a CLIP callable), sample, or keep
stream state; it imports only `model.sampling.chunks` from `model/`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from model.sampling.chunks import VAE_TIME_STRIDE, PlanSettings, null_audio


class FrameEncoder(Protocol):
    """What `build_y` needs of the VAE: ``encode(video (B,3,T,H,W) in [-1,1]) -> (B,16,F,h,w)``."""

    def encode(self, video: torch.Tensor) -> torch.Tensor: ...


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


def build_y(vae: FrameEncoder, reference: torch.Tensor, length: int) -> torch.Tensor:
    """Image condition ``[mask, VAE(reference, zeros...)]``: (1, 20, F_lat, h, w).

    reference: (1, 3, 1, H, W) in [-1, 1]. A VAE with ``encode_reference(reference, length)`` (the same
    latent, bit for bit, reusing what does not depend on the reference: `model.network.vae.WanVAE`) is asked that.
    """
    encode_reference = getattr(vae, "encode_reference", None)
    if callable(encode_reference):
        lat = encode_reference(reference, length)  # (1, 16, F_lat, h, w)
    else:
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

    def shot_frames(self, settings: PlanSettings) -> int:
        if settings.plan == "official" or self.n_frames is None:
            return int(self.audio[0].shape[0])
        return self.n_frames
