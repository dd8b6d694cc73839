"""The edit-suite timeline and the preview pass on the sample film: a quality run and a preview run coexist
(two workspaces, two outputs), the preview is labelled in the output's metadata and on QC sheets, and the
OTIO file of a run parses with `opentimelineio` with clip ranges equal to the shot partition."""

from __future__ import annotations

import json
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import opentimelineio as otio

from tasks.media.ffmpeg import ffmpeg_exe
from tasks.render.qc import QcConfig, write_qc
from tasks.render.shot import PREVIEW_LABEL
from tasks.run.outputs import output_stamp, output_tag

DATA = Path(__file__).resolve().parents[1] / "data"


def _comment(path: Path) -> str:
    """The container's comment tag (ffmpeg's metadata dump)."""
    got = subprocess.run(
        [ffmpeg_exe(), "-v", "error", "-i", str(path), "-f", "ffmetadata", "-"],
        capture_output=True,
        text=True,
    )
    return next((line[8:] for line in got.stdout.splitlines() if line.startswith("comment=")), "")


def test_quality_and_preview_runs_coexist_and_export_the_shot_partition(tmp_path: Path):
    from flows.dub_film import dub_film_inline

    meta = json.loads((DATA / "sample_film.json").read_text())
    film, dub = DATA / meta["film"], DATA / meta["dub"]
    ws_root = tmp_path / "ws"
    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(ws_root)}}
    extra = {**config, "timeline": {"edl": True, "fcp_xml": True}}  # also the EDL and the FCP 7 XML
    quality = Path(dub_film_inline(str(film), str(dub), str(tmp_path / "q.mp4"), config=extra))
    preview = Path(dub_film_inline(str(film), str(dub), str(tmp_path / "p.mp4"), config=config, preview=True))
    stores = sorted(p for p in ws_root.iterdir() if not p.name.startswith("."))
    assert len(stores) == 2  # one workspace per pass, both kept with their shots
    assert all(len(list(s.glob("shots/*/done.json"))) == len(meta["shots"]) for s in stores)
    assert PREVIEW_LABEL in _comment(preview) and PREVIEW_LABEL not in _comment(quality)
    # the comment's first word is still each output's dubflow stamp (its workspace), read as such
    assert {output_tag(quality), output_tag(preview)} == {output_stamp(s.name) for s in stores}

    fps = Fraction(meta["fps"])
    edges = [0, *meta["cut_frames"], meta["frame_count"]]
    timeline = otio.adapters.read_from_file(str(quality.with_suffix(".otio")))
    tracks = {t.name: t for t in timeline.tracks}
    assert set(tracks) == {"source", "dubbed", "dub audio"}
    for name in ("source", "dubbed"):
        clips = list(tracks[name].find_clips())
        assert len(clips) == len(edges) - 1
        for clip, a, b in zip(clips, edges[:-1], edges[1:], strict=True):
            place = clip.range_in_parent()  # where the clip sits on the timeline: its source timecode
            assert (place.start_time.value, place.duration.value) == (a, b - a), (name, clip.name)
            assert place.start_time.rate == float(fps)
            assert Path(clip.media_reference.target_url.removeprefix("file://")).is_file()
        if name == "source":  # cut from the film at the shot's own frames
            assert [c.source_range.start_time.value for c in clips] == edges[:-1]
    (sound,) = tracks["dub audio"].find_clips()
    assert sound.source_range.duration.value == meta["frame_count"]
    assert timeline.duration().value == meta["frame_count"]
    _check_extra_timelines(quality, timeline, edges, fps)
    assert not preview.with_suffix(".edl").exists() and not preview.with_suffix(".xml").exists()  # opt-in


def _placed(track) -> list[tuple[int, int, str]]:
    """(timeline start, frames, media URL) of a track's clips."""
    return [
        (round(c.range_in_parent().start_time.value), round(c.range_in_parent().duration.value),
         c.media_reference.target_url)
        for c in track.find_clips()
    ]  # fmt: skip


def _check_extra_timelines(out: Path, timeline, edges: list[int], fps: Fraction) -> None:
    """`<out>.edl` and `<out>.xml` parse back with OTIO's own adapters; their clips are the shot partition,
    on the same media as the `.otio` timeline's."""
    partition = [(a, b - a) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    tracks = {t.name: t for t in timeline.tracks}
    edl = otio.adapters.read_from_file(str(out.with_suffix(".edl")), adapter_name="cmx_3600", rate=float(fps))
    (video,) = edl.video_tracks()  # an EDL: the dubbed shots
    assert [(a, n) for a, n, _ in _placed(video)] == partition
    assert [c.name for c in video.find_clips()] == [c.name for c in tracks["dubbed"].find_clips()]
    xml = otio.adapters.read_from_file(str(out.with_suffix(".xml")), adapter_name="fcp_xml")
    source, dubbed = xml.video_tracks()
    (sound,) = xml.audio_tracks()
    assert _placed(source) == _placed(tracks["source"]) and _placed(dubbed) == _placed(tracks["dubbed"])
    assert [(a, n) for a, n, _ in _placed(dubbed)] == partition
    assert _placed(sound) == _placed(tracks["dub audio"])
    assert all(c.range_in_parent().start_time.rate == float(fps) for c in dubbed.find_clips())


def test_a_qc_title_marks_preview_frames_and_the_sheet(tmp_path: Path):
    frames = np.full((4, 64, 96, 3), 90, np.uint8)
    plain = write_qc(frames, frames, tmp_path / "a", "s", QcConfig(height=64, thumb_height=64, label=False))
    titled = write_qc(
        frames,
        frames,
        tmp_path / "b",
        "s",
        QcConfig(height=64, thumb_height=64, label=False, title="PREVIEW"),
    )
    import cv2

    a, b = cv2.imread(str(plain.contact_sheet)), cv2.imread(str(titled.contact_sheet))
    assert a.shape == b.shape and np.array_equal(a[32:], b[32:]) and not np.array_equal(a[:32], b[:32])
    assert titled.preview.stat().st_size > 0
