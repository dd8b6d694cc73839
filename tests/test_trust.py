"""Trust what is on disk (issue 26): markers bound to their place, damaged run files never a stuck
state, inputs re-checked before assembling, long dub tracks refused from their header. Real files,
real ffmpeg, the passthrough backend (a dry run: nothing is dubbed)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tasks.media.deliver import written_record
from tasks.media.probe import probe
from tasks.run.outputs import ROOTS_ENV
from tests.media import decode_all, make_audio, make_clip


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    monkeypatch.setenv("DUBFLOW_OUT_DIR", str(tmp_path / "out"))


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


def config(tmp_path: Path, **extra) -> dict:
    return {
        "backend": {"name": "passthrough"},
        "workspace": {"root": str(tmp_path / "ws")},
        "plan": {"frame_num": 5, "motion_frames": 1},
        "encode": {"preset": "veryfast"},
        "qc": {"enabled": False},
        **extra,
    }


def film(tmp_path: Path, name: str = "film", lengths=(10, 10, 10), seed: int = 0) -> tuple[Path, Path]:
    src = make_clip(tmp_path / f"{name}.mp4", lengths, seed=seed)
    return src, make_audio(tmp_path / f"{name}-dub.wav", probe(src).video_duration_s)


def dub(src: Path, audio: Path, out: Path, cfg: dict, **kw) -> str:
    from flows.dub_film import dub_film_inline

    return dub_film_inline(str(src), str(audio), str(out), config=cfg, **kw)


def ws_dir(tmp_path: Path, stem: str) -> Path:
    return next(p for p in (tmp_path / "ws").iterdir() if p.name.startswith(f"{stem}-"))


def attempts(ws: Path) -> list[tuple[int, str]]:
    lines = (ws / "attempts.jsonl").read_text().splitlines()
    return [(a["shot"], a["status"]) for a in map(json.loads, lines)]


def shot_folder(ws: Path, index: int) -> Path:
    return next((ws / "shots").glob(f"{index:04d}-*"))


# ---------------------------------------------------------------------- class 1: markers in their place


def test_a_valid_marker_in_the_wrong_place_is_not_trusted(tmp_path: Path, logged: list[str]):
    cfg = config(tmp_path)
    a_src, a_dub = film(tmp_path, "a")
    b_src, b_dub = film(tmp_path, "b", seed=7)  # other pixels, same shot layout
    first = decode_all(dub(a_src, a_dub, tmp_path / "a.out.mp4", cfg))
    dub(b_src, b_dub, tmp_path / "b.out.mp4", cfg)
    a, b = ws_dir(tmp_path, "a"), ws_dir(tmp_path, "b")
    # shot 0: film b's marker copied in; shot 1: b's marker AND intermediate copied in; shot 2: a's own
    # shot 1 marker copied over shot 2's (same film, wrong index and key)
    shutil.copy(shot_folder(b, 0) / "done.json", shot_folder(a, 0) / "done.json")
    shutil.copy(shot_folder(b, 1) / "done.json", shot_folder(a, 1) / "done.json")
    shutil.copy(shot_folder(b, 1) / "shot.mkv", shot_folder(a, 1) / "shot.mkv")
    shutil.copy(shot_folder(a, 1) / "done.json", shot_folder(a, 2) / "done.json")
    (tmp_path / "a.out.mp4").unlink()
    logged.clear()
    assert np.array_equal(decode_all(dub(a_src, a_dub, tmp_path / "a.out.mp4", cfg)), first)
    assert attempts(a)[3:] == [(0, "done"), (1, "done"), (2, "done")]  # all three rendered again
    for i in range(3):
        marker = str(shot_folder(a, i) / "done.json")
        assert len([m for m in logged if marker in m and "copied from elsewhere" in m]) == 1, logged


def test_a_chunk_marker_from_another_shot_is_not_trusted(tmp_path: Path):
    from tasks.render.chunk_checkpoints import ChunkCheckpoints
    from tests.media import run_ffmpeg

    def segment(path: Path) -> None:
        run_ffmpeg(["-f", "lavfi", "-i", "testsrc=size=32x32:rate=25", "-frames:v", "3", "-c:v", "ffv1",
                    str(path)])  # fmt: skip

    theirs = ChunkCheckpoints(tmp_path / "0001-aaaa" / "shot.chunks", 2)
    theirs.folder.mkdir(parents=True)
    segment(theirs.segment(0))
    theirs.commit(0, 3, None)
    assert theirs.resume()[0] == 1  # their own marker holds
    ours = ChunkCheckpoints(tmp_path / "0002-bbbb" / "shot.chunks", 2)
    ours.folder.mkdir(parents=True)
    for name in ("chunk_0000.mkv", "chunk_0000.done"):
        shutil.copy(theirs.folder / name, ours.folder / name)
    assert ours.resume()[0] == 0  # copied from another shot's folder: computed again
    assert not (ours.folder / "chunk_0000.done").exists()


# ------------------------------------------------------------ class 2: damaged run files never jam a re-run


def test_damaged_run_files_are_set_aside_and_rebuilt(tmp_path: Path, logged: list[str]):
    cfg, (src, audio) = config(tmp_path), film(tmp_path)
    out = tmp_path / "o.mp4"
    first = decode_all(dub(src, audio, out, cfg))
    ws = ws_dir(tmp_path, "film")
    manifest, assembled = ws / "workspace.json", ws / "assembled.json"
    (shots,) = ws.glob("shots-*.json")
    manifest.write_bytes(b"\0" * manifest.stat().st_size)  # zero-filled (a crash of the file system)
    assembled.write_bytes(assembled.read_bytes()[:20])  # truncated
    shots.write_text("[]")  # JSON, but not a shot partition
    logged.clear()
    assert np.array_equal(decode_all(dub(src, audio, out, cfg)), first)
    assert attempts(ws) == [(0, "done"), (1, "done"), (2, "done")]  # nothing rendered twice: markers held
    for damaged in (manifest, assembled, shots):
        assert len([m for m in logged if m.startswith(f"{damaged}: ") and "set aside" in m]) == 1, logged
        assert len(list(ws.glob(f"{damaged.name}.bad-*"))) == 1
    # a partition that does not tile the film (valid JSON, right keys) is not trusted either
    shots.write_text(json.dumps({"fps": "24000/1001", "frame_count": 30,
                                 "shots": [{"index": 0, "start_frame": 0, "end_frame": 12}]}))  # fmt: skip
    assert np.array_equal(decode_all(dub(src, audio, out, cfg)), first)
    assert len(list(ws.glob(f"{shots.name}.bad-*"))) == 2
    partition = json.loads(shots.read_text())["body"]  # bound to the film it was detected in (issue 47)
    assert partition["frame_count"] == 30 and len(partition["shots"]) == 3


# ---------------------------------------------------- class 3: no write escapes the output roots or clobbers


def when_rendering(ws_root: Path, action) -> threading.Thread:
    """Run `action` once the first shot of a run under `ws_root` is done (mid-run, after every start check)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while not list(ws_root.glob("*/attempts.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.02)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_sidecars_never_replace_a_users_files_nor_follow_a_planted_symlink(tmp_path: Path, monkeypatch):
    from tasks.errors import OutputError

    films, outside = tmp_path / "films", tmp_path / "outside"
    films.mkdir(), outside.mkdir()
    monkeypatch.setenv(ROOTS_ENV, str(films))
    src, audio = film(films)
    cfg = config(tmp_path, timeline={"edl": True})
    out = films / "o.mp4"
    for name in ("o.otio", "o.edl"):  # the user's own files of those names
        (films / name).write_text("my edit\n")
        with pytest.raises(OutputError, match=rf"{name}: exists and was not written by dubflow"):
            dub(src, audio, out, cfg)
        assert (films / name).read_text() == "my edit\n" and not out.exists()  # refused before any work
        (films / name).unlink()
    for name in (".o.otio.tmp", ".o.edl.tmp", ".o.otio.dubflow.json"):  # planted at temp / record paths
        (films / name).symlink_to(outside / f"victim-{name}")
    dub(src, audio, out, cfg)
    assert not list(outside.iterdir())  # nothing written through a symlink
    first = (films / "o.otio").read_text()
    assert dub(src, audio, out, {**cfg, "color": {"strength": 0.5}}) == str(out)  # dubflow's own: replaced
    assert (films / "o.otio").read_text() != first and written_record(films / "o.otio") is not None
    assert not list(films.glob(".o.mp4.dubflow-tmp-*"))  # no staging folder left
    assert not (films / ".o.mp4.dubflow.lock").exists()  # the output's lock is removed with the run


def test_the_final_rename_checks_the_folder_and_the_file_again(tmp_path: Path, monkeypatch):
    from tasks.errors import OutputError

    films, outside = tmp_path / "films", tmp_path / "outside"
    (films / "dest").mkdir(parents=True), outside.mkdir()
    monkeypatch.setenv(ROOTS_ENV, str(films))
    src, audio = film(films)
    cfg, out = config(tmp_path), films / "dest" / "o.mp4"

    def swap_folder() -> None:  # the output folder replaced by a symlink leading out of the roots
        (films / "dest").rename(films / "dest.moved")
        (films / "dest").symlink_to(outside)

    watcher = when_rendering(tmp_path / "ws", swap_folder)
    with pytest.raises(OutputError, match="output folder was replaced during the run"):
        dub(src, audio, out, cfg)
    watcher.join()
    assert not list(outside.iterdir())  # nothing delivered outside the roots
    (films / "dest").unlink()
    (films / "dest.moved").rename(films / "dest")
    shutil.rmtree(tmp_path / "ws")

    watcher = when_rendering(tmp_path / "ws", lambda: out.write_text("created meanwhile\n"))
    with pytest.raises(OutputError, match="a file was created at the output path during the run"):
        dub(src, audio, out, cfg)
    watcher.join()
    assert out.read_text() == "created meanwhile\n"


def test_two_films_with_the_same_out_never_clobber_each_other(tmp_path: Path):
    from tasks.errors import DubflowError

    cfg, out = config(tmp_path), tmp_path / "same.mp4"
    films = [film(tmp_path, "a"), film(tmp_path, "b", seed=7)]
    errors: list[Exception] = []

    def run(src: Path, audio: Path) -> None:
        try:
            dub(src, audio, out, cfg)
        except DubflowError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=f) for f in films]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1, errors  # one delivered, the other refused with one line
    assert re.search(r"same.mp4 is in use by pid \d+|another film or pass", str(errors[0])), errors
    ok = decode_all(out)
    assert any(
        np.array_equal(ok, decode_all(dub(s, a, tmp_path / f"{s.stem}.ref.mp4", cfg))) for s, a in films
    )


# --------------------------------------------------------- class 4: inputs replaced while the shots render


@pytest.mark.parametrize("which", ["dub", "source"])
def test_an_input_replaced_mid_run_stops_the_run_before_assembling(tmp_path: Path, which: str):
    from tasks.errors import DubflowError

    cfg, (src, audio) = config(tmp_path), film(tmp_path)
    out = tmp_path / "o.mp4"
    target = audio if which == "dub" else src

    def replace() -> None:  # another take of the same length, moved into place (a new inode)
        other = tmp_path / f"other{target.suffix}"
        if which == "dub":
            make_audio(other, probe(src).video_duration_s, rate=22050)
        else:
            make_clip(other, (10, 10, 10), seed=3)
        other.replace(target)

    watcher = when_rendering(tmp_path / "ws", replace)
    # the dub: stopped before assembling; the source: each shot still to render refuses it (issue 47)
    with pytest.raises(DubflowError, match=rf"{target.name}: .*changed during the run \(.*\)"):
        dub(src, audio, out, cfg)
    watcher.join()
    assert not out.exists()
    assert probe(dub(src, audio, out, cfg)).frame_count == 30  # a re-run dubs the file as it is now


# ------------------------------------------------------------------ class 6: a kill during the final encode


def _ffmpeg_writing(folder: Path, marker: str) -> list[int]:
    """Pids of live (not zombie) ffmpeg final encodes whose command line names `marker` under `folder`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if "ffmpeg" in cmd and "concat" in cmd and marker in cmd and str(folder) in cmd and state != "Z":
            pids.append(int(proc.name))
    return pids


def test_a_run_killed_in_its_final_encode_leaves_no_ffmpeg_and_no_temp(tmp_path: Path):
    src = make_clip(tmp_path / "film.mp4", (40, 40, 40), size=(640, 360))
    audio = make_audio(tmp_path / "dub.wav", probe(src).video_duration_s)
    cfg, out = config(tmp_path), tmp_path / "o.mp4"
    before = dub(src, audio, out, cfg)
    old = Path(before).read_bytes()
    slow = {**cfg, "encode": {"preset": "veryslow", "crf": 10}}  # another encode: the output is re-encoded
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\nfrom flows.dub_film import dub_film_inline\n"
        f"dub_film_inline({str(src)!r}, {str(audio)!r}, {str(out)!r}, config=json.loads(sys.argv[1]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, str(script), json.dumps(slow)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline, pids = time.monotonic() + 180, []
        while not pids and child.poll() is None and time.monotonic() < deadline:
            pids = _ffmpeg_writing(tmp_path, ".o.mp4.dubflow-tmp-")
            time.sleep(0.005)
        assert pids, "the final encode was not seen"
        child.kill()  # SIGKILL: no finally, no clean-up in the run itself
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    time.sleep(0.5)  # the encode alone takes seconds: an orphaned encoder would still be writing
    assert not _ffmpeg_writing(tmp_path, ".o.mp4.dubflow-tmp-")  # the encoder died with its parent
    assert out.read_bytes() == old  # the old output is intact
    assert list(tmp_path.glob(".o.mp4.dubflow-tmp-*"))  # what the killed run left
    assert dub(src, audio, out, slow) == str(out)  # the next run of that output cleans it up
    assert not list(tmp_path.glob(".o.mp4.dubflow-tmp-*")) and out.read_bytes() != old


# ------------------------------------------------------ class 5: a 10-hour dub track is refused from its header


def _silent_wav(path: Path, seconds: int, rate: int = 16000) -> Path:
    """A 16-bit mono WAV of `seconds` of silence, written sparse (a 10-hour track costs no disk)."""
    data = seconds * rate * 2
    header = b"RIFF" + (36 + data).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    header += (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + rate.to_bytes(4, "little")
    header += (rate * 2).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    with path.open("wb") as fh:
        fh.write(header + b"data" + data.to_bytes(4, "little"))
        fh.truncate(44 + data)
    return path


def test_a_ten_hour_dub_track_is_refused_from_its_header_and_trimmed_streaming(tmp_path: Path):
    import tracemalloc
    from fractions import Fraction

    from tasks.config.pipeline import load_config
    from tasks.errors import AudioLengthError
    from tasks.media.audio import check_mix, prepare_dialogue

    long = _silent_wav(tmp_path / "ten-hours.wav", 10 * 3600)
    fps, frames = Fraction(24000, 1001), 720  # a 30 s picture
    cfg = load_config().audio
    wav = tmp_path / "dialogue.wav"
    tracemalloc.start()
    try:
        with pytest.raises(
            AudioLengthError, match=r"ten-hours.wav: audio is 36000.000 s by its header.*before decoding"
        ):
            prepare_dialogue(long, frame_count=frames, fps=fps, cfg=cfg, out_wav=wav)
        with pytest.raises(AudioLengthError, match="by its header"):
            check_mix(long, frame_count=frames, fps=fps, policy="error")
        assert not wav.exists()
        trim = dataclasses.replace(cfg, length_policy="trim")
        track = prepare_dialogue(long, frame_count=frames, fps=fps, cfg=trim, out_wav=wav)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert track.action == "trim" and track.n_samples == 480480  # 720 frames at 24000/1001, 16 kHz
    assert sf.info(str(wav)).frames == 480480
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB traced: the track was not streamed"  # whole: 2.3 GB
    # a track of the right length still passes, and a short one pads as before
    ok = make_audio(tmp_path / "ok.wav", float(frames / fps))
    assert prepare_dialogue(ok, frame_count=frames, fps=fps, cfg=cfg, out_wav=wav).action == "ok"
    assert np.abs(sf.read(str(wav))[0] - sf.read(str(ok))[0]).max() < 1e-4
    short = make_audio(tmp_path / "short.wav", 29.0)
    pad = dataclasses.replace(cfg, length_policy="pad")
    assert prepare_dialogue(short, frame_count=frames, fps=fps, cfg=pad, out_wav=wav).n_samples == 480480


# ---------------------------------------------------------- class 8: VFR with duplicate timestamps


def test_vfr_with_duplicate_timestamps_keeps_its_real_duration(tmp_path: Path):
    from tests.media import run_ffmpeg, shot_frames

    frames = shot_frames((20, 20))
    src = tmp_path / "dup.mkv"  # every 4th frame shares the timestamp of the one before (mkv keeps both)
    run_ffmpeg(["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", "128x72", "-framerate", "24", "-i", "-",
                "-vf", "setpts='(N-floor(N/4))/24/TB'", "-fps_mode", "passthrough", "-c:v", "libx264",
                "-bf", "0", "-pix_fmt", "yuv420p", str(src)], frames.tobytes())  # fmt: skip
    info = probe(src)
    real = 31 / 24  # 31 distinct timestamps 1/24 s apart: what a player shows of the 40 frames
    assert info.frame_count == 40 and info.vfr
    assert abs(info.video_duration_s - real) < 0.002, (info.fps, info.video_duration_s)
    audio = make_audio(tmp_path / "dub.wav", real)  # a dub of the right length is accepted as it is
    out = dub(src, audio, tmp_path / "o.mp4", config(tmp_path))
    got = probe(out)
    assert got.frame_count == 40 and abs(got.video_duration_s - real) < 0.01  # not slowed down


# ------------------------------------------------- class 9: a run parameter cannot move the workspace anywhere


@pytest.mark.usefixtures("prefect_harness")
def test_a_workspace_root_from_run_parameters_is_confined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from flows.dub_film import dub_film, dub_group
    from tasks.run.workspace_roots import WS_ROOTS_ENV

    monkeypatch.delenv(
        WS_ROOTS_ENV, raising=False
    )  # the default roots: ./workspace, $DUBFLOW_WORKSPACE, film's folder
    monkeypatch.delenv("DUBFLOW_WORKSPACE", raising=False)
    films, elsewhere = tmp_path / "films", tmp_path / "elsewhere"
    films.mkdir()
    src, audio = film(films, lengths=(10,))
    cfg = {**config(tmp_path), "workspace": {"root": str(elsewhere / "ws")}}
    state = dub_film(
        str(src), str(audio), str(films / "o.mp4"), config=cfg, fanout="local", return_state=True
    )
    assert state.is_failed()
    with pytest.raises(
        Exception, match=r"^workspace.root: .*outside the workspace roots .*DUBFLOW_WORKSPACE_ROOTS"
    ):
        state.result()
    ws = {"root": str(elsewhere), "key": "film-0123456789abcdef", "incarnation": "0123456789ab"}
    state = dub_group(
        ws, {"source": str(src), "config": cfg}, [], return_state=True
    )  # the group's own parameter
    assert state.is_failed() and "outside the workspace roots" in str(state.result(raise_on_failure=False))
    assert not elsewhere.exists()  # nothing was created there
    monkeypatch.setenv(WS_ROOTS_ENV, str(elsewhere))  # the host allows it
    assert (
        probe(dub_film(str(src), str(audio), str(films / "o.mp4"), config=cfg, fanout="local")).frame_count
        == 10
    )
    assert list((elsewhere / "ws").glob("film-*/workspace.json"))
