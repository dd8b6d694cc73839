"""The per-shot unit (render_shot) and the `dub-film` flow end to end on the sample film under a real
(temporary) Prefect server."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tasks.audio import prepare_dialogue, slice_bounds
from tasks.backend import PassthroughBackend, get_backend
from tasks.config import load_config
from tasks.errors import ConfigError, MediaError
from tasks.plan import plan_shot
from tasks.probe import probe
from tasks.render import ShotJob, render_shot
from tasks.shots import Shot
from tests.media import decode_all, make_audio, make_clip, psnr

DATA = Path(__file__).resolve().parents[1] / "data"


def _job(tmp: Path, clip: Path, overrides: list[str], start: int = 0, end: int | None = None) -> ShotJob:
    cfg = load_config(overrides=["plan.frame_num=9", "plan.motion_frames=1", *overrides])
    info = probe(clip)
    end = info.frame_count if end is None else end
    dub = make_audio(tmp / "dub.wav", info.video_duration_s)
    track = prepare_dialogue(
        dub, frame_count=info.frame_count, fps=info.fps, cfg=cfg.audio, out_wav=tmp / "d.wav"
    )
    plan = plan_shot(Shot(0, start, end), info.fps, cfg.plan)
    bounds = slice_bounds([0, start, end, info.frame_count], info.fps, track.sample_rate, track.n_samples)[1]
    return ShotJob(
        info.to_dict(), plan.to_dict(), track.to_dict(), bounds, str(tmp / "shot.mkv"), cfg.to_dict()
    )


class FlakyBackend:
    """Counts its chunks, fails once at chunk `fail_at`, keeps a running state (like motion latents)."""

    name = "flaky"
    applies_color = True

    def __init__(self, fail_at: int | None):
        self.fail_at = fail_at
        self.calls: list[int] = []
        self.resumed_from = None

    def open_shot(self, plan, geometry, shot_audio, sample_rate, *, resume_state=None):
        self.resumed_from = resume_state
        backend = self

        class Session:
            done = 0 if resume_state is None else resume_state["done"]

            def dub_chunk(self, inp):
                if backend.fail_at == inp.chunk.index:
                    backend.fail_at = None
                    raise RuntimeError("CUDA out of memory (injected)")
                backend.calls.append(inp.chunk.index)
                assert inp.audio.shape[0] == round(inp.chunk.num_frames * sample_rate / 25)
                assert inp.reference.shape == inp.frames.shape[1:] or inp.frames.shape[0] == 0
                self.done += 1
                return 255 - inp.frames

            def state(self):
                return {"done": self.done}

            def close(self):
                pass

        return Session()


def test_render_shot_resumes_after_a_failed_chunk(tmp_path: Path):
    clip = make_clip(tmp_path / "c.mp4", (40,), fps="30000/1001", audio_channels=None)
    job = _job(tmp_path, clip, [], start=5, end=37)
    n_chunks = len(job.plan["chunks"])
    assert n_chunks >= 3
    backend = FlakyBackend(fail_at=2)
    progress: list[float] = []
    with pytest.raises(RuntimeError, match="injected"):
        render_shot(job, backend=backend, on_progress=progress.append)
    assert backend.calls == [0, 1] and not Path(job.out_path).exists()
    out = render_shot(job, backend=backend, on_progress=progress.append)
    assert backend.calls == [0, 1, *range(2, n_chunks)] and backend.resumed_from == {"done": 2}
    assert progress[-1] == 1.0 and progress == sorted(progress)
    got = decode_all(out)
    assert np.array_equal(got, 255 - decode_all(clip)[5:37])  # frame-exact, lossless intermediate
    assert not Path(out).with_name("shot.chunks").exists()


def test_render_applies_colour_only_when_the_backend_does_not(tmp_path: Path):
    clip = make_clip(tmp_path / "c.mp4", (6, 6), audio_channels=None)
    src = decode_all(clip)
    plain = decode_all(render_shot(_job(tmp_path, clip, [])))
    assert np.array_equal(plain, src)  # the default dry run is an identity
    colour = decode_all(
        render_shot(_job(tmp_path, clip, ["backend.options.color=true", "color.strength=1.0"]))
    )
    assert colour.shape == src.shape and not np.array_equal(colour, src)  # the colour step ran
    via = decode_all(render_shot(_job(tmp_path, clip, ["backend.options.via_model=true"])))
    assert via.shape == src.shape and 22 < psnr(via, src) < 60  # bucket crop + resize round trip


def test_backend_registry_and_output_checks(tmp_path: Path):
    assert isinstance(get_backend("passthrough", {}), PassthroughBackend)
    with pytest.raises(ConfigError, match="unknown backend 'magic'"):
        get_backend("magic")
    with pytest.raises(ConfigError, match="unknown passthrough option"):
        get_backend("passthrough", {"steps": 4})

    class Wrong(FlakyBackend):
        def open_shot(self, *a, **k):
            s = super().open_shot(*a, **k)
            s.dub_chunk = lambda inp: inp.frames[:, ::2]
            return s

    clip = make_clip(tmp_path / "w.mp4", (6,), audio_channels=None)
    with pytest.raises(MediaError, match="backend flaky returned"):
        render_shot(_job(tmp_path, clip, []), backend=Wrong(None))


# ---------------------------------------------------------------------------------- the Prefect flow


@pytest.mark.usefixtures("prefect_harness")
def test_dub_film_flow_on_the_sample_film(tmp_path: Path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.dub_film import dub_film

    meta = json.loads((DATA / "sample_film.json").read_text())
    src, dub = DATA / meta["film"], DATA / meta["dub"]
    out = tmp_path / "sample_dubbed.mp4"
    state = dub_film(
        str(src), str(dub), str(out), config={"workspace": {"root": str(tmp_path / "ws")}}, return_state=True
    )
    assert state.is_completed(), state.message
    assert state.result() == str(out)

    # shot boundaries = the known cuts (task runs are named after each shot's exact span)
    fps = Fraction(meta["fps"])
    edges = [0, *meta["cut_frames"], meta["frame_count"]]

    def tc(frame: int) -> str:
        ms = round(float(frame / fps) * 1000)
        return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"

    expected = [
        f"shot-{i:04d} {tc(a)}–{tc(b)}" for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))
    ]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    names = sorted(r.name for r in runs if r.name.startswith("shot-"))
    assert names == expected
    assert all(r.state.is_completed() for r in runs)

    # same frames, same timing; pixels equal the source within the encoder's tolerance
    info, o = probe(src), probe(out)
    assert (o.frame_count, o.fps, o.width, o.height) == (meta["frame_count"], fps, info.width, info.height)
    quality = psnr(decode_all(out), decode_all(src))
    assert quality > 38, (
        f"PSNR {quality:.1f} dB"
    )  # measured ~40 dB: one libx264 crf 18 encode + RGB round trip
    from tasks.audio import decode_audio

    audio_s = decode_audio(out, sample_rate=16000, channels=1).shape[0] / 16000
    assert abs(audio_s - meta["duration_s"]) <= 1 / float(fps)
    assert not any((tmp_path / "ws").iterdir())


class FailsOnShotOne(PassthroughBackend):
    """Passthrough, except that shot 0001 fails (a stand-in for a GPU fault)."""

    name = "fails-on-shot-1"

    def open_shot(self, plan, *a, **k):
        if plan.shot_index == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
        return super().open_shot(plan, *a, **k)


@pytest.mark.usefixtures("prefect_harness")
def test_dub_film_flow_reports_a_failed_shot(tmp_path: Path, monkeypatch):
    from flows.dub_film import ShotsFailed, dub_film
    from tasks import backend

    monkeypatch.setitem(backend.BACKENDS, "fails-on-shot-1", "tests.test_local_flow:FailsOnShotOne")
    clip = make_clip(tmp_path / "c.mp4", (10, 10, 10), rotation=90)
    info = probe(clip)
    dub = make_audio(tmp_path / "d.wav", info.video_duration_s)
    out = tmp_path / "o.mp4"
    ws = tmp_path / "ws"
    config = {"backend": {"name": "fails-on-shot-1"}, "workspace": {"root": str(ws)}}
    state = dub_film(str(clip), str(dub), str(out), config=config, return_state=True)
    assert state.is_failed() and not out.exists()
    with pytest.raises(ShotsFailed, match=r"1 shot\(s\) failed \[1\]; first: RuntimeError: CUDA error"):
        state.result()
    (film_ws,) = ws.iterdir()  # the other shots finished: their intermediates are kept for a re-run
    assert sorted(p.name for p in film_ws.glob("shot_*.mkv")) == ["shot_0000.mkv", "shot_0002.mkv"]
    with pytest.raises(ConfigError, match="unknown backend 'nope'"):
        dub_film(str(clip), str(dub), str(out), config={"backend": {"name": "nope"}})
