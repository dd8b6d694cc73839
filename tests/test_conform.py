"""Exports a conform can use (issue 27 item 3): reels of at most 8 characters named after their files,
per-shot clip names, source timecode from the film's own start timecode (01:00:00:00 here), the dub as a
48 kHz / 24-bit WAV next to the OTIO; the EDL is read back with OTIO's adapter and a plain CMX parse,
the FCP 7 XML with OTIO's adapter."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import opentimelineio as otio
import pytest
import soundfile as sf

from flows.dub_film import dub_film_inline
from tasks.media.probe import probe
from tests.media import decode_all, make_audio, make_clip, run_ffmpeg

TC = "01:00:00:00"
_EVENT = re.compile(
    r"^(\d{3})\s+(\S{1,8})\s+V\s+C\s+(\d\d:\d\d:\d\d:\d\d) (\d\d:\d\d:\d\d:\d\d) (\d\d:\d\d:\d\d:\d\d) (\d\d:\d\d:\d\d:\d\d)\s*$"
)


def cmx_events(text: str) -> list[dict[str, str]]:
    """The cut events of a CMX 3600 EDL, parsed by hand (no OTIO): reel, source and record in/out, clip."""
    events: list[dict[str, str]] = []
    for line in text.splitlines():
        m = _EVENT.match(line)
        if m:
            events.append(
                dict(
                    zip(("event", "reel", "src_in", "src_out", "rec_in", "rec_out"), m.groups(), strict=True)
                )
            )
        elif line.startswith("* FROM CLIP NAME:") and events:
            events[-1]["clip"] = line.split(":", 1)[1].strip()
    return events


def _tc(frame: int, fps: Fraction) -> str:
    return otio.opentime.to_timecode(otio.opentime.RationalTime(frame, float(fps)), float(fps))


@pytest.mark.parametrize("keep", [True, False])
def test_edl_and_fcp_xml_conform_by_reel_and_timecode(keep: bool, tmp_path: Path):
    plain = make_clip(tmp_path / "plain.mp4", (24, 20, 28), audio_channels=None)
    film = tmp_path / "scene_one.mp4"
    run_ffmpeg(["-i", str(plain), "-map", "0", "-c", "copy", "-timecode", TC, str(film)])
    info = probe(film)
    assert info.timecode == TC
    fps, tc0 = info.fps, 86400  # 01:00:00:00 at 24 frames a nominal second
    dub = make_audio(tmp_path / "dub.wav", info.video_duration_s)
    out = tmp_path / "out" / "scene_one_de.mp4"
    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(tmp_path / "ws"), "keep": keep},
              "timeline": {"edl": True, "fcp_xml": True}}  # fmt: skip
    dub_film_inline(str(film), str(dub), str(out), config=config)
    assert probe(out).timecode == TC  # the deliverable starts at the film's timecode too
    edges = [(0, 24), (24, 44), (44, 72)]

    # the plain parse: one cut event per shot, reel <= 8 characters, source timecode = film timecode
    events = cmx_events(out.with_suffix(".edl").read_text())
    assert [e["event"] for e in events] == ["001", "002", "003"]
    for e, (a, b), i in zip(events, edges, range(3), strict=True):
        assert len(e["reel"]) <= 8 and e["clip"] == f"SH{i:04d}D"
        first = 0 if keep else tc0 + a  # a shot file starts at 0 (no timecode), the delivered film at tc0
        assert (e["src_in"], e["src_out"]) == (_tc(first, fps), _tc(first + b - a, fps))
        assert (e["rec_in"], e["rec_out"]) == (_tc(a, fps), _tc(b, fps))  # the record side: the cut's place
        assert e["reel"] == (f"D{i:05d}" if keep else "SCENEDUB")
    # OTIO's own CMX reader agrees, and each reel names one file whose frames start at that timecode
    edl = otio.adapters.read_from_file(str(out.with_suffix(".edl")), adapter_name="cmx_3600", rate=float(fps))
    timeline = otio.adapters.read_from_file(str(out.with_suffix(".otio")))
    by_reel = {c.metadata["cmx_3600"]["reel"]: c for c in timeline.tracks[1].find_clips()}
    for clip, (a, b) in zip(edl.video_tracks()[0].find_clips(), edges, strict=True):
        reel = clip.metadata["cmx_3600"]["reel"]
        assert clip.source_range.start_time.value == (0 if keep else tc0 + a)
        assert clip.source_range.duration.value == b - a
        media = by_reel[reel].media_reference
        path = Path(media.target_url.removeprefix("file://"))
        assert path.is_file() and (path == out) != keep
        first = media.available_range.start_time.value  # the file's frame 0 is at this timecode
        assert first == (0 if keep else tc0) and probe(path).frame_count >= b - a

    xml = otio.adapters.read_from_file(str(out.with_suffix(".xml")), adapter_name="fcp_xml")
    source, dubbed = xml.video_tracks()
    for clip, (a, b) in zip(source.find_clips(), edges, strict=True):
        assert Path(clip.media_reference.target_url.removeprefix("file://")) == film.resolve()
        assert (clip.source_range.start_time.value, clip.source_range.duration.value) == (tc0 + a, b - a)
    assert [round(c.range_in_parent().start_time.value) for c in dubbed.find_clips()] == [0, 24, 44]

    wav = out.with_suffix(".dub.wav")
    meta = sf.info(str(wav))
    assert (meta.samplerate, meta.subtype) == (48000, "PCM_24")
    assert meta.frames == round(Fraction(72) / fps * 48000)  # the picture's duration, to the sample
    (sound,) = xml.audio_tracks()[0].find_clips()
    assert Path(sound.media_reference.target_url.removeprefix("file://")) == wav.resolve()


def _read_through_timecode(path: Path, src_in: int, frames: int, fps: Fraction) -> np.ndarray:
    """The `frames` frames a conform reads for a clip whose source in is `src_in`: counted from the media's
    own start timecode (ffmpeg's reading of the file; 0 without one), decoded with ffmpeg."""
    from tasks.media.frames import iter_frames
    from tasks.timeline.export import start_frame

    info = probe(path)
    offset = src_in - start_frame(info.timecode, fps)
    assert offset >= 0 and offset + frames <= info.frame_count, (path, src_in, info.timecode)
    return np.stack(list(iter_frames(info, offset, offset + frames)))


def _nearest(frames: np.ndarray, pool: np.ndarray) -> list[int]:
    """For each frame, the index of the most similar frame of `pool` (every frame of the film differs)."""
    flat = pool.reshape(len(pool), -1).astype(np.float32)
    return [int(((flat - f.reshape(-1).astype(np.float32)) ** 2).mean(axis=1).argmin()) for f in frames]


@pytest.mark.parametrize("keep", [True, False])
def test_every_clip_reads_back_the_frames_it_names_through_its_media_timecode(keep: bool, tmp_path: Path):
    """OTIO, EDL and FCP 7 XML: each clip's source in, counted from its media file's own timecode as ffmpeg
    reads it, lands on the film frames the clip stands for (its record range) in every track."""
    plain = make_clip(tmp_path / "plain.mp4", (10, 7, 11), audio_channels=None)
    film = tmp_path / "reel_two.mp4"
    run_ffmpeg(["-i", str(plain), "-map", "0", "-c", "copy", "-timecode", TC, str(film)])
    fps = probe(film).fps
    dub = make_audio(tmp_path / "dub.wav", probe(film).video_duration_s)
    out = tmp_path / "out" / "reel_two_de.mp4"
    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(tmp_path / "ws"), "keep": keep},
              "timeline": {"edl": True, "fcp_xml": True}}  # fmt: skip
    dub_film_inline(str(film), str(dub), str(out), config=config)
    source_frames = decode_all(film)
    timeline = otio.adapters.read_from_file(str(out.with_suffix(".otio")))
    files = {
        c.metadata["cmx_3600"]["reel"]: c.media_reference.target_url
        for t in timeline.tracks
        for c in t.find_clips()
    }
    edl = otio.adapters.read_from_file(str(out.with_suffix(".edl")), adapter_name="cmx_3600", rate=float(fps))
    xml = otio.adapters.read_from_file(str(out.with_suffix(".xml")), adapter_name="fcp_xml")
    tracks = [
        *(("otio", t, None) for t in timeline.video_tracks()),
        *(("edl", t, files) for t in edl.video_tracks()),
        *(("xml", t, None) for t in xml.video_tracks()),
    ]
    assert len(tracks) == 5
    for kind, track, reels in tracks:
        for clip in track.find_clips():
            url = reels[clip.metadata["cmx_3600"]["reel"]] if reels else clip.media_reference.target_url
            path = Path(url.removeprefix("file://"))
            assert path.is_file(), (kind, clip.name, url)
            place = clip.range_in_parent()
            a, n = round(place.start_time.value), round(place.duration.value)
            got = _read_through_timecode(path, round(clip.source_range.start_time.value), n, fps)
            assert _nearest(got, source_frames) == list(range(a, a + n)), (kind, track.name, clip.name)
