"""The film's join under other ffmpeg builds than the installed one (`DUBFLOW_TEST_FFMPEGS`: binaries,
`:`-separated; `make test` passes the static ffmpeg 7.0.2 of imageio-ffmpeg 0.6.0, the build the GPU
host's bundle carries, `scripts/device_bundle.py`). ffmpeg 7.0's mov muxer records a segment's duration
one frame short; joined without the listing's durations, a 64 s film of 10 shots on the H200 came out
9 frames short in time (24.12 fps, 2026-12-02). Skipped when no other build is given."""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import pytest

from flows.dub_film import dub_film_inline
from tasks.media import ffmpeg
from tasks.media.probe import probe
from tests.test_plan_file import planned_clip
from tests.test_segments import audio_samples, frame_table

BUILDS = [b for b in os.environ.get("DUBFLOW_TEST_FFMPEGS", "").split(":") if b]


@pytest.fixture(params=BUILDS or [None], ids=[Path(b).name for b in BUILDS] or ["none"])
def other_ffmpeg(request, monkeypatch):
    if request.param is None:
        pytest.skip("no other ffmpeg build given (DUBFLOW_TEST_FFMPEGS)")
    if not os.access(request.param, os.X_OK):
        pytest.fail(f"{request.param}: DUBFLOW_TEST_FFMPEGS names no executable")
    monkeypatch.setenv("DUBFLOW_FFMPEG", request.param)
    ffmpeg.ffmpeg_exe.cache_clear()
    yield request.param
    ffmpeg.ffmpeg_exe.cache_clear()


def test_per_shot_segments_join_frame_exactly_under_another_build(other_ffmpeg, tmp_path: Path):
    clip, dub, out, ws_root, plan, _ = planned_clip(tmp_path)
    assert ffmpeg.ffmpeg_exe() == other_ffmpeg
    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(ws_root)}}
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))
    info, got = probe(clip), probe(out)
    assert (got.frame_count, got.fps, got.vfr) == (info.frame_count, info.fps, False)
    pts, _, tb = frame_table(out)
    assert sorted(pts) == [round(Fraction(i) / info.fps / tb) for i in range(info.frame_count)]
    rate = got.audio[0].sample_rate
    want = round(Fraction(info.frame_count) / info.fps * rate)
    # ffmpeg 7's mp4 muxer keeps the AAC encoder's last frame whole: the dub ends < 1 AAC frame late
    assert 0 <= audio_samples(out, rate) - want < 1024
