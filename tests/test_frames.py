"""Frame decoding (frame-exact seeks), lossless intermediates, and the model geometry."""

from __future__ import annotations

import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.errors import DecodeError
from tasks.media.ffmpeg import ffmpeg_exe
from tasks.media.frames import FrameCursor, LosslessWriter, iter_frames, read_frames
from tasks.media.probe import probe
from tasks.picture.geometry import (
    CropGeometry,
    ModelGeometry,
    choose_bucket,
    resize_and_centercrop,
    resize_and_centercrop_tensor,
)
from tests.media import decode_all, make_clip, run_ffmpeg, shot_frames


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("h264.mp4", {"lengths": (20, 17, 23), "gop": 7}),  # B-frames, keyframes every 7
        ("h264.mkv", {"lengths": (20, 17, 23), "gop": 9, "fps": "30000/1001"}),  # 1 ms timestamps
        ("vfr.mkv", {"lengths": (25, 25), "vfr_split": (25, "60")}),  # VFR: select by index
        ("offset.ts", {"lengths": (20, 17, 23), "gop": 7, "audio_channels": 2}),  # MPEG-TS: inexact seeks
    ],
)
def test_seek_is_frame_exact(tmp_path: Path, name: str, kwargs: dict):
    kwargs = {"audio_channels": None, **kwargs}
    if name.endswith(".ts"):  # audio starts before video, all timestamps offset by ~4.4 s
        base = make_clip(tmp_path / "base.mp4", **kwargs)
        clip = tmp_path / name
        run_ffmpeg(["-i", str(base), "-c", "copy", "-output_ts_offset", "3", str(clip)])
    else:
        clip = make_clip(tmp_path / name, **kwargs)
    info = probe(clip)
    assert info.seek_offset_s > 0.01 if name.endswith(".ts") else info.seek_offset_s == 0
    every = np.stack(list(iter_frames(info)))
    assert every.shape[0] == info.frame_count
    rng = np.random.default_rng(1)
    ranges = [(0, 1), (info.frame_count - 1, info.frame_count)]
    ranges += [tuple(sorted(rng.integers(0, info.frame_count + 1, 2))) for _ in range(6)]
    for a, b in ranges:
        got = list(iter_frames(info, int(a), int(b)))
        assert len(got) == b - a
        if got:
            assert np.array_equal(np.stack(got), every[a:b]), (name, a, b)
    picks = read_frames(info, [5, 31, 5])
    assert sorted(picks) == [5, 31] and np.array_equal(picks[31], every[31])


def test_decode_stays_coded_and_downscales(tmp_path: Path):
    info = probe(make_clip(tmp_path / "r.mp4", rotation=90, sar="4/3", audio_channels=None))
    frame = next(iter_frames(info))
    assert frame.shape == (72, 128, 3)  # coded size, not rotated, not SAR-stretched
    small = next(iter_frames(info, width=64, pix_fmt="bgr24"))
    assert small.shape == (36, 64, 3)
    with pytest.raises(ValueError):
        next(iter_frames(info, 0, info.frame_count + 1))


def test_rotation_matches_ffmpeg_autorotate(tmp_path: Path):
    for rot in (90, 180, 270):
        clip = make_clip(tmp_path / f"r{rot}.mp4", (3,), rotation=rot, audio_channels=None)
        info = probe(clip)
        r = subprocess.run(
            [
                ffmpeg_exe(),
                "-v",
                "error",
                "-i",
                str(clip),
                "-frames:v",
                "1",
                "-f",
                "rawvideo",
                "-pix_fmt",
                "rgb24",
                "-",
            ],
            capture_output=True,
            check=True,
        )
        geo = ModelGeometry.for_video(info)
        disp = geo.to_display(next(iter_frames(info)))
        assert np.array_equal(np.frombuffer(r.stdout, np.uint8).reshape(disp.shape), disp)
        assert np.array_equal(geo.to_coded(disp), next(iter_frames(info)))


def test_bucket_choice_and_crop_geometry():
    assert choose_bucket(1080, 1920, "480") == ("0.50", (448, 896))
    assert choose_bucket(1920, 1080, "720") == ("1.82", (1280, 704))
    assert choose_bucket(544, 1280, "720") == ("0.45", (640, 1408))
    g = CropGeometry.cover((544, 1280), (640, 1408))
    assert (g.scaled_hw, g.top, g.left) == ((640, 1506), 0, 49)
    y0, y1, x0, x1 = g.source_window()
    assert (y0, y1) == (0, 544) and x0 == round(49 * 1280 / 1506)


def test_resize_and_centercrop_shapes_and_tensor_path():
    img = (np.arange(90 * 160 * 3) % 251).astype(np.uint8).reshape(90, 160, 3)
    out = resize_and_centercrop(img, (36, 48))
    assert out.shape == (36, 48, 3) and out.dtype == np.uint8
    mask = torch.zeros(1, 90, 160)
    mask[:, 30:60, 40:120] = 1
    m = resize_and_centercrop_tensor(mask, (36, 48))
    assert m.shape == (1, 36, 48) and set(m.unique().tolist()) == {0.0, 1.0}


def test_model_geometry_round_trip_keeps_outside_pixels(tmp_path: Path):
    info = probe(make_clip(tmp_path / "s.mp4", sar="4/3", audio_channels=None))
    geo = ModelGeometry.for_video(info, "480")
    assert geo.display_hw == (72, 171) and geo.bucket == "0.38" and geo.model_hw == (384, 1024)
    src = next(iter_frames(info))
    gen = np.full((*geo.model_hw, 3), 7, np.uint8)
    back = geo.from_model(gen, src)
    assert back.shape == src.shape
    y0, y1, x0, x1 = geo.coded_window()
    assert np.all(back[y0:y1, x0:x1] == 7)
    outside = np.ones(src.shape[:2], bool)
    outside[y0:y1, x0:x1] = False
    assert outside.any() and np.array_equal(back[outside], src[outside])
    # with rotation the window is found in coded coordinates too
    rinfo = probe(make_clip(tmp_path / "r.mp4", rotation=90, audio_channels=None))
    rgeo = ModelGeometry.for_video(rinfo, "480")
    assert rgeo.display_hw == (128, 72) and rgeo.model_hw == (832, 448)
    rsrc = next(iter_frames(rinfo))
    rback = rgeo.from_model(np.full((*rgeo.model_hw, 3), 9, np.uint8), rsrc)
    ry0, ry1, rx0, rx1 = rgeo.coded_window()
    # the 468-wide resized display is cropped to 448: display columns 2..70 = coded rows 2..70
    assert (ry0, ry1, rx0, rx1) == (2, 70, 0, 128)
    assert (
        np.all(rback[2:70] == 9)
        and np.array_equal(rback[:2], rsrc[:2])
        and np.array_equal(rback[70:], rsrc[70:])
    )
    # round trip of the source itself through the model stays close
    assert np.abs(geo.from_model(geo.to_model(src), src).astype(int) - src).mean() < 12


def test_lossless_writer_round_trip_and_atomicity(tmp_path: Path):
    frames = shot_frames((5, 4), (64, 36))
    out = tmp_path / "i.mkv"
    with LosslessWriter(out, (36, 64), Fraction(24000, 1001)) as w:
        w.write(frames[:3])
        w.write(frames[3])
        w.write(list(frames[4:]))
    assert w.count == 9 and np.array_equal(decode_all(out), frames)
    assert probe(out).fps == Fraction(24000, 1001)
    bad = tmp_path / "bad.mkv"
    with pytest.raises(RuntimeError), LosslessWriter(bad, (36, 64), Fraction(25)) as w:
        w.write(frames[:2])
        raise RuntimeError("backend crashed")
    assert not bad.exists() and list(tmp_path.glob(".bad*")) == []


def test_frame_cursor_lookback(tmp_path: Path):
    info = probe(make_clip(tmp_path / "c.mp4", (30,), audio_channels=None))
    every = decode_all(tmp_path / "c.mp4")
    cur = FrameCursor(info, 4, 30, lookback=5)
    assert np.array_equal(cur.range(10, 14), every[10:14])
    assert np.array_equal(cur.get(9), every[9])  # inside the look-back window
    with pytest.raises(IndexError):
        cur.get(4)
    cur.close()


def test_short_decode_is_an_error(tmp_path: Path):
    info = probe(make_clip(tmp_path / "c.mp4", (10,), audio_channels=None))
    lying = type(info).from_dict({**info.to_dict(), "frame_count": 12})
    with pytest.raises(DecodeError, match="c.mp4: decoded 2 frames"):
        list(iter_frames(lying, 8, 12))
