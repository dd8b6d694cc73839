"""Trust, round two (issue 47): records that prove authorship, caches bound to what made them, inputs read
as they were checked, regular files with size bounds, every writer through the delivery rules, locks over
everything an output delivers, validation before the first expensive step, nothing created before its
check. Real files, real ffmpeg, real processes; the passthrough backend (a dry run: nothing is dubbed)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tasks.errors import ConfigError, DubflowError, OutputError
from tasks.media.deliver import record_path, written_record
from tasks.media.probe import probe
from tasks.run.outputs import ROOTS_ENV
from tests.media import decode_all, make_audio, make_clip
from tests.test_trust import config, dub, film  # the same small films as round one

REPO = Path(__file__).resolve().parents[1]


def ws_dir(root: Path, stem: str) -> Path:
    return next(p for p in root.iterdir() if p.name.startswith(f"{stem}-"))


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    monkeypatch.setenv("DUBFLOW_OUT_DIR", str(tmp_path / "out"))


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240):
    """`dubflow ARGS` in a process of its own: (exit status, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip
    return proc.returncode, proc.stderr


# --------------------------------------------------------- class 1: a delivery record proves its authorship


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user (chown)")
def test_a_record_written_by_another_user_never_makes_their_file_replaceable(tmp_path: Path):
    cfg, (src, audio) = config(tmp_path), film(tmp_path)
    key = written_record(dub(src, audio, tmp_path / "ref.mp4", cfg))["key"]
    # another user's own cut, with a hidden record that claims dubflow wrote it for this very workspace
    theirs = tmp_path / "o.mp4"
    theirs.write_bytes(b"their own cut\n" * 100)
    st = theirs.stat()
    body = theirs.read_bytes()
    forged = {"file": theirs.name, "size": len(body), "sha256": hashlib.sha256(body).hexdigest(), "key": key,
              "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "previous": None}  # fmt: skip
    record_path(theirs).write_text(json.dumps(forged))
    for p in (theirs, record_path(theirs)):
        os.chown(p, 65534, 65534)
    assert written_record(theirs) is None  # their record proves nothing about who wrote the file
    with pytest.raises(OutputError, match="o.mp4: exists and was not written by dubflow"):
        dub(src, audio, theirs, cfg)
    assert theirs.read_bytes() == body


def test_an_edit_in_place_with_its_mtime_restored_is_neither_up_to_date_nor_replaced(tmp_path: Path):
    cfg, (src, audio) = config(tmp_path), film(tmp_path)
    out = Path(dub(src, audio, tmp_path / "o.mp4", cfg))
    st = out.stat()
    data = bytearray(out.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # a same-size edit of the picture
    with out.open("r+b") as fh:  # in place: the same inode
        fh.write(data)
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back
    assert written_record(out) is None  # the record no longer matches: not dubflow's any more
    with pytest.raises(OutputError, match="o.mp4: exists and was not written by dubflow"):
        dub(src, audio, out, cfg)  # neither "up to date" (kept as if dubflow's) ...
    with pytest.raises(OutputError, match="o.mp4: exists and was not written by dubflow"):
        dub(src, audio, out, {**cfg, "color": {"strength": 0.5}})  # ... nor replaced by another pass
    assert out.read_bytes() == bytes(data)


# ------------------------------------------------------------- class 3: caches bound to what made them


def _frames_equal(a: str | Path, b: str | Path) -> bool:
    return np.array_equal(decode_all(a), decode_all(b))


def test_a_swapped_shot_segment_is_encoded_again_not_delivered(tmp_path: Path):
    cfg, (src, audio) = config(tmp_path), film(tmp_path)
    first = dub(src, audio, tmp_path / "a.mp4", cfg)
    segments = sorted((ws_dir(tmp_path / "ws", "film") / "segments").glob("*.mov"))
    assert len(segments) == 3
    shutil.copy(segments[0], segments[1])  # another shot's segment, same frame count, under this one's name
    second = dub(src, audio, tmp_path / "b.mp4", cfg)  # a second deliverable joins the kept segments
    assert _frames_equal(first, second)


def test_a_shot_partition_from_another_film_is_detected_again(tmp_path: Path):
    cfg = config(tmp_path)
    a_src, a_dub = film(tmp_path, "a", (10, 10, 10))
    b_src, b_dub = film(tmp_path, "b", (5, 20, 5), seed=7)
    dub(a_src, a_dub, tmp_path / "a.out.mp4", cfg)
    dub(b_src, b_dub, tmp_path / "b.out.mp4", cfg)
    a, b = ws_dir(tmp_path / "ws", "a"), ws_dir(tmp_path / "ws", "b")
    (mine,), (theirs,) = a.glob("shots-*.json"), b.glob("shots-*.json")
    assert mine.name == theirs.name  # the same detection settings: the same file name
    shutil.copy(theirs, mine)  # valid JSON, tiles 30 frames, but film b's cuts
    dub(a_src, a_dub, tmp_path / "a2.out.mp4", cfg)

    def edges(path: Path) -> list[int]:
        from tasks.run.run_files import read_run_file

        data = read_run_file(path)
        data = data.get("body", data)
        return [s["start_frame"] for s in data["shots"]]

    assert edges(mine) == [0, 10, 20]  # film a's own cuts, detected again
    assert len(list(a.glob(f"{mine.name}.bad-*"))) == 1  # the foreign one set aside


def test_a_face_analysis_of_another_film_is_not_reused(tmp_path: Path):
    from tasks.config.pipeline import load_config
    from tasks.decision.shot_decision import decide_shot, faces_path
    from tests.speaker_cases import FPS, SR, cases, encode, faceless

    case, n, cfg = cases()["speaker_left"], 30 * SR // FPS, load_config()
    speaker = probe(encode(tmp_path / "a.mp4", case.frames[:30], case.audio[:n]))
    nobody = probe(encode(tmp_path / "b.mp4", faceless(30), case.audio[:n]))  # the same span, no face
    mine, theirs = faces_path(tmp_path / "wb", 0, 0, 30, cfg), faces_path(tmp_path / "wa", 0, 0, 30, cfg)
    assert decide_shot(0, 0, 30, speaker, case.audio[:n], SR, cfg, theirs).faces.tracks
    mine.parent.mkdir(parents=True)
    shutil.copy(theirs, mine)  # film a's analysis under film b's cache name (same frames, same settings)
    got = decide_shot(0, 0, 30, nobody, case.audio[:n], SR, cfg, mine)
    assert not got.faces.tracks and got.reason == "no face found"  # film b analysed itself
    assert decide_shot(0, 0, 30, nobody, case.audio[:n], SR, cfg, mine) == got  # and its own cache reused


# --------------------------------------------------- class 4: what is rendered from a swapped input is never kept


def test_shots_rendered_while_the_source_was_swapped_are_never_reused(tmp_path: Path):
    lengths = (10,) * 6
    src = make_clip(tmp_path / "film.mp4", lengths)
    audio = make_audio(tmp_path / "dub.wav", probe(src).video_duration_s)
    other = make_clip(tmp_path / "other.mp4", lengths, seed=3)  # another take, the same shot layout
    aside = tmp_path / "film.orig"
    reference = dub(
        src, audio, tmp_path / "ref.mp4", config(tmp_path, workspace={"root": str(tmp_path / "w0")})
    )
    cfg = config(tmp_path)

    def swap() -> None:  # once the first shot's folder exists: the keys are made, shots are rendering
        deadline = time.monotonic() + 120
        while not list((tmp_path / "ws").glob("*/shots")) and time.monotonic() < deadline:
            time.sleep(0.002)
        src.rename(aside)
        other.rename(src)

    watcher = threading.Thread(target=swap, daemon=True)
    watcher.start()
    with pytest.raises(DubflowError, match="film.mp4"):
        dub(src, audio, tmp_path / "o.mp4", cfg)
    watcher.join()
    aside.replace(src)  # the original back: the same file, the same fingerprint, the same shot keys
    assert _frames_equal(dub(src, audio, tmp_path / "o.mp4", cfg), reference)


# ------------------------------------------------------ class 5: regular files only, documents of bounded size


def _unblock(fifo: Path) -> None:
    """Give a reader still blocked on `fifo` (an orphaned child of a killed run) its end of file."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_given_as_an_input_is_refused_at_once_never_waited_on(tmp_path: Path):
    src, audio = film(tmp_path)
    fifo = tmp_path / "plan.yaml"
    os.mkfifo(fifo)
    try:  # the local command, its shot plan a FIFO
        code, err = cli("dub", str(src), "--audio", str(audio), "--out", str(tmp_path / "o.mp4"), "--plan",
                        str(fifo), "--no-prefect", "--backend", "passthrough", cwd=tmp_path, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("dubflow dub waited on a FIFO given as --plan for 60 s")
    finally:
        _unblock(fifo)
    assert code == 1 and f"dubflow: error: {fifo}: " in err and "not a regular file (a FIFO)" in err, err
    fifo.unlink()
    os.mkfifo(fifo.with_suffix(".mp4"))  # the flow (a deployment's `source` parameter), the film a FIFO
    run = (
        "import sys; from flows.dub_film import dub_film_inline\n"
        "try:\n    dub_film_inline(sys.argv[1], sys.argv[2], sys.argv[3], config={'backend': {'name': 'passthrough'}})\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", run, str(fifo.with_suffix(".mp4")), str(audio), str(tmp_path / "o.mp4")],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("dub-film waited on a FIFO given as the film for 60 s")
    finally:
        _unblock(fifo.with_suffix(".mp4"))
    assert proc.stdout.strip().endswith(f"{fifo.with_suffix('.mp4')}: not a regular file (a FIFO)"), proc


def test_a_small_yaml_document_cannot_expand_without_limit(tmp_path: Path):
    from tasks.config.pipeline import load_config
    from tasks.decision.plan_file import read_plan

    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)
    ]  # 10^6 leaves, 300 bytes
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("backend:\n  options:\n" + "".join(f"    {line}\n" for line in lines))
    with pytest.raises(ConfigError, match=r"bomb.yaml: .*aliases"):
        load_config(bomb)
    plan = tmp_path / "plan.yaml"
    plan.write_text("format: dubflow-shot-plan/1\n" + "\n".join(lines) + "\nshots: [*a5]\n")
    with pytest.raises(ConfigError, match=r"plan.yaml: .*aliases"):
        read_plan(plan)
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:  # 100 MB of comment: not a config anyone wrote
        fh.truncate(100 << 20)
    with pytest.raises(ConfigError, match=r"big.yaml: .*larger than"):
        load_config(big)


# ------------------------------------------------------ class 2: every command that writes follows the rules


def test_dubflow_plan_never_writes_over_an_input_or_a_users_file(tmp_path: Path):
    src, audio = film(tmp_path, lengths=(10, 10))
    before = {p: p.read_bytes() for p in (src, audio)}
    mine = tmp_path / "notes.yaml"
    mine.write_text("my own notes\n")
    args = ["--set", "backend.name=passthrough"]
    for target in (src, audio, mine):
        code, err = cli("plan", str(src), "--audio", str(audio), "--out", str(target), *args, cwd=tmp_path)
        assert code == 1 and f"dubflow: error: {target}: " in err, err
    assert {p: p.read_bytes() for p in (src, audio)} == before and mine.read_text() == "my own notes\n"
    plan = tmp_path / "shots.yaml"
    for _ in range(2):  # dubflow's own plan file is replaced by the next `dubflow plan`
        code, err = cli("plan", str(src), "--audio", str(audio), "--out", str(plan), *args, cwd=tmp_path)
        assert code == 0, err
        assert written_record(plan) is not None
    plan.write_text(plan.read_text() + "# my edit\n")  # edited: the user's work now
    code, err = cli("plan", str(src), "--audio", str(audio), "--out", str(plan), *args, cwd=tmp_path)
    assert code == 1 and "was not written by dubflow" in err and plan.read_text().endswith("# my edit\n")


def test_weights_download_never_writes_over_a_users_file_and_checks_before_fetching(tmp_path: Path):
    """`dubflow weights download --to` (a process, the Hub client offline: nothing may reach the network):
    a file of the user's at a path the download writes is refused by name before anything is created or
    fetched; `--to` a file is refused; a fetch that fails leaves no staging folder and no lock behind."""
    root = tmp_path / "models"
    theirs = root / "Wan2.1-I2V-14B-480P" / "config.json"  # the first file the 480P download writes
    theirs.parent.mkdir(parents=True)
    theirs.write_text('{"my": "own config"}\n')
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code, err = cli("weights", "download", "--to", str(root), cwd=tmp_path, env=offline)
    assert code == 1 and f"dubflow: error: {theirs}: " in err and "was not written by dubflow" in err, err
    assert theirs.read_text() == '{"my": "own config"}\n'
    assert sorted(p.name for p in root.rglob("*")) == ["Wan2.1-I2V-14B-480P", "config.json"]  # nothing added
    assert not (tmp_path / "hf").exists()  # the Hub client never ran
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, err = cli("weights", "download", "--to", str(afile / "w"), cwd=tmp_path, env=offline)
    assert code == 1 and f"{afile} is not a folder" in err, err
    fresh = tmp_path / "fresh"
    code, err = cli("weights", "download", "--to", str(fresh), cwd=tmp_path, env=offline)
    assert code == 1, err  # offline: the fetch fails, after the checks
    assert list(fresh.iterdir()) == []  # no staging folder, no lock, no part of a file


def test_a_folder_fill_is_delivered_whole_with_records_never_over_a_users_file(tmp_path: Path):
    """`tasks.run.outputs.delivered_folder` (the weights download's writer) with a real fill: files appear
    only when the fill ends, each with its record; a later fill replaces dubflow's own files, but a file the
    user changed since stops it before any file moves; a failed fill or a planted link delivers nothing."""
    from tasks.run.outputs import delivered_folder

    root = tmp_path / "w"

    def fill(**files: bytes) -> None:
        with delivered_folder(root, "weights:test", stem="weights") as staged:
            for rel, data in files.items():
                (staged / rel.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
                (staged / rel.replace("__", "/")).write_bytes(data)
                target = root / rel.replace("__", "/")
                assert not target.exists() or target.read_bytes() != data  # not delivered while staging
            (staged / ".cache").mkdir()
            (staged / ".cache" / "meta").write_text("the writer's own bookkeeping")

    fill(a__x_bin=b"one", b__c__y_bin=b"two")
    x, y = root / "a" / "x_bin", root / "b" / "c" / "y_bin"
    assert x.read_bytes() == b"one" and y.read_bytes() == b"two"
    assert written_record(x)["key"] == "weights:test" and written_record(y)["sha256"]
    assert sorted(p.name for p in root.iterdir()) == ["a", "b"]  # no .cache, staging folder or lock left
    fill(a__x_bin=b"ONE", b__c__y_bin=b"TWO")  # dubflow's own files: replaced
    assert x.read_bytes() == b"ONE" and y.read_bytes() == b"TWO"
    y.write_bytes(b"the user's edit")
    with pytest.raises(OutputError, match="y_bin: exists and was not written by dubflow"):
        fill(a__x_bin=b"1", b__c__y_bin=b"2")
    assert x.read_bytes() == b"ONE" and y.read_bytes() == b"the user's edit"  # checked before any moved
    with (
        pytest.raises(RuntimeError, match="cut off"),
        delivered_folder(root, "weights:t", stem="weights") as staged,
    ):
        (staged / "z_bin").write_bytes(b"half")
        raise RuntimeError("cut off")
    assert not (root / "z_bin").exists() and sorted(p.name for p in root.iterdir()) == ["a", "b"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "d").symlink_to(elsewhere)
    with pytest.raises(OutputError, match="refusing to write through it"):
        fill(d__q_bin=b"out")
    assert list(elsewhere.iterdir()) == []


# ---------------------------------------------------- class 8: the lock and --overwrite cover every file delivered


def test_overwrite_of_one_output_never_replaces_another_outputs_sidecars(tmp_path: Path):
    cfg = config(tmp_path)
    a_src, a_dub = film(tmp_path, "a")
    b_src, b_dub = film(tmp_path, "b", seed=7)
    dub(a_src, a_dub, tmp_path / "x.mp4", cfg)
    sidecars = {p: p.read_bytes() for p in (tmp_path / "x.otio", tmp_path / "x.dub.wav")}
    with pytest.raises(OutputError, match=r"x\.(otio|dub\.wav): .*delivered with .*x\.mp4"):
        dub(b_src, b_dub, tmp_path / "x.mkv", cfg, overwrite=True)
    assert {p: p.read_bytes() for p in sidecars} == sidecars and not (tmp_path / "x.mkv").exists()
    assert not list((tmp_path / "ws").glob("b-*"))  # refused before any work


def test_two_outputs_sharing_sidecars_never_run_at_once(tmp_path: Path):
    cfg = config(tmp_path)
    films = [film(tmp_path, "a"), film(tmp_path, "b", seed=7)]
    errors: list[Exception] = []

    def run(src: Path, audio: Path, out: Path) -> None:
        try:
            dub(src, audio, out, cfg)
        except DubflowError as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(*films[0], tmp_path / "x.mp4")),
        threading.Thread(target=run, args=(*films[1], tmp_path / "x.mkv")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1, errors
    assert "is in use by pid" in str(errors[0]) or "delivered with" in str(errors[0]), errors
    # what was delivered is one output whole: its film and its sidecars, none of the other's
    delivered = [p for p in (tmp_path / "x.mp4", tmp_path / "x.mkv") if p.exists()]
    assert len(delivered) == 1
    film_of = {"x.mp4": "a", "x.mkv": "b"}
    for sidecar in (tmp_path / "x.otio", tmp_path / "x.dub.wav"):
        assert written_record(sidecar)["output"] == delivered[0].name
    assert json.loads((tmp_path / "x.otio").read_text())["name"] == film_of[delivered[0].name]


# ------------------------------------------------ class 6: every value validated before the first expensive step


def test_a_bad_backend_option_fails_before_any_work(tmp_path: Path):
    src, audio = film(tmp_path)
    cfg = {**config(tmp_path), "backend": {"name": "infinitetalk"}, "infinitetalk": {"vae_tile_px": 48}}
    with pytest.raises(ConfigError, match="infinitetalk.vae_tile_px"):
        dub(src, audio, tmp_path / "o.mp4", cfg)
    assert not (tmp_path / "ws").exists()  # nothing probed, decoded or created


def test_an_output_name_whose_derived_names_are_too_long_fails_before_any_work(tmp_path: Path):
    src, audio = film(tmp_path)
    out = tmp_path / ("o" * 236 + ".mp4")  # 240 bytes: legal itself, but not its staging folder's name
    with pytest.raises(OutputError, match="too long"):
        dub(src, audio, out, config(tmp_path))
    assert not (tmp_path / "ws").exists() and not out.exists()


# -------------------------------------------------------- class 7: nothing created before the check refusing it


def test_a_refused_workspace_root_is_never_created(tmp_path: Path):
    films, elsewhere = tmp_path / "films", tmp_path / "elsewhere"
    films.mkdir()
    src, audio = film(films)
    code, err = cli(
        "dub", str(src), "--audio", str(audio), "--out", str(films / "o.mp4"), "--no-prefect",
        "--backend", "passthrough", "--set", f"workspace.root={elsewhere / 'ws'}",
        cwd=films, env={"DUBFLOW_WORKSPACE_ROOTS": str(films), "DUBFLOW_WORKSPACE": ""},
    )  # fmt: skip
    assert code == 1 and "outside the workspace roots" in err, err
    assert not elsewhere.exists()  # not even the run's log folder
    assert not (films / "o.mp4").exists()


def _bad_plan(path: Path, **shot) -> Path:
    """A shot plan naming shot 1 (0-10) of the small films, with `shot`'s fields over that entry."""
    entry = {"index": 1, "start_frame": 10, "end_frame": 20, "override": {"dub": "auto"}, **shot}
    path.write_text(json.dumps({"format": "dubflow-shot-plan/1", "shots": [entry]}))  # JSON is YAML
    return path


def test_a_bad_plan_file_leaves_no_output_folder_behind(tmp_path: Path):
    """A plan file with an invalid field (the deployment's path: no CLI check before the flow) or written for
    another film (found only once the film's shots are) is refused before anything is created where the
    output goes: not its folder, not a lock in it."""
    src, audio = film(tmp_path)
    invalid = _bad_plan(tmp_path / "invalid.yaml", override={"dub": "auto", "sed": 3})
    with pytest.raises(ConfigError, match="unknown override field 'sed'"):
        dub(src, audio, tmp_path / "a" / "o.mp4", config(tmp_path), plan=str(invalid))
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "ws").exists()  # refused before the workspace too: nothing probed or decoded
    other = _bad_plan(tmp_path / "other.yaml", index=7, start_frame=70, end_frame=80)
    code, err = cli(
        "dub", str(src), "--audio", str(audio), "--out", str(tmp_path / "b" / "o.mp4"), "--plan", str(other),
        "--no-prefect", "--backend", "passthrough", "--set", f"workspace.root={tmp_path / 'ws'}", cwd=tmp_path,
    )  # fmt: skip
    assert code == 1 and f"{other}: shot 7: no such shot" in err, err
    assert not (tmp_path / "b").exists()
