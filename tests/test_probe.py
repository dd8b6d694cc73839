"""Probe: pure parsers on saved ffmpeg text, then real small files."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from tasks.errors import MediaNotFound, NotAMediaFile, NoVideoStream, TruncatedMedia
from tasks.media.probe import (
    VideoInfo,
    frame_rate_from_pts,
    max_keyframe_interval,
    normalise_rotation,
    parse_ffmpeg_info,
    parse_framecrc,
    parse_progress_frames,
    probe,
    split_top_level,
)
from tests.media import make_audio, make_clip

# Saved stderr of `ffmpeg -hide_banner -i FILE` (bundled ffmpeg 9.0.2).
MP4_ROTATED_BT709 = """Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'bt2.mp4':
  Metadata:
    major_brand     : isom
    encoder         : Lavf63.1.102
  Duration: 00:00:01.00, start: 0.000000, bitrate: 120 kb/s
  Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(tv, bt709/unknown/unknown, progressive), 128x72 [SAR 4:3 DAR 64:27], 111 kb/s, 25 fps, 25 tbr, 12800 tbn (default)
    Metadata:
      handler_name    : VideoHandler
      encoder         : Lavc63.1.102 libx264
    Side data:
      Display Matrix: rotation of -90.00 degrees
At least one output file must be specified
"""

MP4_51 = """Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'f51.mp4':
  Duration: 00:00:02.00, start: 0.000000, bitrate: 328 kb/s
  Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(progressive), 128x72 [SAR 1:1 DAR 16:9], 138 kb/s, 29.97 fps, 29.97 tbr, 30k tbn (default)
    Metadata:
      handler_name    : VideoHandler
  Stream #0:1[0x2](fra): Audio: aac (LC) (mp4a / 0x6134706D), 48000 Hz, 5.1, fltp, 173 kb/s (default)
    Metadata:
      handler_name    : SoundHandler
At least one output file must be specified
"""

WEBM_VP9 = """Input #0, matroska,webm, from 'vp9.webm':
  Metadata:
    ENCODER         : Lavf63.1.102
  Duration: 00:00:01.00, start: 0.000000, bitrate: 148 kb/s
  Stream #0:0: Video: vp9 (Profile 0), yuv420p(tv, progressive), 128x72, SAR 1:1 DAR 16:9, 25 fps, 25 tbr, 1k tbn
    Metadata:
      ENCODER         : Lavc63.1.102 libvpx-vp9
      DURATION        : 00:00:01.000000000
  Stream #0:1(spa): Audio: opus, 48000 Hz, stereo, fltp (default)
At least one output file must be specified
"""

AUDIO_ONLY = """Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'audio_only.m4a':
  Duration: 00:00:01.00, start: 0.000000, bitrate: 79 kb/s
  Stream #0:0[0x1](und): Audio: aac (LC) (mp4a / 0x6134706D), 48000 Hz, mono, fltp, 70 kb/s (default)
At least one output file must be specified
"""

NOT_MEDIA = """[in#0 @ 0x5619de694cc0] Error opening input: Invalid data found when processing input
Error opening input file notvideo.mp4.
Error opening input files: Invalid data found when processing input
"""

MOOV_MISSING = """[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55] moov atom not found
[in#0 @ 0x55] Error opening input: Invalid data found when processing input
Error opening input file t3.mp4.
"""

MISSING = """[in#0 @ 0x5619de694cc0] Error opening input: No such file or directory
Error opening input file /nonexist.mp4.
Error opening input files: No such file or directory
"""

FRAMECRC_MP4 = """#extradata 0:       45, 0x444b1065
#software: Lavf63.1.102
#tb 0: 1/24000
#media_type 0: video
#codec_id 0: h264
#dimensions 0: 128x72
#sar 0: 1/1
0,      -2002,          0,     1001,     2497, 0x117b822f
0,      -1001,       4004,     1001,      512, 0x1, F=0x0
0,          0,       2002,     1001,      100, 0x2, F=0x0
0,       1001,       1001,     1001,      100, 0x3, F=0x0
0,       2002,       3003,     1001,      100, 0x4, F=0x0
"""


def test_split_top_level_keeps_parenthesised_commas():
    parts = split_top_level(
        "h264 (High) (avc1 / 0x31), yuv420p(tv, bt709, progressive), 128x72 [SAR 1:1 DAR 16:9], 25 fps"
    )
    assert parts == [
        "h264 (High) (avc1 / 0x31)",
        "yuv420p(tv, bt709, progressive)",
        "128x72 [SAR 1:1 DAR 16:9]",
        "25 fps",
    ]


def test_parse_rotated_bt709_sar():
    head = parse_ffmpeg_info(MP4_ROTATED_BT709, "bt2.mp4")
    (v,) = head.video
    assert (v.codec, v.width, v.height, v.sar, v.rotation) == ("h264", 128, 72, Fraction(4, 3), 270)
    assert (v.color_range, v.color_space, v.pix_fmt, v.header_fps) == ("tv", "bt709", "yuv420p", 25.0)
    assert head.audio == () and head.duration_s == 1.0 and head.container.startswith("mov,mp4")


def test_parse_51_audio_language():
    head = parse_ffmpeg_info(MP4_51)
    (a,) = head.audio
    assert (a.index, a.codec, a.sample_rate, a.channels, a.layout, a.language) == (
        1,
        "aac",
        48000,
        6,
        "5.1",
        "fra",
    )
    assert head.video[0].header_fps == 29.97


def test_parse_webm_sar_outside_brackets():
    head = parse_ffmpeg_info(WEBM_VP9)
    v = head.video[0]
    assert (v.codec, v.sar, v.color_range, v.tag_duration_s) == ("vp9", Fraction(1), "tv", 1.0)
    assert head.audio[0].channels == 2 and head.audio[0].language == "spa"


def test_parse_stream_start_of_a_transport_stream():
    text = """Input #0, mpegts, from 'off.ts':
  Duration: 00:00:02.52, start: 4.378667, bitrate: 354 kb/s
  Program 1
  Stream #0:0[0x100]: Video: h264 (High) ([27][0][0][0] / 0x001B), yuv420p(progressive), 128x72, 23.98 fps, 23.98 tbr, 90k tbn, start 4.400000
  Stream #0:1[0x101](und): Audio: aac (LC) ([15][0][0][0] / 0x000F), 48000 Hz, stereo, fltp, 129 kb/s, start 4.378667
"""
    head = parse_ffmpeg_info(text)
    assert head.start_s == 4.378667 and head.video[0].start_s == 4.4 and head.video[0].sar == 1
    assert head.audio[0].channels == 2


def test_parse_audio_only_and_errors():
    assert parse_ffmpeg_info(AUDIO_ONLY).video == ()
    with pytest.raises(NotAMediaFile, match="notvideo.mp4: not a media file"):
        parse_ffmpeg_info(NOT_MEDIA, "notvideo.mp4")
    with pytest.raises(NotAMediaFile, match="moov atom not found"):
        parse_ffmpeg_info(MOOV_MISSING, "t3.mp4")
    with pytest.raises(MediaNotFound):
        parse_ffmpeg_info(MISSING, "/nonexist.mp4")


def test_parse_framecrc_reorders_nothing_but_collects_pts():
    tb, pts, durs, keys = parse_framecrc(FRAMECRC_MP4.splitlines())
    assert tb == Fraction(1, 24000) and pts == [0, 4004, 2002, 1001, 3003] and set(durs) == {1001}
    assert keys == [True, False, False, False, False]
    assert max_keyframe_interval(pts, keys, tb) == 4004 / 24000
    assert max_keyframe_interval([0, 10, 20, 30], [True, False, True, False], Fraction(1, 10)) == 2.0
    fps, vfr = frame_rate_from_pts(pts, durs, tb)
    assert fps == Fraction(24000, 1001) and not vfr


@pytest.mark.parametrize(
    ("rate", "tb"),
    [
        (Fraction(24000, 1001), Fraction(1, 1000)),
        (Fraction(30000, 1001), Fraction(1, 1000)),
        (Fraction(25), Fraction(1, 90000)),
    ],
)
def test_frame_rate_from_rounded_timestamps(rate: Fraction, tb: Fraction):
    # Matroska stores 1 ms timestamps: 23.976 fps alternates 41/42 ms intervals, still CFR
    pts = [round(i / rate / tb) for i in range(100)]
    fps, vfr = frame_rate_from_pts(pts, [], tb)
    assert fps == rate and not vfr


def test_frame_rate_vfr_and_single_frame():
    tb = Fraction(1, 1000)
    pts = [round(i * 1000 / 24) for i in range(20)] + [
        round(20 * 1000 / 24 + i * 1000 / 60) for i in range(1, 20)
    ]
    fps, vfr = frame_rate_from_pts(pts, [], tb)
    assert vfr and abs(float(fps) - 38 / ((pts[-1] - pts[0]) / 1000)) < 1e-3
    assert frame_rate_from_pts([0], [1001], Fraction(1, 24000)) == (Fraction(24000, 1001), False)


def test_rotation_and_progress_parsing():
    assert [normalise_rotation(d) for d in (0, 90, -90, 180, -180, 270)] == [0, 90, 270, 180, 180, 270]
    assert parse_progress_frames("frame=10\nfps=0.0\nprogress=continue\nframe=48\nprogress=end\n") == 48


def test_probe_real_multishot_2997(tmp_path: Path):
    clip = make_clip(tmp_path / "m.mp4", (10, 7, 13), fps="30000/1001", audio_channels=6)
    info = probe(clip)
    assert (info.frame_count, info.fps, info.vfr, info.rotation) == (30, Fraction(30000, 1001), False, 0)
    assert (info.width, info.height, info.sar, info.display_size) == (128, 72, Fraction(1), (128, 72))
    assert [a.channels for a in info.audio] == [6]
    assert probe(clip, frame_count="decode").frame_count == 30
    assert VideoInfo.from_dict(info.to_dict()) == info


def test_probe_rotation_sar_vfr_noaudio(tmp_path: Path):
    rot = probe(make_clip(tmp_path / "r.mp4", rotation=90, sar="4/3", audio_channels=None))
    assert (
        rot.rotation == 90 and rot.sar == Fraction(4, 3) and rot.display_size == (72, 171) and rot.audio == ()
    )
    assert rot.dar == Fraction(64, 27)
    vfr = probe(make_clip(tmp_path / "v.mkv", (20, 20), vfr_split=(20, "30")))
    assert vfr.vfr and vfr.frame_count == 40


def test_probe_errors_name_the_file(tmp_path: Path):
    with pytest.raises(MediaNotFound, match="missing.mp4: no such file"):
        probe(tmp_path / "missing.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"hello, not a video" * 10)
    with pytest.raises(NotAMediaFile, match="junk.mp4"):
        probe(junk)
    with pytest.raises(NoVideoStream, match="no video stream"):
        probe(make_audio(tmp_path / "a.m4a", 0.5, codec="aac"))
    full = make_clip(tmp_path / "f.mp4", (60,), faststart=True)
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(full.read_bytes()[: int(full.stat().st_size * 0.6)])
    with pytest.raises(TruncatedMedia, match="cut.mp4: file is truncated"):
        probe(cut)
    mkv = make_clip(tmp_path / "f.mkv", (60,))
    cut2 = tmp_path / "cut.mkv"
    cut2.write_bytes(mkv.read_bytes()[: int(mkv.stat().st_size * 0.6)])
    with pytest.raises(TruncatedMedia, match="cut.mkv"):
        probe(cut2)
