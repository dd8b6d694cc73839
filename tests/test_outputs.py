"""Confined outputs (tasks/run/outputs.py) and early checks (tasks/render/preflight.py, tasks/media/audio.py): refused
before any work, with one line naming the path, key or file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tasks.config.pipeline import load_config
from tasks.errors import ConfigError, MediaError, OutputError
from tasks.media.assemble import AudioSource, assemble
from tasks.media.audio import decode_audio
from tasks.media.intermediates import IntermediateError, record_written
from tasks.media.probe import probe
from tasks.render.preflight import check_config, check_frame_size, check_free_space, workspace_need
from tasks.run.outputs import ROOTS_ENV, check_overwrite, confine_output, output_stamp, output_tag
from tests.media import make_clip, run_ffmpeg


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Default roots: the source's folder (tmp/films) and the project's out/ (tmp/out); tmp/other is outside."""
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    monkeypatch.setenv("DUBFLOW_OUT_DIR", str(tmp_path / "out"))
    for d in ("films", "other"):
        (tmp_path / d).mkdir()
    (tmp_path / "films" / "film.mp4").write_bytes(b"")
    return tmp_path


def test_outputs_stay_under_the_roots_after_resolving(roots: Path, monkeypatch: pytest.MonkeyPatch):
    src = roots / "films" / "film.mp4"
    assert confine_output(roots / "films" / "a.mp4", src) == roots / "films" / "a.mp4"
    assert confine_output(roots / "out" / "a.mp4", src) == roots / "out" / "a.mp4"
    assert not (roots / "out").exists()  # nothing created by the check (the output's claim makes it)
    for bad in (roots / "films" / "evil" / ".." / ".." / "escape.mp4", roots / "other" / "a.mp4"):
        with pytest.raises(OutputError, match=r"outside the output roots .*DUBFLOW_OUTPUT_ROOTS"):
            confine_output(bad, src)
    (roots / "films" / "link").symlink_to(roots / "other")  # a symlink inside a root leading out of it
    with pytest.raises(OutputError, match="outside the output roots"):
        confine_output(roots / "films" / "link" / "a.mp4", src)
    assert (
        confine_output(roots / "films" / "new" / "deeper" / "a.mp4", src).parent
        == roots / "films" / "new" / "deeper"
    )
    assert not (roots / "films" / "new").exists()
    (roots / "films" / "file").write_bytes(b"")
    for under_a_file in (roots / "films" / "file" / "a.mp4", roots / "films" / "file" / "sub" / "a.mp4"):
        with pytest.raises(OutputError, match="file is not a folder"):
            confine_output(under_a_file, src)
    monkeypatch.setenv(ROOTS_ENV, f"{roots / 'other'}{os.pathsep}{roots / 'nowhere'}")
    assert confine_output(roots / "other" / "a.mp4", src) == roots / "other" / "a.mp4"
    with pytest.raises(OutputError, match="outside the output roots"):
        confine_output(roots / "films" / "a.mp4", src)


def _delivered(path: Path, key: str) -> Path:
    """Deliver a copy of `path` (what dubflow wrote) to itself, with its record for workspace `key`."""
    from tasks.media.deliver import deliver, destination, staging

    data, dest = path.read_bytes(), destination([path])
    with staging(dest, path.name) as folder:
        (folder / path.name).write_bytes(data)
        return deliver(dest, folder / path.name, path.name, key)


def test_only_files_dubflow_wrote_are_replaced(roots: Path):
    src = roots / "films" / "film.mp4"
    foreign = roots / "films" / "holiday.mp4"
    make_clip(foreign, (3,), audio_channels=None)
    with pytest.raises(OutputError, match="not written by dubflow .*: refusing to overwrite it"):
        confine_output(foreign, src)
    ours = roots / "films" / "ours.mp4"
    run_ffmpeg(["-i", str(foreign), "-c", "copy", str(ours)])
    _delivered(ours, "film-abc")  # the record of what dubflow wrote there: size, SHA-256, workspace key
    assert confine_output(ours, src) == ours
    check_overwrite(ours, "film-abc", overwrite=False)  # a re-run of the same film + config
    with pytest.raises(OutputError, match=r"another film or pass.*--overwrite"):
        check_overwrite(ours, "film-xyz", overwrite=False)
    check_overwrite(ours, "film-xyz", overwrite=True)
    with pytest.raises(OutputError, match="not written by dubflow"):
        check_overwrite(foreign, "film-abc", overwrite=True)  # never, not even with the flag
    # a tag proves nothing: a stream-copied cut of our output keeps dubflow's stamp but is the user's file
    run_ffmpeg(["-i", str(ours), "-c", "copy", "-metadata", f"comment={output_stamp('film-abc')}",
                "-frames:v", "2", str(roots / "films" / "cut.mp4")])  # fmt: skip
    ours.write_bytes((roots / "films" / "cut.mp4").read_bytes())  # the user replaced it with the cut
    assert output_tag(ours) == "dubflow:film-abc"
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="not written by dubflow"):
            check_overwrite(ours, "film-abc", overwrite=overwrite)


def test_the_encode_stamps_its_output_verifies_its_shots_and_follows_the_umask(tmp_path: Path):
    from tasks.media.frames import LosslessWriter, iter_frames

    info = probe(make_clip(tmp_path / "src.mp4", (6,), audio_channels=None))
    shot = tmp_path / "shot.mkv"
    with LosslessWriter(shot, (info.height, info.width), info.fps) as w:
        w.write(iter_frames(info))
    record = record_written(shot, 6)
    dub = tmp_path / "d.wav"
    sf.write(dub, np.zeros(int(info.video_duration_s * 16000), np.float32), 16000)
    enc = load_config(overrides=["encode.preset=veryfast"]).encode
    old = os.umask(0o022)
    try:
        out = assemble(info, [str(shot)], tmp_path / "o.mp4", enc, audio=AudioSource(str(dub)),
                       workdir=tmp_path / "w", records=[record], stamp="dubflow:k")  # fmt: skip
    finally:
        os.umask(old)
    assert Path(out).stat().st_mode & 0o777 == 0o644 and output_tag(out) == "dubflow:k"
    data = bytearray(shot.read_bytes())
    data[-40:-16] = bytes(24)
    shot.write_bytes(bytes(data))
    with pytest.raises(IntermediateError, match=r"shot.mkv: shot intermediate does not match .*hash"):
        assemble(
            info, [str(shot)], tmp_path / "o2.mp4", enc, audio=None, workdir=tmp_path / "w", records=[record]
        )
    assert not (tmp_path / "o2.mp4").exists()


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        ("plan.frame_num=80", "plan.frame_num", "80 is not of the form 4n+1 (e.g. 77 or 81)"),
        ("plan.motion_frames=81", "plan.motion_frames", "81 must be smaller than plan.frame_num (81)"),
        ("checks.ffv1_ratio=0", "checks.ffv1_ratio", "must be in"),
    ],
)
def test_config_values_that_cannot_work_are_config_errors(override: str, key: str, message: str):
    with pytest.raises(ConfigError) as err:
        check_config(load_config(overrides=[override]))
    assert str(err.value).startswith(f"{key}: ") and message in str(err.value)


def test_odd_sizes_non_finite_audio_and_a_full_disk_are_caught_early(tmp_path: Path):
    with pytest.raises(MediaError, match=r"f.mp4: 321x181 cannot be delivered as encode.pix_fmt=yuv420p"):
        check_frame_size("f.mp4", 321, 181, "yuv420p")
    with pytest.raises(MediaError, match="needs an even width"):
        check_frame_size("f.mp4", 321, 180, "yuv422p10le")
    for ok in ((320, 180, "yuv420p"), (321, 181, "yuv444p"), (321, 181, "rgb24"), (320, 181, "yuv422p")):
        check_frame_size("f.mp4", *ok)

    x = np.sin(np.arange(32000) / 9).astype(np.float32)
    x[8000] = np.nan
    sf.write(tmp_path / "nan.wav", x, 16000, subtype="FLOAT")
    with pytest.raises(
        MediaError, match=r"nan.wav: 1 audio sample\(s\) are NaN or infinite, the first at 0.500 s"
    ):
        decode_audio(tmp_path / "nan.wav", sample_rate=16000, channels=1)

    need = workspace_need([100, 300], 1920, 1080, 0.5)
    assert need == int((100 + 300 + 300) * 1920 * 1080 * 3 * 0.5)
    check_free_space(tmp_path / "ws" / "not-yet", 1, "the shots")
    with pytest.raises(MediaError, match=r"GB free, the film's shots need about .* GB"):
        check_free_space(tmp_path, 1 << 60, "the film's shots")
