"""Colour transfer: agreement with a per-frame scikit-image reference, shapes, dtypes, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.picture import color
from tasks.picture.color import lab_to_rgb, match_and_blend, rgb_to_lab


def _skimage_reference(video: np.ndarray, ref: np.ndarray, strength: float) -> np.ndarray:
    """Per-frame Lab mean/std transfer with scikit-image in float64: (3,T,H,W), (3,H,W) in [-1,1]."""
    skcolor = pytest.importorskip("skimage.color")
    src = np.clip((video.transpose(1, 2, 3, 0).astype(np.float64) + 1) / 2, 0, 1)
    ref_lab = skcolor.rgb2lab(np.clip((ref.transpose(1, 2, 0).astype(np.float64) + 1) / 2, 0, 1))
    out = []
    for frame in src:
        lab = skcolor.rgb2lab(frame)
        for c in range(3):
            m, s = lab[..., c].mean(), lab[..., c].std()
            mr, sr = ref_lab[..., c].mean(), ref_lab[..., c].std()
            lab[..., c] = mr if s == 0 else (lab[..., c] - m) * (sr / s) + mr
        out.append((1 - strength) * frame + strength * np.clip(skcolor.lab2rgb(lab), 0, 1))
    return (np.stack(out) * 2 - 1).transpose(3, 0, 1, 2)


def test_lab_conversions_match_scikit_image():
    skcolor = pytest.importorskip("skimage.color")
    rgb = np.random.default_rng(0).random((7, 9, 3))
    lab = rgb_to_lab(torch.from_numpy(rgb)).numpy()
    np.testing.assert_allclose(lab, skcolor.rgb2lab(rgb), atol=1e-10)
    lab2 = lab * np.array([1.1, 1.6, 1.6])  # push some colours out of gamut
    np.testing.assert_allclose(
        lab_to_rgb(torch.from_numpy(lab2)).numpy(), np.clip(skcolor.lab2rgb(lab2), 0, 1), atol=1e-10
    )


@pytest.mark.parametrize("strength", [0.3, 1.0])
def test_matches_per_frame_reference(strength: float):
    g = torch.Generator().manual_seed(3)
    video = torch.rand(3, 5, 12, 20, generator=g) * 1.6 - 0.9
    video[:, 2] = video[:, 2] * 0.2 + 0.5  # a low-contrast frame
    ref = torch.rand(3, 12, 20, generator=g) * 2 - 1
    got = match_and_blend(video, ref, strength)
    want = _skimage_reference(video.numpy(), ref.numpy(), strength)
    assert got.dtype == torch.float32 and got.shape == video.shape
    assert np.abs(got.double().numpy() - want).max() < 1e-6


def test_shapes_batches_and_reference_layouts():
    g = torch.Generator().manual_seed(0)
    video = torch.rand(2, 3, 4, 8, 10, generator=g) * 2 - 1
    refs = torch.rand(2, 3, 1, 8, 10, generator=g) * 2 - 1
    batched = match_and_blend(video, refs, 0.7)
    for b in range(2):
        single = match_and_blend(video[b], refs[b], 0.7)  # (3,T,H,W) with a (3,1,H,W) reference
        assert torch.allclose(batched[b], single, atol=1e-7)
        assert torch.equal(match_and_blend(video[b], refs[b, :, 0], 0.7), single)  # (3,H,W) reference
    # a reference of another size only contributes its statistics
    small_ref = torch.nn.functional.interpolate(refs[0], size=(4, 5), mode="nearest")[:, 0]
    assert match_and_blend(video[0], small_ref, 1.0).shape == video[0].shape
    with pytest.raises(ValueError, match="reference must be"):
        match_and_blend(video, refs[:, :2], 1.0)  # two channels
    with pytest.raises(ValueError, match="batch"):
        match_and_blend(video, torch.cat([refs, refs[:1]]), 1.0)
    with pytest.raises(ValueError, match="strength"):
        match_and_blend(video, refs, 1.5)
    assert match_and_blend(video, refs, 0.0) is video


def test_long_chunks_are_processed_in_blocks_identically(monkeypatch):
    g = torch.Generator().manual_seed(1)
    video = torch.rand(3, 7, 6, 8, generator=g) * 2 - 1
    ref = torch.rand(3, 1, 6, 8, generator=g) * 2 - 1
    whole = match_and_blend(video, ref, 1.0)
    monkeypatch.setattr(color, "_BLOCK_FRAMES", 3)
    assert torch.equal(match_and_blend(video, ref, 1.0), whole)


def test_statistics_transfer_and_flat_channels():
    # a mid-grey reference and a colourful frame: full strength moves the frame's Lab mean to the reference's
    g = torch.Generator().manual_seed(5)
    video = torch.rand(3, 1, 16, 16, generator=g) * 0.5 - 0.25
    ref = torch.full((3, 16, 16), 0.1) + torch.rand(3, 16, 16, generator=g) * 0.2
    out = match_and_blend(video, ref, 1.0)
    lab_out = rgb_to_lab((out[:, 0].permute(1, 2, 0).double() + 1) / 2)
    lab_ref = rgb_to_lab((ref.permute(1, 2, 0).double() + 1) / 2)
    assert torch.allclose(lab_out.mean(dim=(0, 1)), lab_ref.mean(dim=(0, 1)), atol=0.05)
    flat = torch.zeros(3, 2, 4, 4)  # every channel flat: each becomes the reference mean
    out_flat = match_and_blend(flat, ref, 1.0)
    assert torch.allclose(out_flat[:, 0], out_flat[:, 0, :1, :1].expand(3, 4, 4))
    assert torch.isfinite(out_flat).all()


def test_dtype_is_preserved():
    video = (torch.rand(3, 2, 8, 8) * 2 - 1).to(torch.bfloat16)
    out = match_and_blend(video, torch.zeros(3, 8, 8), 0.5)
    assert out.dtype == torch.bfloat16 and out.shape == video.shape
