"""The writer thread's paste of rendered pixels into the source's decoded planes
(`tasks.media.native.paste_changed`): batched over frames and threads, it must give every frame the
samples that frame gives pasted on its own, and leave every sample that covers an untouched pixel alone."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.media.native import PASTE_BATCH, native_layout, paste_changed


def _chunk(pix_fmt: str, h: int, w: int, t: int, seed: int):
    """Random source planes + RGB, and a rendering that changes a different box in each frame (one
    frame unchanged, one changed everywhere): (layout, native, source_rgb, rendered)."""
    rng = np.random.default_rng(seed)
    layout = native_layout(pix_fmt, "tv")
    native = rng.integers(0, 1 << layout.depth, (t, layout.frame_samples(h, w))).astype(layout.dtype)
    source = rng.integers(0, 256, (t, h, w, 3), dtype=np.uint8)
    rendered = source.copy()
    for k in range(t):
        if k == 1:
            continue  # untouched
        if k == 2:
            rendered[k] ^= 1  # every pixel
            continue
        y0, x0 = rng.integers(0, h - 4), rng.integers(0, w - 4)
        y1, x1 = y0 + rng.integers(1, h - y0), x0 + rng.integers(1, w - x0)
        rendered[k, y0:y1, x0:x1, rng.integers(0, 3)] ^= 8  # one channel of a box (odd edges)
    return layout, native, source, rendered


@pytest.mark.parametrize("pix_fmt", ["yuv420p", "yuv422p10le", "yuv444p"])
def test_batched_paste_equals_each_frame_pasted_alone(pix_fmt: str):
    h, w, t = 37, 51, 2 * PASTE_BATCH + 3
    layout, native, source, rendered = _chunk(pix_fmt, h, w, t, seed=7)
    alone = np.stack(
        [
            paste_changed(native[k : k + 1], rendered[k : k + 1], source[k : k + 1], layout, "bt709")[0]
            for k in range(t)
        ]
    )
    for workers in (1, 3):
        got = paste_changed(native, rendered, source, layout, "bt709", workers=workers)
        assert got.dtype == native.dtype
        np.testing.assert_array_equal(got, alone)


def test_only_samples_of_changed_pixels_move():
    h, w, t = 36, 50, 6
    layout, native, source, rendered = _chunk("yuv420p", h, w, t, seed=3)
    got = paste_changed(native, rendered, source, layout, None)
    changed = (rendered != source).any(axis=-1)  # (t, h, w)
    for k in range(t):
        gy, gu, gv = layout.planes(got[k], h, w)
        ny, nu, nv = layout.planes(native[k], h, w)
        np.testing.assert_array_equal(gy[~changed[k]], ny[~changed[k]])  # luma of untouched pixels
        whole = changed[k].reshape(h // 2, 2, w // 2, 2).all(axis=(1, 3))  # every covered pixel changed
        np.testing.assert_array_equal(gu[~whole], nu[~whole])
        np.testing.assert_array_equal(gv[~whole], nv[~whole])
    assert np.array_equal(got[1], native[1])  # the untouched frame, bit for bit
    assert not np.array_equal(got[2], native[2])  # the frame changed everywhere took the rendering
