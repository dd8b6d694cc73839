"""Nothing lost, nothing forged (issue 15), film level: damaged intermediates are rendered again, outputs
stay confined, inputs that would fail late fail first, concurrent runs share a workspace safely, a full
disk is one clear error, and a pool without workers fails naming it. Real ffmpeg, passthrough backend."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tasks.errors import ConfigError, MediaError, OutputError
from tasks.media.probe import probe
from tasks.run.outputs import ROOTS_ENV
from tests.media import decode_all, make_audio, make_clip


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOTS_ENV, raising=False)  # the default roots: the source's folder and out/
    monkeypatch.setenv("DUBFLOW_OUT_DIR", str(tmp_path / "out"))


def _film(tmp_path: Path, lengths=(10, 10, 10), **clip) -> tuple[Path, Path, dict]:
    src = make_clip(tmp_path / "film.mp4" if "codec" not in clip else tmp_path / "film.mkv", lengths, **clip)
    dub = make_audio(tmp_path / "dub.wav", probe(src).video_duration_s)
    config = {
        "backend": {"name": "passthrough"},
        "workspace": {"root": str(tmp_path / "ws")},
        "plan": {"frame_num": 5, "motion_frames": 1},
        "encode": {"preset": "veryfast"},
        "qc": {"enabled": False},
    }
    return src, dub, config


def _dub(src: Path, dub: Path, out: Path, config: dict, **kw) -> str:
    from flows.dub_film import dub_film_inline

    return dub_film_inline(str(src), str(dub), str(out), config=config, **kw)


def _attempts(ws_root: Path) -> list[tuple[int, str]]:
    from tasks.run.workspace import read_attempts
    from tests.test_local_flow import _ws

    (ws_dir,) = ws_root.iterdir()
    return [(a["shot"], a["status"]) for a in read_attempts(_ws(ws_dir))]


@pytest.fixture
def logged() -> list[str]:
    """Messages of the flows/tasks loggers (Prefect may replace the root handlers that caplog uses)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    for name in ("flows", "tasks"):
        logging.getLogger(name).addHandler(handler)
    yield lines
    for name in ("flows", "tasks"):
        logging.getLogger(name).removeHandler(handler)


def _flip(path: Path, n: int = 24) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + n] = bytes(b ^ 0xFF for b in data[mid : mid + n])
    path.write_bytes(bytes(data))


def test_damaged_shots_and_markers_are_rendered_again(tmp_path: Path, logged: list[str]):
    src, dub, config = _film(tmp_path)
    out = tmp_path / "dubbed.mp4"
    first = decode_all(_dub(src, dub, out, config))
    (ws_dir,) = (tmp_path / "ws").iterdir()
    shot = [next((ws_dir / "shots").glob(f"{i:04d}-*")) for i in range(3)]  # shots/<index>-<shot key>/
    _flip(shot[0] / "shot.mkv")  # 24 bytes: same size, same frame count, wrong pixels
    cut = shot[1] / "shot.mkv"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])  # truncated
    (shot[2] / "done.json").write_text('{"index": 2, "out')  # a torn marker
    logged.clear()
    assert np.array_equal(decode_all(_dub(src, dub, out, config)), first)  # the same film, no stuck state
    assert _attempts(tmp_path / "ws")[3:] == [(0, "done"), (1, "done"), (2, "done")]
    for damaged in (shot[0] / "shot.mkv", shot[1] / "shot.mkv", shot[2] / "done.json"):
        # one line reports each damaged file (a shot's progress lines may name its file too)
        named = [line for line in logged if str(damaged) in line and "rendered again" in line]
        assert len(named) == 1, "\n".join(line for line in logged if str(damaged) in line)
    assert not list(ws_dir.rglob(".*tmp*"))  # no temp file left behind


def test_outputs_are_confined_and_foreign_files_never_replaced(tmp_path: Path):
    src, dub, config = _film(tmp_path)
    for bad in (tmp_path / "a" / ".." / ".." / "escape.mp4", Path("/") / "escape.mp4"):
        with pytest.raises(OutputError, match="outside the output roots"):
            _dub(src, dub, bad, config)
    assert not (tmp_path / "ws").exists()  # refused before any work
    foreign = tmp_path / "holiday.mp4"
    foreign.write_bytes(b"my own video")
    with pytest.raises(OutputError, match="not written by dubflow"):
        _dub(src, dub, foreign, config)
    assert foreign.read_bytes() == b"my own video"

    out = tmp_path / "out" / "film.dubbed.mp4"  # the project's out/ (DUBFLOW_OUT_DIR)
    old = os.umask(0o022)
    try:
        assert _dub(src, dub, out, config) == str(out)
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == 0o644
    assert _dub(src, dub, out, {**config, "color": {"strength": 0.5}}) == str(out)  # same workspace: replaced
    with pytest.raises(OutputError, match="--overwrite"):  # another workspace (the preview pass's)
        _dub(src, dub, out, config, preview=True)
    assert _dub(src, dub, out, config, preview=True, overwrite=True) == str(out)
    with pytest.raises(OutputError, match="--overwrite"):  # the stamp of the preview's output is read back
        _dub(src, dub, out, config)


def test_inputs_that_would_fail_late_fail_before_any_shot(tmp_path: Path):
    src, dub, config = _film(tmp_path, (6, 6), size=(321, 181), codec="ffv1")
    out = tmp_path / "o.mp4"
    with pytest.raises(MediaError, match=r"film.mkv: 321x181 cannot be delivered as encode.pix_fmt=yuv420p"):
        _dub(src, dub, out, config)
    assert not list((tmp_path / "ws").rglob("attempts.jsonl"))  # no shot was tried
    odd = {**config, "encode": {"preset": "veryfast", "pix_fmt": "yuv444p"}}
    assert probe(_dub(src, dub, out, odd)).width == 321  # the documented fix works

    x = sf.read(dub, dtype="float32")[0]
    x[100] = np.inf
    sf.write(tmp_path / "nan.wav", x, 16000, subtype="FLOAT")
    with pytest.raises(MediaError, match=r"nan.wav: 1 audio sample\(s\) are NaN or infinite"):
        _dub(src, tmp_path / "nan.wav", tmp_path / "o2.mp4", odd)
    with pytest.raises(ConfigError, match=r"^plan.frame_num: 80 is not of the form 4n\+1"):
        _dub(src, dub, out, {**odd, "plan": {"frame_num": 80}})


def test_two_runs_at_once_render_every_shot_once(tmp_path: Path):
    src, dub, config = _film(tmp_path)
    outs, errors = [tmp_path / "a.mp4", tmp_path / "b.mp4"], []

    def run(out: Path) -> None:
        try:
            _dub(src, dub, out, config)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(o,)) for o in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(_attempts(tmp_path / "ws")) == [(0, "done"), (1, "done"), (2, "done")]  # each shot once
    assert np.array_equal(decode_all(outs[0]), decode_all(outs[1]))


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1.5 MiB tmpfs (root only; skipped where it cannot be mounted)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_is_one_clear_error_and_a_later_run_finishes(
    tmp_path: Path, small_disk: Path, logged: list[str]
):
    from flows.dub_film import ShotsFailed

    src, dub, config = _film(tmp_path, (40, 40, 40, 40, 40))
    out = tmp_path / "o.mp4"
    full = {**config, "workspace": {"root": str(small_disk)}}
    with pytest.raises(MediaError, match=r"GB free, .* need about"):  # the estimate stops it before any shot
        _dub(src, dub, out, full)
    squeezed = {**full, "checks": {"ffv1_ratio": 0.001}}  # an estimate too low: the disk fills mid-run
    with pytest.raises(ShotsFailed, match="No space left on device") as err:
        _dub(src, dub, out, squeezed)
    assert "\n" not in str(err.value) and "re-run to resume" in str(err.value)
    # every shot was tried although recording the failures failed too (the disk is full)
    failed = sorted({int(line[5:9]) for line in logged if line.startswith("shot ") and " failed: " in line})
    assert failed[-1] == 4 and str(failed) in str(err.value)
    assert not list(small_disk.rglob(".*tmp*"))  # no temp file survives
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # space freed
    assert probe(_dub(src, dub, out, squeezed)).frame_count == 200  # the same workspace finishes
    assert not list(small_disk.rglob(".*tmp*"))


@pytest.mark.usefixtures("prefect_harness")
def test_a_pool_without_live_workers_fails_naming_it(tmp_path: Path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    from flows.dub_film import dub_film, dub_group

    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name="gpu-pool", type="process"))
    dub_group.to_deployment(name="gpu", work_pool_name="gpu-pool").apply()  # no worker polls the pool
    src, dub, config = _film(tmp_path, (10,))
    config = {**config, "checks": {"unscheduled_timeout_s": 3}}
    state = dub_film(str(src), str(dub), str(tmp_path / "o.mp4"), config=config, fanout="deployments",
                     return_state=True)  # fmt: skip
    assert state.is_failed()
    with pytest.raises(Exception, match=r"no worker of pool gpu-pool started group-000") as err:
        state.result()
    assert "\n" not in str(err.value)
