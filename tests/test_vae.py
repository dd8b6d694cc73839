"""Wan VAE: causal streaming cache, shapes, errors, tiling (tiny golden weights, CPU float32).

Measured tiling error (tiny random-weight VAE, smooth inputs, relative to the untiled result,
mean |diff| / mean |ref|), 96/64 px tiles vs 128/96: single 96x160 frame, encode 5.0e-2 / 1.9e-2,
decode 2.0e-1 / 1.3e-1; 5-frame 96x160 video (2 latent frames), encode 3.7e-2 / 2.1e-2, decode
2.6e-1 / 1.3e-1. The mid-block self-attention spans the whole frame and
tiles zero-pad at their borders, so tiling is never exact; random weights overstate the error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model.checkpoint import CheckpointError
from model.network.tiling import TileSpec
from model.network.tiling import tiled_apply as _tiled
from model.network.vae import WanVAE, load_vae
from model.network.vae_net import CausalCache

WEIGHTS = Path(__file__).parent / "fixtures" / "parity" / "vae" / "weights" / "tiny_wan_vae.pth"


@pytest.fixture(scope="module")
def vae() -> WanVAE:
    return load_vae(WEIGHTS, dtype=torch.float32)


def _smooth(shape: tuple[int, ...], seed: int, factor: int) -> torch.Tensor:
    """Random field upsampled `factor`x (bicubic): smooth in space, independent per frame."""
    g = torch.Generator().manual_seed(seed)
    b, c, t, h, w = shape
    low = torch.randn(b * c, t, max(2, h // factor), max(2, w // factor), generator=g)
    return F.interpolate(low, size=(h, w), mode="bicubic", align_corners=False).reshape(shape)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _mean_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean() / b.abs().mean())


def test_shapes_image_and_video(vae):
    video = torch.rand(2, 3, 5, 16, 24) * 2 - 1
    lat = vae.encode(video)
    assert lat.shape == (2, 16, 2, 2, 3) and lat.dtype == torch.float32
    out = vae.decode(lat)
    assert out.shape == (2, 3, 5, 16, 24)
    assert out.min() >= -1 and out.max() <= 1
    image = torch.rand(1, 3, 1, 24, 40) * 2 - 1
    assert vae.encode(image).shape == (1, 16, 1, 3, 5)
    assert vae.decode(vae.encode(image)).shape == (1, 3, 1, 24, 40)


def test_decode_clamp_option(vae):
    z = torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0)) * 3
    raw = vae.decode(z, clamp=False)
    assert raw.abs().max() > 1  # random latents leave [-1, 1] somewhere
    torch.testing.assert_close(vae.decode(z), raw.clamp(-1, 1))


def test_encode_is_causal(vae):
    """Latent frame 0 depends only on video frame 0; frames 1..4 only on frames <= 4."""
    video = torch.rand(1, 3, 9, 16, 16) * 2 - 1
    full = vae.encode(video)
    assert _rel(vae.encode(video[:, :, :1]), full[:, :, :1]) < 1e-5
    assert _rel(vae.encode(video[:, :, :5]), full[:, :, :2]) < 1e-5
    changed = video.clone()
    changed[:, :, 5:] = 0
    assert _rel(vae.encode(changed)[:, :, :2], full[:, :, :2]) < 1e-5
    assert _rel(vae.encode(changed)[:, :, 2:], full[:, :, 2:]) > 1e-3


def test_stream_with_explicit_cache_equals_one_call(vae):
    video = torch.rand(1, 3, 9, 16, 16) * 2 - 1
    whole = vae.encode(video)
    cache = CausalCache()
    parts = [vae.encode(video[:, :, :1], cache=cache), vae.encode(video[:, :, 1:5], cache=cache)]
    parts.append(vae.encode(video[:, :, 5:], cache=cache))
    assert cache.started
    assert _rel(torch.cat(parts, dim=2), whole) < 1e-5

    z = whole
    dec_whole = vae.decode(z, clamp=False)
    cache = CausalCache()
    dec_parts = [
        vae.decode(z[:, :, :1], clamp=False, cache=cache),
        vae.decode(z[:, :, 1:], clamp=False, cache=cache),
    ]
    assert dec_parts[0].shape[2] == 1 and dec_parts[1].shape[2] == 8
    assert _rel(torch.cat(dec_parts, dim=2), dec_whole) < 1e-5


def test_no_state_kept_between_calls(vae):
    a = torch.rand(1, 3, 5, 8, 8) * 2 - 1
    b = torch.rand(1, 3, 5, 8, 8) * 2 - 1
    first = vae.encode(a)
    vae.encode(b)  # must not leak into the next call
    torch.testing.assert_close(vae.encode(a), first, rtol=0, atol=0)
    tensors_on_modules = [
        (name, key)
        for name, m in vae.model.named_modules()
        for key, v in vars(m).items()
        if isinstance(v, torch.Tensor) and not key.startswith("_")
    ]
    assert tensors_on_modules == []


def test_batch_equals_single(vae):
    video = torch.rand(2, 3, 5, 16, 24) * 2 - 1
    both = vae.encode(video)
    assert _rel(vae.encode(video[1:]), both[1:]) < 1e-5


def test_bad_inputs_raise(vae):
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        vae.encode(torch.zeros(1, 3, 6, 16, 16))
    with pytest.raises(ValueError, match="multiples of 8"):
        vae.encode(torch.zeros(1, 3, 5, 20, 16))
    with pytest.raises(ValueError, match="latent must be"):
        vae.decode(torch.zeros(1, 8, 2, 4, 4))
    with pytest.raises(ValueError, match="TileSpec"):
        TileSpec(tile=60, stride=32)


def test_blend_weights_are_a_partition_of_unity():
    """With a tile function that is exactly local, tiled == untiled, whatever the layout."""
    x = torch.randn(1, 2, 3, 40, 72)
    for tile, stride in [(16, 8), (24, 16), (32, 24), (40, 40)]:
        out = _tiled(lambda t: t * 2.0, x, tile, stride, 1, 2, 3)
        torch.testing.assert_close(out, x * 2.0)
        up = _tiled(lambda t: F.interpolate(t, scale_factor=(1, 8, 8)), x, tile, stride, 8, 2, 3)
        torch.testing.assert_close(up, F.interpolate(x, scale_factor=(1, 8, 8)))


def test_tiled_close_to_untiled_on_smooth_input(vae):
    video = torch.tanh(_smooth((1, 3, 1, 96, 160), 0, 16))  # one frame keeps the test fast
    z = _smooth((1, 16, 1, 12, 20), 1, 4)
    lat, dec = vae.encode(video), vae.decode(z, clamp=False)
    one = TileSpec(160, 160)  # a single tile is the untiled computation
    assert _rel(vae.encode(video, tiling=one), lat) == 0
    errors = {}
    for spec in (TileSpec(96, 64), TileSpec(128, 96)):
        enc_t = vae.encode(video, tiling=spec)
        dec_t = vae.decode(z, tiling=spec, clamp=False)
        assert enc_t.shape == lat.shape and dec_t.shape == dec.shape
        errors[spec.tile] = (_mean_rel(enc_t, lat), _mean_rel(dec_t, dec))
    # measured (see module docstring): encode 5.0e-2 / 1.9e-2, decode 2.0e-1 / 1.3e-1
    assert errors[96][0] < 0.07 and errors[128][0] < 0.03
    assert errors[96][1] < 0.3 and errors[128][1] < 0.2
    assert errors[128][0] < errors[96][0] and errors[128][1] < errors[96][1]  # more overlap, less error


def test_load_errors_name_file_and_key(tmp_path):
    state = torch.load(WEIGHTS, map_location="cpu", weights_only=True)
    renamed = dict(state)
    renamed["decoder.head.2.weightX"] = renamed.pop("decoder.head.2.weight")
    torch.save(renamed, tmp_path / "renamed.pth")
    with pytest.raises(CheckpointError, match=r"renamed\.pth.*decoder\.head\.2\.weight"):
        load_vae(tmp_path / "renamed.pth")
    data = WEIGHTS.read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.pth"):
        load_vae(tmp_path / "cut.pth")
    with pytest.raises(CheckpointError, match=r"absent\.pth"):
        load_vae(tmp_path / "absent.pth")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_float32_parity_and_bf16(monkeypatch):
    """On CUDA: float32 meets the golden tolerance (TF32 off); bf16 (model and activations) stays close."""
    from tests.parity.common import load_tensors

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    case = WEIGHTS.parent.parent / "encode_decode"
    inp, gold = load_tensors(case / "inputs.safetensors"), load_tensors(case / "outputs.safetensors")
    vae32 = load_vae(WEIGHTS, dtype=torch.float32, device="cuda")
    assert _rel(vae32.encode(inp["video"][None].cuda())[0], gold["enc_video"].cuda()) < 1e-4
    assert (
        _rel(vae32.decode(inp["z_video"][None].cuda(), clamp=False)[0], gold["dec_video_unclamped"].cuda())
        < 1e-4
    )
    vae16 = load_vae(WEIGHTS, dtype=torch.bfloat16, device="cuda")
    enc = vae16.encode(inp["video"][None].cuda())[0]
    dec = vae16.decode(inp["z_video"][None].cuda(), clamp=False)[0]
    assert enc.dtype == dec.dtype == torch.float32
    assert _rel(enc, gold["enc_video"].cuda()) < 5e-2  # measured upstream: ~2e-2
    assert _rel(dec, gold["dec_video_unclamped"].cuda()) < 1.5e-1  # measured upstream: ~6e-2
    tiled = vae16.decode(inp["z_video"][None].cuda(), tiling=TileSpec(32, 16))
    assert tiled.shape == (1, 3, 9, 64, 64) and torch.isfinite(tiled).all()
