"""Delivery like post-production (issue 27): intermediates in the source's own pixel format, so a
skipped shot and every pixel outside a dubbed crop are the source's decoded values bit for bit in a
`lossless` deliverable (ffmpeg framemd5), within the codec's normal error in `web`; `mezzanine` is
ProRes 422 HQ / DNxHR HQX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from tasks.config.pipeline import load_config
from tasks.errors import MediaError, OutputError
from tasks.media import ffmpeg
from tasks.media.assemble import assemble
from tasks.media.frames import iter_frames, iter_native
from tasks.media.native import native_layout, rgb_to_planes
from tasks.media.probe import probe
from tasks.media.profiles import check_size
from tasks.render.shot import ShotJob, render_shot_result
from tests.media import make_audio, make_clip, psnr, run_ffmpeg
from tests.test_local_flow import _job

BOX = (37, 21, 91, 55)  # x0, y0, x1, y1 in coded pixels: odd edges straddle chroma samples


def framemd5(path: Path, pix_fmt: str) -> list[str]:
    """ffmpeg's per-frame MD5 of the first video stream decoded to `pix_fmt` (no scaling)."""
    lines = ffmpeg.read_lines(
        ["-v", "error", "-i", str(path), "-map", "0:v:0", "-pix_fmt", pix_fmt, "-f", "framemd5", "-"],
        path=path,
    )
    return [ln.split(",")[-1].strip() for ln in lines if ln and not ln.startswith("#")]


def _source(tmp: Path, kind: str, size: tuple[int, int] = (128, 72)) -> Path:
    """A 3-shot film: h264 yuv420p tagged BT.709, or ProRes 422 HQ (yuv422p10le) as a camera master."""
    base = make_clip(tmp / "base.mp4", (10, 8, 12), size=size, audio_channels=None)
    if kind == "h264_709":
        out = tmp / "film709.mp4"
        run_ffmpeg(["-i", str(base), "-c:v", "libx264", "-crf", "20", "-g", "12", "-pix_fmt", "yuv420p",
                    "-colorspace", "bt709", "-color_primaries", "bt709", "-color_trc", "bt709", str(out)])  # fmt: skip
        return out
    out = tmp / "master.mov"
    run_ffmpeg(["-i", str(base), "-c:v", "prores_ks", "-profile:v", "3", "-pix_fmt", "yuv422p10le", str(out)])
    return out


@pytest.mark.parametrize("kind", ["h264_709", "prores_422_10bit"])
def test_a_lossless_dry_run_is_the_source_bit_for_bit(kind: str, tmp_path: Path, capsys):
    src = _source(tmp_path, kind)
    info = probe(src)
    assert info.pix_fmt == ("yuv420p" if kind == "h264_709" else "yuv422p10le")
    dub = make_audio(tmp_path / "dub.wav", info.video_duration_s)
    out = tmp_path / "renders" / "film.mkv"
    rc = main(["dub", str(src), "--audio", str(dub), "--out", str(out), "--no-prefect", "--backend", "passthrough",
               "--set", "encode.profile=lossless", "--set", f"workspace.root={tmp_path / 'ws'}"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    o = probe(out)
    assert (o.codec, o.pix_fmt, o.frame_count) == ("ffv1", info.pix_fmt, 30)
    assert framemd5(out, info.pix_fmt) == framemd5(src, info.pix_fmt)  # every frame of every (skipped) shot
    assert o.audio and o.audio[0].sample_rate == 16000


class CropBackend:
    """Changes only a box of each frame, like the region paste-back (a test double for a dubbed crop)."""

    name = "crop"
    applies_color = True

    def open_shot(self, plan, geometry, shot_audio, sample_rate, *, resume_state=None):
        class Session:
            def dub_chunk(self, inp):
                out = np.array(inp.frames)
                x0, y0, x1, y1 = BOX
                out[:, y0:y1, x0:x1] = 255 - out[:, y0:y1, x0:x1]
                return out

            def state(self):
                return None

            def close(self):
                pass

        return Session()


def decode(path: Path) -> np.ndarray:
    return np.stack(list(iter_frames(probe(path))))


def _crop_render(tmp: Path, src: Path) -> tuple[ShotJob, dict]:
    job = _job(tmp, src, [])
    return job, render_shot_result(job, backend=CropBackend())


def _outside(layout, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the luma and chroma samples that cover no pixel of BOX."""
    x0, y0, x1, y1 = BOX
    luma = np.ones((h, w), bool)
    luma[y0:y1, x0:x1] = False
    ch, cw = layout.chroma_hw(h, w)
    chroma = np.ones((ch, cw), bool)
    chroma[y0 // layout.sy : -(-y1 // layout.sy), x0 // layout.sx : -(-x1 // layout.sx)] = False
    return luma, chroma


@pytest.mark.parametrize("kind", ["h264_709", "prores_422_10bit"])
def test_pixels_outside_a_dubbed_crop_stay_the_source_in_lossless_and_close_in_web(kind: str, tmp_path: Path):
    src = _source(tmp_path, kind)
    info = probe(src)
    layout = native_layout(info.pix_fmt, info.color_range)
    job, result = _crop_render(tmp_path, src)
    lossless = assemble(info, [result["path"]], tmp_path / "l.mkv", load_config(overrides=["encode.profile=lossless"]).encode,
                        audio=None, workdir=tmp_path / "w", records=[result["file"]])  # fmt: skip
    h, w = info.height, info.width
    luma, chroma = _outside(layout, h, w)
    x0, y0, x1, y1 = BOX
    for got, want in zip(iter_native(probe(lossless)), iter_native(info), strict=True):
        gy, gu, gv = layout.planes(got, h, w)
        sy, su, sv = layout.planes(want, h, w)
        assert np.array_equal(gy[luma], sy[luma]) and np.array_equal(gu[chroma], su[chroma])
        assert np.array_equal(gv[chroma], sv[chroma])
        assert np.abs(gy[y0:y1, x0:x1].astype(int) - sy[y0:y1, x0:x1]).mean() > 10 * (1 << (layout.depth - 8))
    # the crop itself: the backend's RGB, within the Y'CbCr quantisation of the source's format
    dubbed = np.stack(list(iter_frames(probe(lossless))))[:, y0 + 2 : y1 - 2, x0 + 2 : x1 - 2]
    wanted = 255 - np.stack(list(iter_frames(info)))[:, y0 + 2 : y1 - 2, x0 + 2 : x1 - 2]
    assert psnr(dubbed, wanted) > 30
    web = assemble(info, [result["path"]], tmp_path / "web.mp4", load_config(overrides=["encode.preset=veryfast"]).encode,
                   audio=None, workdir=tmp_path / "w", records=[result["file"]])  # fmt: skip
    direct = tmp_path / "direct.mp4"  # the codec's normal error: the source itself encoded the same way
    run_ffmpeg(
        [
            "-i",
            str(src),
            "-c:v",
            "libx264",
            "-crf",
            "18",
            "-preset",
            "veryfast",
            "-pix_fmt",
            "yuv420p",
            str(direct),
        ]
    )
    far = np.ones((h, w), bool)  # a lossy codec smears the crop's edge into its neighbours: 16 px away
    far[max(0, y0 - 16) : y1 + 16, max(0, x0 - 16) : x1 + 16] = False
    want = np.stack(list(iter_frames(info)))[:, far]
    ours, theirs = psnr(decode(web)[:, far], want), psnr(decode(direct)[:, far], want)
    assert ours > theirs - 0.5 and ours > 25, (ours, theirs)


def test_mezzanine_profiles_are_prores_hq_and_dnxhr_hqx(tmp_path: Path):
    src = _source(tmp_path, "h264_709", size=(256, 144))  # DNxHR's smallest frame is 256x120
    info = probe(src)
    _, result = _crop_render(tmp_path, src)
    for mezz, codec_line, codec_args in (
        ("prores_hq", "prores (HQ)", ["-c:v", "prores_ks", "-profile:v", "3"]),
        ("dnxhr_hqx", "dnxhd (DNXHR HQX)", ["-c:v", "dnxhd", "-profile:v", "dnxhr_hqx"]),
    ):
        cfg = load_config(overrides=["encode.profile=mezzanine", f"encode.mezzanine={mezz}"]).encode
        out = assemble(info, [result["path"]], tmp_path / f"{mezz}.mov", cfg, audio=None, workdir=tmp_path / "w",
                       records=[result["file"]])  # fmt: skip
        o = probe(out)
        assert (o.pix_fmt, o.frame_count, o.color_space) == ("yuv422p10le", 30, "bt709")
        _, err = ffmpeg.run(["-i", out], path=out, check=False)
        assert codec_line in err, err
        direct = tmp_path / f"direct_{mezz}.mov"  # the codec's own error: the intermediate encoded by hand
        run_ffmpeg(["-i", result["path"], *codec_args, "-pix_fmt", "yuv422p10le", str(direct)])
        inter = decode(Path(result["path"]))
        assert psnr(decode(out), inter) > psnr(decode(direct), inter) - 0.5
    (tmp_path / "small").mkdir()
    small = probe(_source(tmp_path / "small", "h264_709"))
    with pytest.raises(MediaError, match=r"128x72 is below DNxHR's 256x120 minimum"):
        check_size(load_config(overrides=["encode.profile=mezzanine", "encode.mezzanine=dnxhr_hqx"]).encode,
                   small.path, small.width, small.height)  # fmt: skip
    with pytest.raises(OutputError, match=r"encode.profile=lossless is written as .mkv, not .mp4"):
        assemble(info, [result["path"]], tmp_path / "x.mp4", load_config(overrides=["encode.profile=lossless"]).encode,
                 audio=None, workdir=tmp_path / "w")  # fmt: skip


@pytest.mark.parametrize("kind", ["h264_709", "prores_422_10bit"])
def test_changed_pixels_are_converted_with_the_matrix_the_film_decodes_with(kind: str, tmp_path: Path):
    """The RGB ffmpeg decodes an untouched frame to, converted back, lands on the source's own samples."""
    info = probe(_source(tmp_path, kind))
    layout = native_layout(info.pix_fmt, info.color_range)
    scale = 1 << (layout.depth - 8)
    for rgb, native in zip(iter_frames(info, 0, 4), iter_native(info, 0, 4), strict=True):
        planes = rgb_to_planes(rgb, layout, info.color_space)
        for got, want in zip(planes, layout.planes(native, info.height, info.width), strict=True):
            assert np.abs(got - want).mean() < 1.5 * scale  # another matrix misses by ~3-8 code values
