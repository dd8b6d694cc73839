"""QC artefacts: the side-by-side preview decodes with the right size and frame count, the sheet has its grid."""

import dataclasses
import subprocess

import cv2
import imageio_ffmpeg
import numpy as np
import pytest
import soundfile as sf

from tasks.render.qc import (
    QcConfig,
    contact_sheet,
    sheet_indices,
    side_by_side,
    write_contact_sheet,
    write_preview,
    write_qc,
)


def clip(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    """Frames with a bright bar moving left to right over a dark noisy ground."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 40, (n, h, w, 3), dtype=np.uint8)
    for t in range(n):
        x = int(t * (w - 8) / max(1, n - 1))
        frames[t, :, x : x + 8] = (250, 200, 60)
    return frames


def decode(path) -> tuple[tuple[int, int], list[np.ndarray]]:
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    frames = [np.frombuffer(buf, np.uint8).reshape(h, w, 3) for buf in reader]
    return (w, h), frames


def test_sheet_indices_are_even_and_cover_the_shot():
    assert sheet_indices(100, 6) == [0, 20, 40, 59, 79, 99]
    assert sheet_indices(3, 6) == [0, 1, 2]
    assert sheet_indices(50, 1) == [25]
    assert sheet_indices(0, 4) == []


def test_side_by_side_keeps_aspect_and_even_size():
    out = side_by_side(np.zeros((90, 160, 3), np.uint8), np.full((45, 45, 3), 255, np.uint8), 64)
    assert out.shape == (64, 114 + 64, 3)
    assert out[:, :114].max() == 0 and out[:, 114:].min() == 255


def test_write_qc_preview_and_sheet(tmp_path):
    src = clip(20, 90, 160)
    dub = src.copy()
    dub[:, 30:60, 50:110] = 255 - dub[:, 30:60, 50:110]  # the "dubbed" region differs
    cfg = QcConfig(height=64, thumb_height=48, sheet_frames=5, sheet_cols=3, fps=25.0)
    res = write_qc(src, dub, tmp_path / "qc", "shot0007", cfg)
    assert res.frames == 20
    assert res.preview.name == "shot0007_preview.mp4" and res.contact_sheet.name == "shot0007_sheet.png"
    (w, h), frames = decode(res.preview)
    assert (w, h) == (228, 64) and len(frames) == 20
    # left half is the source, right half the dubbed frame (lossy codec: compare means of a region)
    left = cv2.resize(src[10], (114, 64), interpolation=cv2.INTER_AREA).astype(float)
    right = cv2.resize(dub[10], (114, 64), interpolation=cv2.INTER_AREA).astype(float)
    got = frames[10].astype(float)
    assert np.abs(got[:, :114] - left).mean() < 12 and np.abs(got[:, 114:] - right).mean() < 12
    assert np.abs(got[:, 114:] - left).mean() > 20  # the halves really differ
    sheet = cv2.imread(str(res.contact_sheet))
    pad, cell_w = 4, 2 * 86  # 160x90 at 48 px high -> 85.3 -> 86 (even)
    assert sheet.shape == (2 * (48 + pad) + pad, 3 * (cell_w + pad) + pad, 3)
    assert sorted(p.name for p in (tmp_path / "qc").iterdir()) == [
        "shot0007_preview.mp4",
        "shot0007_sheet.png",
    ]


def test_generators_need_a_frame_count(tmp_path):
    src, dub = clip(9, 48, 64), clip(9, 48, 64, seed=1)
    with pytest.raises(ValueError, match="num_frames"):
        write_qc(iter(src), iter(dub), tmp_path, "s", QcConfig(height=32, thumb_height=32))
    res = write_qc(iter(src), iter(dub), tmp_path, "s", QcConfig(height=32, thumb_height=32), num_frames=9)
    assert len(decode(res.preview)[1]) == 9


def test_mismatched_frame_counts_fail_and_leave_no_files(tmp_path):
    src = clip(10, 48, 64)
    with pytest.raises(ValueError):
        write_qc(src, src[:7], tmp_path, "bad", QcConfig(height=32, thumb_height=32))
    with pytest.raises(ValueError, match="expected 12"):
        write_qc(src, src, tmp_path, "bad", QcConfig(height=32, thumb_height=32), num_frames=12)
    assert list(tmp_path.iterdir()) == []


def test_preview_with_audio_and_standalone_sheet(tmp_path):
    src = clip(25, 48, 64)
    wav = tmp_path / "dub.wav"
    t = np.arange(16000) / 16000
    sf.write(wav, (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    out = write_preview(src, src, tmp_path / "p.mp4", QcConfig(height=48, fps=25.0), audio=wav)
    (w, h), frames = decode(out)
    assert (w, h) == (128, 48) and len(frames) == 25
    probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-i", str(out)], capture_output=True, text=True)
    assert "Audio: aac" in probe.stderr and "Video: h264" in probe.stderr
    png = write_contact_sheet(src, src, tmp_path / "sheet.png", QcConfig(thumb_height=32, sheet_frames=4))
    assert cv2.imread(str(png)).shape == (2 * (32 + 4) + 4, 3 * (2 * 42 + 4) + 4, 3)


def test_contact_sheet_labels_frames():
    black = np.zeros((32, 32, 3), np.uint8)
    plain = contact_sheet([(12, black, black)], cols=1, thumb_height=32, label=False)
    labelled = contact_sheet([(12, black, black)], cols=1, thumb_height=32, label=True)
    assert plain.shape == labelled.shape and plain[4:36, 4:68].max() == 0
    assert labelled[4:36, 4:68].max() == 255  # white label text drawn
    with pytest.raises(ValueError):
        contact_sheet([], cols=3, thumb_height=32)


def test_sheet_marks_tracks_the_speaker_and_the_speech_timeline(tmp_path):
    from tasks.config.pipeline import load_config
    from tasks.decision.gate import decide_dub
    from tasks.decision.overrides import ShotOverrides
    from tasks.perception.face_analysis import ShotFaces, TrackInfo
    from tasks.perception.speaker import SpeakerSegment
    from tasks.perception.speech import SpeechInfo
    from tasks.picture.region import RegionConfig
    from tasks.render.qc_overlay import speaker_overlay

    n, h, w = 12, 180, 320
    frames = np.full((n, h, w, 3), 40, np.uint8)
    tracks = tuple(
        TrackInfo(k, 0, n, 60.0, still, (0, 11), ((x, 50, x + 60, 110), (x, 50, x + 60, 110)))
        for k, x, still in ((0, 30, False), (1, 220, True))
    )
    faces = ShotFaces(n, 25.0, (h, w), (h, w), True, tracks, (SpeakerSegment(0, n, "speaker", 0, 0.9),),
                      (0.1, 0.9, 0.9), ((0.05, 0.3, 0.2), (0.0, 0.0, 0.0)), 5, 0.0)  # fmt: skip
    speech = SpeechInfo(True, 0.8, ((0.0, 0.4),), "speech")
    cfg = load_config()
    d = decide_dub(ShotOverrides(0), speech, faces, RegionConfig(), cfg.gate, cfg.speaker)
    overlay = speaker_overlay(dataclasses.replace(d, faces=faces))
    marked = overlay.annotate(3, frames[3])
    assert tuple(marked[50, 45]) == (60, 220, 90)  # the speaker's face box, green
    assert tuple(marked[50, 235]) == (230, 60, 60)  # the poster's, red
    assert np.array_equal(marked[130:, 290:], frames[3][130:, 290:])  # nothing drawn elsewhere
    half = speaker_overlay(dataclasses.replace(d, faces=faces), 0.5).annotate(3, frames[3][::2, ::2].copy())
    assert tuple(half[25, 22]) == (60, 220, 90) and tuple(half[25, 117]) == (230, 60, 60)  # scaled boxes
    assert tuple(half[50, 60]) == (40, 40, 40)  # nothing on the full-size box's top edge
    plain = write_qc(frames, frames, tmp_path, "plain", QcConfig(sheet_frames=2, sheet_cols=2))
    marked_qc = write_qc(
        frames, frames, tmp_path, "marked", QcConfig(sheet_frames=2, sheet_cols=2), overlay=overlay
    )
    a, b = cv2.imread(str(plain.contact_sheet)), cv2.imread(str(marked_qc.contact_sheet))
    assert b.shape[1] == a.shape[1] and b.shape[0] > a.shape[0]  # the timeline strip below the grid
    assert not np.array_equal(a, b[: a.shape[0]])


@pytest.mark.parametrize(
    ("size", "rotation", "sar", "display"),
    [((1920, 1080), None, None, (240, 428)), ((1280, 720), 90, None, (240, 136)),
     ((1440, 1080), None, "4/3", (240, 427)), ((960, 720), 270, "4/3", (240, 136))],
)  # fmt: skip
def test_shot_qc_decodes_scaled_down_and_matches_the_full_size_picture(
    tmp_path, size, rotation, sar, display
):
    """A shot's QC is decoded at QC's size by ffmpeg (not at 1080p through the pipes): the preview's halves
    are the display-orientation, square-pixel picture at 240 px, as a full-size decode scaled down."""
    from tasks.media.frames import read_frames
    from tasks.media.probe import probe
    from tasks.picture.geometry import ModelGeometry
    from tasks.render.qc import fit_height
    from tasks.render.shot_qc import qc_geometry, write_shot_qc
    from tasks.timeline.plan import plan_shot
    from tasks.timeline.shots import Shot
    from tests.media import make_clip

    src = make_clip(tmp_path / "src.mp4", (12,), size=size, audio_channels=None, rotation=rotation, sar=sar)
    info = probe(src)
    width, geometry, scale = qc_geometry(info, 240)
    assert width is not None and width < info.width and geometry.display_hw == display
    assert abs(scale - display[0] / ModelGeometry.for_video(info).display_hw[0]) < 0.01
    plan = plan_shot(Shot(0, 0, info.frame_count), info.fps, load_plan_config())
    audio = np.zeros((8000, 1), np.float32)  # 0.5 s of dub under 0.5005 s of picture: every frame still there
    res = write_shot_qc(info, plan, src, tmp_path / "qc", audio, 16000, 240)
    (w, h), frames = decode(res["preview"])
    half = fit_height(np.zeros((*display, 3), np.uint8), 240).shape[1]
    assert (h, w) == (240, 2 * half) and probe(res["preview"]).frame_count == info.frame_count
    full = ModelGeometry.for_video(info).to_display(read_frames(info, [5])[5])
    want = fit_height(full, 240)
    n = min(half, want.shape[1])  # the two roundings of an odd display width may differ by 2 px
    got = frames[5][:, :n].astype(int)
    assert (
        np.abs(got - want[:, :n].astype(int)).mean() < 6
    )  # the same picture (x264 at crf 26 on both halves)


def load_plan_config():
    from tasks.config.pipeline import load_config

    return load_config().plan


def test_outlined_text_ends_where_its_letters_end():
    """The outline of a long legend no longer runs past the text (a thick stroke advances wider)."""
    from tasks.render.qc import outlined_text

    text = "speech (grey), mouth activity per track (lines), agreement with the speech (dots), dubbed turns (bars)"
    strip = np.full((24, 900, 3), 24, np.uint8)
    outlined_text(strip, text, (4, 14), (170, 170, 170), 0.38)
    width = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.38, 1)[0][0]
    drawn = np.where((strip != 24).any(axis=(0, 2)))[0]
    assert drawn.max() <= 4 + width + 2, (drawn.max(), width)


def test_a_sheet_has_a_wrapped_header_timecodes_on_frames_and_a_time_axis(tmp_path):
    from tasks.render.qc import HEADER_SCALE, header_band, time_axis, wrap_text

    header = ("film.mp4 - shot 0003 - 01:00:05:22 to 01:00:08:18 (68 frames at 23.976 fps)",
              "decision: dubbed: speech 95%; speaker: track 0 (score 0.97) " * 3)  # fmt: skip
    for line in header:
        for part in wrap_text(line, 300, HEADER_SCALE):  # every wrapped line fits: nothing runs off
            assert cv2.getTextSize(part, cv2.FONT_HERSHEY_SIMPLEX, HEADER_SCALE, 1)[0][0] <= 300
    assert header_band(header, 312).shape[0] > header_band(header, 2000).shape[0]  # narrower: more lines
    frames = np.stack([np.full((48, 64, 3), 10 * i, np.uint8) for i in range(9)])
    tc = lambda t: f"01:00:05:{22 + t:02d} #{t}"  # noqa: E731
    plain = write_qc(
        frames, frames, tmp_path / "a", "s", QcConfig(height=48, thumb_height=48, sheet_frames=3)
    )
    full = write_qc(
        frames, frames, tmp_path / "b", "s",
        QcConfig(height=48, thumb_height=48, sheet_frames=3, header=header, frame_label=tc),
    )  # fmt: skip
    a, b = cv2.imread(str(plain.contact_sheet)), cv2.imread(str(full.contact_sheet))
    band, axis = header_band(header, a.shape[1]), time_axis(a.shape[1], 9, tc)
    assert b.shape == (band.shape[0] + a.shape[0] + axis.shape[0], a.shape[1], 3)
    grid = b[band.shape[0] : band.shape[0] + a.shape[0]]
    assert not np.array_equal(grid, a)  # timecodes, not "#<frame>", on the cells
    assert np.array_equal(cv2.cvtColor(b[-axis.shape[0] :], cv2.COLOR_BGR2RGB), axis)
