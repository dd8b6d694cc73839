"""The overlapped per-shot chunk loop (tasks/render/overlap.py) through the real renderer, ffmpeg and the tiny model;
the device resolution of `infinitetalk.device`; the quality / fast presets."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from model.runtime.offload import indexed_device
from tasks.config.pipeline import load_config
from tasks.errors import ConfigError
from tasks.infinitetalk.options import device_for, resolve_options
from tasks.render.backend import PassthroughBackend
from tasks.render.overlap import run_chunks
from tasks.render.shot import render_shot_result
from tests.media import decode_all, make_clip
from tests.test_infinitetalk import SHORT_CHUNKS, _job
from tests.test_local_flow import _job as shot_job
from tests.test_local_flow import inverted
from tests.tiny_weights import seed_cache


def test_run_chunks_keeps_order_bounds_the_queues_and_overlaps():
    """Reads run ahead by at most `depth`, writes strictly in order behind; generate stays on the caller."""
    depth, log, lock = 2, [], threading.Lock()
    caller = threading.get_ident()

    def read(i):
        with lock:
            generated = sum(1 for e in log if e[0] == "gen")
            log.append(("read", i))
        assert i - generated <= depth  # never more than `depth` chunks decoded ahead
        return i * 10

    started = [threading.Event() for _ in range(6)]

    def generate(i, got):
        assert threading.get_ident() == caller and got == i * 10
        started[i].set()
        with lock:
            log.append(("gen", i))
        return got + 1

    def write(i, product):
        if i == 0:  # overlap: chunk 1 generates while chunk 0 is still being written
            assert started[1].wait(10)
        with lock:
            log.append(("write", i, product))

    done = []
    run_chunks(list(range(6)), read, generate, write, depth=depth, on_done=done.append)
    assert done == list(range(6))
    assert [e[1] for e in log if e[0] == "write"] == list(range(6))
    assert all(e[2] == e[1] * 10 + 1 for e in log if e[0] == "write")
    assert log.index(("gen", 1)) < log.index(("write", 0, 1))


def test_run_chunks_raises_the_first_error_unchanged_after_pending_writes():
    written = []

    def generate(i, got):
        if i == 3:
            raise KeyError("generation failed")
        return i

    with pytest.raises(KeyError, match="generation failed"):
        run_chunks(list(range(6)), lambda i: i, generate, lambda i, p: written.append(i), depth=2)
    assert written == [0, 1, 2]  # every chunk generated before the failure is written

    def bad_read(i):
        if i == 1:
            raise FileNotFoundError("decode failed")
        return i

    with pytest.raises(FileNotFoundError, match="decode failed"):
        run_chunks(list(range(4)), bad_read, lambda i, g: g, lambda i, p: None)


class _Flaky(PassthroughBackend):
    """The passthrough backend with a deferred finish (like InfiniteTalk's) and injected failures:
    `fail_generate` raises in the model step of that chunk, `fail_finish` in its CPU finish (writer thread)."""

    name = "flaky"

    def __init__(self, fail_generate: int | None = None, fail_finish: int | None = None):
        super().__init__({})
        self.fail_generate, self.fail_finish, self.generated = fail_generate, fail_finish, []

    def open_shot(self, *args, resume_state=None, **kwargs):
        session = super().open_shot(*args, resume_state=resume_state, **kwargs)
        backend = self

        def deferred(inp):
            i = inp.chunk.index
            if i == backend.fail_generate:
                backend.fail_generate = None
                raise RuntimeError(f"injected generate failure at chunk {i}")
            backend.generated.append(i)
            out = session.dub_chunk(inp)

            def finish():
                if i == backend.fail_finish:
                    backend.fail_finish = None
                    raise OSError(f"injected finish failure at chunk {i}")
                return 255 - out

            return finish

        session.dub_chunk_deferred = deferred
        return session


@pytest.mark.parametrize("where", ["generate", "finish"])
def test_overlapped_crash_mid_shot_resumes_at_the_last_finished_chunk(tmp_path: Path, where: str):
    clip = make_clip(tmp_path / "c.mp4", (40,), audio_channels=None)
    job = shot_job(tmp_path, clip, ["plan.motion_frames=5", "qc.enabled=false"], start=4, end=36).to_dict()
    n = len(job["plan"]["chunks"])
    assert n >= 4
    backend = _Flaky(**{f"fail_{where}": 2})
    with pytest.raises(RuntimeError if where == "generate" else OSError, match=f"injected {where}"):
        render_shot_result(job, backend=backend)
    chunks = Path(job["out_path"]).with_name("shot.chunks")
    done = sorted(p.name for p in chunks.glob("*.done"))
    assert done == ["chunk_0000.done", "chunk_0001.done"]  # chunk 2 never finished: not marked done
    resumed = render_shot_result(job, backend=backend)
    assert resumed["chunks_resumed"] == 2
    assert backend.generated[-(n - 2) :] == list(range(2, n))
    assert np.array_equal(decode_all(resumed["path"]), inverted(clip, 4, 36, tmp_path / "ref.mkv"))


def test_overlapped_tiny_shot_matches_the_sequential_bytes(tmp_path: Path, ws_root: Path):
    """The tiny InfiniteTalk model over 3 chunks: overlapped and sequential loops, and the paste back on a
    pool or on the writer thread alone (`pipeline.composite_workers`), write the same frame bytes (the
    lossless intermediate decoded; the Matroska files differ only in their random segment UIDs)."""
    out = {}
    for overlap, workers in ((True, 4), (False, 4), (True, 1)):
        job = _job(
            tmp_path / f"{overlap}-{workers}", ws_root, 0, (0, 16),
            [*SHORT_CHUNKS, f"pipeline.overlap={overlap}", f"pipeline.composite_workers={workers}"],
        )  # fmt: skip
        result = render_shot_result(job, backend=None)
        assert result["chunks"] == 3 and result["dubbed"]
        out[overlap, workers] = decode_all(result["path"])
    assert out[True, 4].shape[0] == 16
    assert out[True, 4].tobytes() == out[False, 4].tobytes() == out[True, 1].tobytes()


@pytest.fixture(scope="module")
def ws_root(tmp_path_factory: pytest.TempPathFactory, tiny_weights: Path) -> Path:
    root = tmp_path_factory.mktemp("ws")
    seed_cache(tiny_weights, root / ".cache")
    return root


def test_device_resolution_is_indexed():
    assert device_for("auto", cuda_count=0) == "cpu"
    assert device_for("auto", cuda_count=2) == "cuda:0"
    assert device_for("auto", cuda_count=2, local_rank=1) == "cuda:1"
    assert device_for("cuda", cuda_count=1) == "cuda:0"
    assert device_for("cuda:1", cuda_count=2) == "cuda:1"
    assert device_for("cpu", cuda_count=4) == "cpu"
    for name, count, match in [
        ("cuda", 0, "no CUDA device"),
        ("cuda:2", 2, "index 2 but 2 CUDA"),
        ("auto", 1, "local rank 3 but 1 CUDA"),
        ("gpu0", 1, "expected auto, cpu, cuda or cuda:N"),
    ]:
        with pytest.raises(ConfigError, match=f"infinitetalk.device: {name}: .*{match}"):
            device_for(name, cuda_count=count, local_rank=3 if name == "auto" else 0)
    assert indexed_device("cuda", current=3) == indexed_device("cuda:3")
    assert str(indexed_device("cpu")) == "cpu"


def test_presets_fill_the_null_keys_and_fast_needs_a_distill_lora(tmp_path: Path):
    quality = resolve_options(load_config())
    assert (quality.preset, quality.text_guide_scale, quality.audio_guide_scale) == ("quality", 5.0, 4.0)
    assert (quality.steps, quality.fp8_compute, quality.vae_dtype) == (None, False, "float32")
    root = tmp_path / "weights"
    root.mkdir()
    fast_cfg = [
        "infinitetalk.preset=fast",
        f"infinitetalk.weights={root}",
        "infinitetalk.mode=infinitetalk-480",
    ]
    with pytest.raises(ConfigError, match="fast needs a step-distilled LoRA"):
        resolve_options(load_config(overrides=fast_cfg))
    lora = root / "Wan21_T2V_14B_lightx2v_cfg_step_distill_lora_rank32.safetensors"
    lora.write_bytes(b"")
    fast = resolve_options(load_config(overrides=fast_cfg))
    assert (fast.steps, fast.text_guide_scale, fast.audio_guide_scale, fast.shift) == (4, 1.0, 1.0, 2.0)
    assert (fast.fp8_compute, fast.fp8_attention, fast.vae_dtype) == ("auto", "auto", "bfloat16")
    assert fast.loras == ({"path": str(lora), "scale": 1.0},)
    own = resolve_options(
        load_config(overrides=[*fast_cfg, "infinitetalk.steps=6", "infinitetalk.vae_dtype=float32"])
    )
    assert (own.steps, own.vae_dtype, own.text_guide_scale) == (6, "float32", 1.0)  # set keys win
