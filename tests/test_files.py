"""tasks/files.py's one atomic-write mechanism: a streaming writer's commit/discard, folders, modes, leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tasks.files import AtomicFile, atomic_path, publish_once
from tasks.media.intermediates import clean_temps


def test_atomic_file_commits_a_streamed_file_and_discards_a_failed_one(tmp_path: Path):
    final = tmp_path / "shot_0001.mkv"
    target = AtomicFile(final)
    with target.tmp.open("wb") as fh:
        fh.write(b"part 1,")
        fh.write(b"part 2")
    assert not final.exists() and target.tmp.parent == tmp_path and target.tmp.suffix == ".mkv"
    assert target.commit() == final and final.read_bytes() == b"part 1,part 2"
    again = AtomicFile(final)
    again.tmp.write_bytes(b"torn")
    again.discard()
    assert final.read_bytes() == b"part 1,part 2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot_0001.mkv"]


def test_a_crashed_writers_temp_is_what_clean_temps_removes(tmp_path: Path):
    (tmp_path / "shot_0002.mkv").write_bytes(b"other shot")
    crashed = AtomicFile(tmp_path / "shot_0001.mkv")
    crashed.tmp.write_bytes(b"half")  # the process dies before commit or discard
    assert clean_temps(tmp_path, "shot_0001") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shot_0002.mkv"]


def test_atomic_path_publishes_a_whole_folder_and_removes_a_failed_one(tmp_path: Path):
    root = tmp_path / "cache" / "weights"
    with atomic_path(root) as tmp:
        (tmp / "sub").mkdir(parents=True)
        (tmp / "sub" / "a.bin").write_bytes(b"a")
        (tmp / ".complete").touch()
    assert (root / "sub" / "a.bin").read_bytes() == b"a" and (root / ".complete").is_file()
    with pytest.raises(RuntimeError, match="writer died"), atomic_path(tmp_path / "cache" / "other") as tmp:
        (tmp / "sub").mkdir(parents=True)
        (tmp / "sub" / "b.bin").write_bytes(b"b")
        raise RuntimeError("writer died")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["weights"]


def test_written_files_follow_the_umask(tmp_path: Path):
    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "out.json") as tmp:
            tmp.write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "out.json").stat().st_mode & 0o777 == 0o644


def test_publish_once_keeps_the_first_writers_bytes(tmp_path: Path):
    final = tmp_path / "record.json"
    publish_once(final, b"first")
    publish_once(final, b"second")
    assert final.read_bytes() == b"first" and sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
