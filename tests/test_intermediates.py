"""Verified intermediates and data-only chunk checkpoints: a damaged or forged checkpoint is recomputed,
never joined, never executed (issue 15). Real ffmpeg, real files, the passthrough-style test backend."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.media.intermediates import count_packets, crc_errors, read_marker, record_written, verify
from tasks.render.checkpoint_state import StateError, decode_state, encode_state, load_state, save_state
from tasks.render.shot import render_shot_result
from tests.media import decode_all, make_clip
from tests.test_local_flow import FlakyBackend, _job, inverted


class TensorStateBackend(FlakyBackend):
    """FlakyBackend whose state also carries tensors (like the sampler's motion frames and RNG)."""

    def open_shot(self, plan, geometry, shot_audio, sample_rate, *, resume_state=None):
        session = super().open_shot(plan, geometry, shot_audio, sample_rate, resume_state=resume_state)
        plain = session.state

        def state():
            done = plain()["done"]
            return {"done": done, "stream": {"motion": torch.full((1, 3, 2, 4, 4), float(done)),
                                             "rng": np.arange(done, dtype=np.uint8)}}  # fmt: skip

        session.state = state
        return session


class StatelessBackend(FlakyBackend):
    """FlakyBackend without a state between chunks (like the passthrough backend)."""

    def open_shot(self, *args, **kwargs):
        session = super().open_shot(*args, **kwargs)
        session.state = lambda: None
        return session


def _half_done(tmp_path: Path, backend: FlakyBackend | None = None):
    """A 32-frame shot whose render failed at chunk 2: chunks 0 and 1 are checkpointed."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    clip = make_clip(tmp_path / "c.mp4", (40,), fps="30000/1001", audio_channels=None)
    job = _job(tmp_path, clip, [], start=5, end=37)
    backend = backend or FlakyBackend(fail_at=2)
    with pytest.raises(RuntimeError, match="injected"):
        render_shot_result(job, backend=backend)
    chunks = Path(job.out_path).with_name("shot.chunks")
    assert sorted(p.name for p in chunks.glob("chunk_*.done")) == ["chunk_0000.done", "chunk_0001.done"]
    return clip, job, backend, chunks


def _finish_and_check(clip: Path, job, backend: FlakyBackend) -> dict:
    result = render_shot_result(job, backend=backend)
    # every frame exactly what an uninterrupted render writes: the inverted frames in the source's yuv420p
    assert np.array_equal(
        decode_all(result["path"]), inverted(clip, 5, 37, Path(job.out_path).with_name("ref.mkv"))
    )
    assert verify(result["path"], result["file"]) is None and result["file"]["frames"] == 32
    return result


def test_a_flipped_chunk_segment_is_recomputed_not_joined(tmp_path: Path, caplog):
    for backend, resumed in ((StatelessBackend(fail_at=2), 1), (FlakyBackend(fail_at=2), 0)):
        caplog.clear()
        clip, job, backend, chunks = _half_done(tmp_path / str(resumed), backend)
        seg = chunks / "chunk_0001.mkv"
        data = bytearray(seg.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 24] = bytes(
            24
        )  # 24 bytes changed: same size, same frame count
        seg.write_bytes(bytes(data))
        result = _finish_and_check(clip, job, backend)
        # stateless: chunk 1 again; with a state: chunk 0's state is no longer kept, so the shot starts over
        assert result["chunks_resumed"] == resumed and backend.calls[2] == resumed
        (line,) = [r.message for r in caplog.records if r.name == "tasks.render.chunk_checkpoints"]
        assert "chunk_0001.mkv" in line and "hash" in line


def test_a_truncated_chunk_segment_is_recomputed(tmp_path: Path, caplog):
    clip, job, backend, chunks = _half_done(tmp_path)
    seg = chunks / "chunk_0000.mkv"
    seg.write_bytes(seg.read_bytes()[: seg.stat().st_size * 3 // 4])
    result = _finish_and_check(clip, job, backend)
    assert result["chunks_resumed"] == 0 and backend.calls[2:4] == [0, 1]
    assert any("chunk_0000.mkv" in r.message and "truncated" in r.message for r in caplog.records)


def test_a_truncated_state_or_marker_starts_over_instead_of_failing_every_rerun(tmp_path: Path, caplog):
    clip, job, backend, chunks = _half_done(tmp_path, TensorStateBackend(fail_at=2))
    state = chunks / "state_0001.safetensors"
    assert not (chunks / "state_0000.safetensors").exists()  # only the newest state is kept
    state.write_bytes(state.read_bytes()[:100])
    result = _finish_and_check(clip, job, backend)
    assert result["chunks_resumed"] == 0 and backend.resumed_from is None
    assert any("state_0001.safetensors" in r.message for r in caplog.records)

    clip, job, backend, chunks = _half_done(tmp_path / "ok", TensorStateBackend(fail_at=2))
    assert _finish_and_check(clip, job, backend)["chunks_resumed"] == 2  # undamaged: resumes with tensors
    assert backend.resumed_from["done"] == 2 and backend.resumed_from["stream"]["rng"].tolist() == [0, 1]

    clip, job, backend, chunks = _half_done(tmp_path / "m", StatelessBackend(fail_at=2))
    marker = chunks / "chunk_0001.done"
    marker.write_text(marker.read_text()[:10])  # a torn marker: chunk 1 is not done, chunk 0 is
    assert _finish_and_check(clip, job, backend)["chunks_resumed"] == 1
    assert any("chunk_0001.done: unreadable marker" in r.message for r in caplog.records)


def test_a_forged_pickle_in_the_checkpoint_folder_is_never_executed(tmp_path: Path):
    clip, job, backend, chunks = _half_done(tmp_path)
    canary = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (canary,))

    for k in (0, 1):  # the old layout: a pickle next to a bare done marker
        (chunks / f"state_{k:04d}.pkl").write_bytes(pickle.dumps(Exploit()))
    (chunks / "state_0001.safetensors").write_bytes(pickle.dumps(Exploit()))  # and under the new name
    _finish_and_check(clip, job, backend)
    assert not canary.exists()


def test_chunk_state_round_trips_as_data_and_rejects_anything_else(tmp_path: Path):
    from model.sampling.stream import StreamState

    stream = StreamState(
        3, 120, torch.randn(1, 3, 9, 8, 8), None, torch.arange(16, dtype=torch.uint8), (200, 81, 9)
    )
    state = {
        "format": "x",
        "stream": stream.state_dict(),
        "extra": [1, 2.5, None, True, "a"],
        "np": np.eye(2),
    }
    record = save_state(tmp_path / "s.safetensors", state)
    back = load_state(tmp_path / "s.safetensors", record)
    again = StreamState.from_state_dict(back["stream"])
    assert again.plan_key == (200, 81, 9) and again.next_chunk == 3 and again.color_reference is None
    assert torch.equal(again.motion_frames, stream.motion_frames) and torch.equal(
        again.rng_state, stream.rng_state
    )
    assert back["extra"] == [1, 2.5, None, True, "a"] and isinstance(back["np"], np.ndarray)

    with pytest.raises(TypeError, match=r"state\.obj: cannot store a PosixPath"):
        encode_state({"obj": Path("/")})
    with pytest.raises(StateError, match="do not match"):  # one byte changed
        data = bytearray((tmp_path / "s.safetensors").read_bytes())
        data[-1] ^= 1
        (tmp_path / "s.safetensors").write_bytes(bytes(data))
        load_state(tmp_path / "s.safetensors", record)
    for bad in (b"", pickle.dumps({"a": 1}), encode_state({"a": 1})[:30]):
        with pytest.raises(StateError):
            decode_state(bad)


def test_written_intermediates_are_counted_and_crc_checked(tmp_path: Path):
    from tasks.media.frames import LosslessWriter, iter_frames
    from tasks.media.probe import probe

    clip = make_clip(tmp_path / "c.mp4", (12,), audio_channels=None)
    info = probe(clip)
    out = tmp_path / "shot.mkv"
    with LosslessWriter(out, (info.height, info.width), info.fps) as w:
        w.write(iter_frames(info))
    record = record_written(out, 12)
    assert count_packets(out) == 12 and crc_errors(out) == [] and verify(out, record) is None
    with pytest.raises(Exception, match="wrote 12 frames, expected 13"):
        record_written(out, 13)
    data = bytearray(out.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 24] = bytes(24)
    out.write_bytes(bytes(data))
    assert "hash" in verify(out, record) and crc_errors(out)  # ffmpeg's own slice CRCs see it too
    (tmp_path / "m.json").write_text('{"a": ')
    assert read_marker(tmp_path / "m.json") is None and read_marker(tmp_path / "none.json") is None
    (tmp_path / "m.json").write_text(json.dumps({"a": 1}))
    assert read_marker(tmp_path / "m.json") == {"a": 1}
