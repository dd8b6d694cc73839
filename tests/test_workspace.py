"""Run workspace: keys, layout, shot markers and atomic writes, on real files."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import pytest

from tasks.files import WorkspaceError, atomic_path, atomic_write_bytes, atomic_write_json
from tasks.run.workspace import (
    MIB,
    Workspace,
    config_hash,
    film_fingerprint,
    mark_shot_done,
    mark_shot_failed,
    open_workspace,
    read_shot_done,
    read_shot_failed,
    shot_done,
    verify_shot_done,
)
from tests.media import sha256

CONFIG = {
    "shots": {"threshold": 27.0, "min_shot_frames": 1},
    "backend": "passthrough",
    "fps": Fraction(24000, 1001),
}


@pytest.fixture
def film(tmp_path: Path) -> Path:
    path = tmp_path / "My Film (2024).mp4"
    path.write_bytes(os.urandom(3 * MIB))
    return path


def _rewrite(path: Path, offset: int, keep_mtime: bool = True) -> None:
    """Flip one byte at ``offset`` in place (same size), optionally restoring the mtime."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_fingerprint_sees_head_tail_size_and_mtime_but_not_the_middle(film: Path):
    base = film_fingerprint(film)
    assert film_fingerprint(film) == base
    _rewrite(film, 3 * MIB // 2)  # middle byte, same size and mtime: documented blind spot
    assert film_fingerprint(film) == base
    _rewrite(film, 3 * MIB - 1)  # last byte
    tail = film_fingerprint(film)
    assert tail != base
    _rewrite(film, 0)  # first byte
    head = film_fingerprint(film)
    assert head not in (base, tail)
    st = film.stat()
    os.utime(film, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched
    assert film_fingerprint(film) != head
    with film.open("ab") as fh:  # grown
        fh.write(b"x")
    assert len({film_fingerprint(film), head, tail, base}) == 4


def test_fingerprint_of_missing_film_names_it(tmp_path: Path):
    with pytest.raises(WorkspaceError, match=r"nope\.mp4: cannot fingerprint film"):
        film_fingerprint(tmp_path / "nope.mp4")


def test_config_hash_is_canonical_and_honours_exclude():
    @dataclasses.dataclass(frozen=True)
    class Shots:
        threshold: float
        min_shot_frames: int

    @dataclasses.dataclass(frozen=True)
    class Config:
        shots: Shots
        backend: str
        fps: Fraction

    as_dataclass = Config(Shots(27.0, 1), "passthrough", Fraction(24000, 1001))
    reordered = {
        "fps": Fraction(24000, 1001),
        "backend": "passthrough",
        "shots": {"min_shot_frames": 1, "threshold": 27.0},
    }
    assert config_hash(CONFIG) == config_hash(reordered) == config_hash(as_dataclass)
    assert config_hash(CONFIG) != config_hash({**CONFIG, "backend": "infinitetalk"})
    assert config_hash(CONFIG) != config_hash({**CONFIG, "fps": Fraction(25)})
    assert config_hash({**CONFIG, "out": "/a.mp4"}, exclude=["out"]) == config_hash(CONFIG)
    nested = {**reordered, "shots": {"min_shot_frames": 1, "threshold": 27.0, "workers": 4}}
    assert config_hash(nested, exclude=["shots.workers"]) == config_hash(CONFIG)  # dotted: one leaf only
    assert config_hash(nested, exclude=["shots.threshold"]) != config_hash(CONFIG)
    assert config_hash(CONFIG, exclude=["missing.key", "backend.x"]) == config_hash(CONFIG)
    assert nested["shots"]["workers"] == 4  # the caller's config is never modified
    with pytest.raises(TypeError, match="cannot hash a object"):
        config_hash({"x": object()})
    with pytest.raises(TypeError, match="expected a mapping or dataclass"):
        config_hash([1, 2])


def test_open_workspace_key_layout_and_reopen(tmp_path: Path, film: Path):
    root = tmp_path / "ws"
    ws = open_workspace(root, film, CONFIG, version="1.0+abc")
    assert ws.key.startswith("my-film-2024-") and len(ws.key) == len("my-film-2024-") + 16
    assert ws.path == root.resolve() / ws.key
    manifest = json.loads((ws.path / "workspace.json").read_text())
    assert manifest["film"] == str(film.resolve())
    assert manifest["version"] == "1.0+abc"
    assert manifest["fingerprint"] == film_fingerprint(film)
    assert manifest["incarnation"] == ws.incarnation
    assert ws.shot_dir(42, "k1") == ws.path / "shots" / "0042-k1"  # content-addressed: index + shot key
    assert ws.done_path(42, "k1") == ws.path / "shots" / "0042-k1" / "done.json"

    assert open_workspace(root, film, CONFIG, version="1.0+abc") == ws  # reopen: same incarnation too
    assert open_workspace(root, film, {**CONFIG, "out": "x"}, exclude=["out"], version="1.0+abc") == ws
    others = {
        open_workspace(root, film, {**CONFIG, "backend": "other"}, version="1.0+abc").key,
        open_workspace(root, film, CONFIG, version="1.1").key,
    }
    dub = tmp_path / "dub.wav"
    dub.write_bytes(b"RIFF" + os.urandom(1000))
    with_dub = open_workspace(root, film, CONFIG, inputs=[dub], version="1.0+abc")
    assert json.loads((with_dub.path / "workspace.json").read_text())["inputs"] == {
        str(dub.resolve()): film_fingerprint(dub)
    }
    others.add(with_dub.key)
    _rewrite(dub, 10)
    others.add(open_workspace(root, film, CONFIG, inputs=[dub], version="1.0+abc").key)
    _rewrite(film, 0)
    others.add(open_workspace(root, film, CONFIG, version="1.0+abc").key)
    assert len(others) == 5 and ws.key not in others
    assert Workspace.from_dict(json.loads(json.dumps(ws.as_dict()))) == ws
    with pytest.raises(ValueError, match="missing key 'incarnation'"):
        Workspace.from_dict({"root": "/r", "key": "k"})


def test_concurrent_opens_agree_and_a_wiped_workspace_gets_new_cache_keys(tmp_path: Path, film: Path):
    root = tmp_path / "ws"
    with ThreadPoolExecutor(8) as pool:
        opened = list(pool.map(lambda _: open_workspace(root, film, CONFIG, version="v"), range(16)))
    assert len(set(opened)) == 1
    ws = opened[0]
    key = ws.shot_cache_key(7, "planhash")
    assert key == open_workspace(root, film, CONFIG, version="v").shot_cache_key(7, "planhash")
    for path in sorted(ws.path.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    again = open_workspace(root, film, CONFIG, version="v")
    assert again.key == ws.key and again.incarnation != ws.incarnation
    assert again.shot_cache_key(7, "planhash") != key


def test_shot_markers(tmp_path: Path, film: Path):
    ws = open_workspace(tmp_path, film, CONFIG, version="v")
    assert not shot_done(ws, 3, "k1") and read_shot_done(ws, 3, "k1") is None
    assert read_shot_failed(ws, 3, "k1") is None
    mark_shot_failed(ws, 3, "k1", "CUDA out of memory")
    assert read_shot_failed(ws, 3, "k1")["reason"] == "CUDA out of memory"
    assert not shot_done(ws, 3, "k1")
    out = ws.shot_dir(3, "k1") / "shot.mkv"
    out.write_bytes(b"frames" * 100)
    file = {"file": "shot.mkv", "size": 600, "sha256": sha256(out), "frames": 1}
    mark_shot_done(ws, 3, "k1", {"output": str(out), "result": {"file": file}})
    assert shot_done(ws, 3, "k1") and not shot_done(ws, 3, "k2")  # another key: another result
    assert read_shot_done(ws, 3, "k1")["output"] == str(out) and verify_shot_done(ws, 3, "k1") is not None
    assert read_shot_failed(ws, 3, "k1") is None and not ws.failed_path(3, "k1").exists()
    assert not shot_done(ws, 4, "k1")
    assert sorted(p.name for p in ws.shot_dir(3, "k1").iterdir()) == [
        "done.json",
        "shot.mkv",
    ]  # no temp files


def test_a_damaged_shot_or_marker_means_not_done_never_a_stuck_state(tmp_path: Path, film: Path, caplog):
    ws = open_workspace(tmp_path, film, CONFIG, version="v")
    out = ws.shot_dir(1, "k") / "shot.mkv"

    def done(data: bytes = b"x" * 1000) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        file = {"file": out.name, "size": len(data), "sha256": sha256(out), "frames": 1}
        mark_shot_done(ws, 1, "k", {"output": str(out), "result": {"file": file}})

    done()
    out.write_bytes(b"x" * 999)  # truncated: a stat sees it
    assert not shot_done(ws, 1, "k") and not ws.done_path(1, "k").exists()
    assert any(str(out) in r.message and "truncated" in r.message for r in caplog.records)
    done()
    out.write_bytes(b"x" * 500 + b"y" * 24 + b"x" * 476)  # same size: only the hash sees it
    assert shot_done(ws, 1, "k") and verify_shot_done(ws, 1, "k") is None and not shot_done(ws, 1, "k")
    done()
    ws.done_path(1, "k").write_text('{"index": 1, "key')  # a torn marker
    assert read_shot_done(ws, 1, "k") is None and not ws.done_path(1, "k").exists()
    mark_shot_failed(ws, 1, "k", "boom")
    ws.failed_path(1, "k").write_text("{")
    assert read_shot_failed(ws, 1, "k") is None  # an unreadable failure record is no error either


def test_atomic_path_replaces_on_success_and_keeps_old_file_on_error(tmp_path: Path):
    final = tmp_path / "sub" / "shot.mkv"
    with atomic_path(final) as tmp:
        assert tmp.parent == final.parent and tmp.suffix == ".mkv" and tmp != final
        tmp.write_bytes(b"v1")
        assert not final.exists()
    assert final.read_bytes() == b"v1"
    with pytest.raises(RuntimeError, match="encoder died"), atomic_path(final) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("encoder died")
    assert final.read_bytes() == b"v1"
    assert sorted(p.name for p in final.parent.iterdir()) == ["shot.mkv"]


def test_atomic_path_keeps_the_suffix_ffmpeg_needs(tmp_path: Path):
    final = tmp_path / "shot.mkv"
    with atomic_path(final) as tmp:
        subprocess.run(
            [imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "color=c=red:s=16x16:d=0.2"]
            + ["-c:v", "ffv1", str(tmp)],
            check=True,
        )
    assert final.read_bytes()[:4] == b"\x1a\x45\xdf\xa3"  # Matroska/EBML magic


def test_atomic_json_readers_never_see_a_torn_file(tmp_path: Path):
    path = tmp_path / "done.json"
    atomic_write_json(path, {"n": 0, "pad": "x" * 50_000})
    stop, errors = threading.Event(), []

    def reader():
        while not stop.is_set():
            try:
                assert len(json.loads(path.read_text())["pad"]) == 50_000
            except Exception as exc:  # collected for the assertion below
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for n in range(1, 200):
        atomic_write_json(path, {"n": n, "pad": "x" * 50_000})
    stop.set()
    thread.join()
    assert errors == []
    assert json.loads(path.read_text())["n"] == 199
    atomic_write_bytes(path, b"raw")
    assert path.read_bytes() == b"raw"
