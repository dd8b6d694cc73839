"""Per-chunk colour correction: Lab mean/std transfer towards a reference frame, blended by strength.

Generated chunks drift in colour; InfiniteTalk pulls every decoded chunk back towards a reference
image. This is the same transfer (sRGB D65 -> CIE Lab, per-channel mean/std match, back to sRGB,
linear blend with the input) done for a whole chunk at once in torch, in float64 like
scikit-image's `rgb2lab`/`lab2rgb`, so it runs on the GPU next to the sampler and has no per-frame
Python loop. `match_and_blend` is imported by the model sampler; keep its signature stable.
"""

from __future__ import annotations

import torch

__all__ = ["match_and_blend", "rgb_to_lab", "lab_to_rgb"]

# sRGB (D65) <-> CIE XYZ, the matrix scikit-image uses, and the D65 / 2-degree white point.
_XYZ_FROM_RGB = (
    (0.412453, 0.357580, 0.180423),
    (0.212671, 0.715160, 0.072169),
    (0.019334, 0.119193, 0.950227),
)
_WHITE_D65 = (0.95047, 1.0, 1.08883)
# Frames per vectorised block: bounds float64 temporaries for long chunks (81 x 720p x 3 x 8 B each).
_BLOCK_FRAMES = 32


def _consts(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = torch.tensor(_XYZ_FROM_RGB, dtype=torch.float64, device=device)
    white = torch.tensor(_WHITE_D65, dtype=torch.float64, device=device)
    return m, torch.linalg.inv(m), white


def rgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """sRGB in [0, 1], channels last `(..., 3)` -> CIE Lab (D65), float64."""
    m, _, white = _consts(rgb.device)
    x = rgb.to(torch.float64)
    lin = torch.where(x > 0.04045, ((x + 0.055) / 1.055).pow(2.4), x / 12.92)
    t = (lin @ m.T) / white  # (..., 3) XYZ relative to the white point
    f = torch.where(t > 0.008856, t.clamp_min(0.0).pow(1.0 / 3.0), 7.787 * t + 16.0 / 116.0)
    fx, fy, fz = f.unbind(-1)
    return torch.stack((116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)), dim=-1)


def lab_to_rgb(lab: torch.Tensor) -> torch.Tensor:
    """CIE Lab (D65), channels last `(..., 3)` -> sRGB clipped to [0, 1], float64.

    Like scikit-image, a negative z (out-of-gamut b) is clamped to 0 before the inverse transfer.
    """
    _, m_inv, white = _consts(lab.device)
    lab = lab.to(torch.float64)
    fy = (lab[..., 0] + 16.0) / 116.0
    fx = lab[..., 1] / 500.0 + fy
    fz = (fy - lab[..., 2] / 200.0).clamp_min(0.0)
    f = torch.stack((fx, fy, fz), dim=-1)
    t = torch.where(f > 0.2068966, f.pow(3), (f - 16.0 / 116.0) / 7.787)
    lin = (t * white) @ m_inv.T
    srgb = torch.where(lin > 0.0031308, 1.055 * lin.clamp_min(0.0031308).pow(1.0 / 2.4) - 0.055, lin * 12.92)
    return srgb.clamp(0.0, 1.0)


def _as_batched_reference(reference: torch.Tensor, batch: int) -> torch.Tensor:
    """Accept (3,H,W), (3,1,H,W) or (B,3,1,H,W); return (B,3,1,H,W)."""
    if reference.dim() == 3:
        reference = reference.unsqueeze(1)
    if reference.dim() == 4:
        reference = reference.unsqueeze(0)
    if reference.dim() != 5 or reference.shape[1] != 3 or reference.shape[2] != 1:
        raise ValueError(f"reference must be (3,H,W), (3,1,H,W) or (B,3,1,H,W), got {tuple(reference.shape)}")
    if reference.shape[0] not in (1, batch):
        raise ValueError(f"reference batch {reference.shape[0]} does not match video batch {batch}")
    return reference.expand(batch, -1, -1, -1, -1)


def match_and_blend(video: torch.Tensor, reference: torch.Tensor, strength: float) -> torch.Tensor:
    """Colour-match `video` to `reference` in Lab and blend: `(1 - s) * video + s * matched`.

    video: (3,T,H,W) or (B,3,T,H,W) in [-1, 1]; reference: (3,H,W), (3,1,H,W) or (B,3,1,H,W) in
    [-1, 1] (its size may differ from the video's: only its Lab statistics are used).
    Per frame and per Lab channel: `(x - mean_x) * std_ref / std_x + mean_ref` with population
    std over the frame's pixels; a flat channel (std 0) becomes `mean_ref`. Returns the same
    shape and dtype; strength 0 returns `video` itself; strength outside [0, 1] raises ValueError.
    """
    if strength == 0.0:
        return video
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"colour strength must be in [0, 1], got {strength}")
    if video.dim() not in (4, 5) or video.shape[-4] != 3:
        raise ValueError(f"video must be (3,T,H,W) or (B,3,T,H,W), got {tuple(video.shape)}")
    batched = video.dim() == 5
    v = video if batched else video.unsqueeze(0)  # (B, 3, T, H, W)
    ref = _as_batched_reference(reference.to(v.device), v.shape[0])

    ref01 = ((ref.to(torch.float64) + 1.0) / 2.0).clamp(0.0, 1.0)
    ref_lab = rgb_to_lab(ref01.permute(0, 2, 3, 4, 1))  # (B, 1, H, W, 3)
    ref_mean = ref_lab.mean(dim=(2, 3), keepdim=True)  # (B, 1, 1, 1, 3)
    ref_std = ref_lab.std(dim=(2, 3), keepdim=True, correction=0)

    out = torch.empty_like(v)
    for t0 in range(0, v.shape[2], _BLOCK_FRAMES):
        blk = v[:, :, t0 : t0 + _BLOCK_FRAMES]
        src01 = ((blk.to(torch.float64) + 1.0) / 2.0).clamp(0.0, 1.0).permute(0, 2, 3, 4, 1)  # (B,T,H,W,3)
        lab = rgb_to_lab(src01)
        mean = lab.mean(dim=(2, 3), keepdim=True)  # (B, T, 1, 1, 3)
        std = lab.std(dim=(2, 3), keepdim=True, correction=0)
        flat = std == 0
        scale = torch.where(
            flat, torch.zeros_like(std), ref_std / torch.where(flat, torch.ones_like(std), std)
        )
        matched = torch.where(flat, ref_mean.expand_as(lab), (lab - mean) * scale + ref_mean)
        rgb = lab_to_rgb(matched)
        blended = (1.0 - strength) * src01 + strength * rgb
        out[:, :, t0 : t0 + _BLOCK_FRAMES] = (blended * 2.0 - 1.0).permute(0, 4, 1, 2, 3).to(v.dtype)
    return out if batched else out.squeeze(0)
