"""The per-shot unit (render_shot) and the `dub-film` flow end to end on the sample film under a real
(temporary) Prefect server."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tasks.config.pipeline import load_config
from tasks.errors import ConfigError, MediaError
from tasks.media.audio import prepare_dialogue, slice_bounds
from tasks.media.probe import probe
from tasks.render.backend import PassthroughBackend, get_backend
from tasks.render.shot import ShotJob, render_shot
from tasks.timeline.plan import plan_shot
from tasks.timeline.shots import Shot
from tests.media import decode_all, make_audio, make_clip, psnr

DATA = Path(__file__).resolve().parents[1] / "data"


def _job(tmp: Path, clip: Path, overrides: list[str], start: int = 0, end: int | None = None) -> ShotJob:
    cfg = load_config(
        overrides=["backend.name=passthrough", "plan.frame_num=9", "plan.motion_frames=1", *overrides]
    )
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


def inverted(clip: Path, start: int, end: int, ref: Path) -> np.ndarray:
    """What a shot intermediate of FlakyBackend's frames [start, end) decodes to: the inverted RGB in the
    source's own yuv420p (`write_rendered` of an uninterrupted render)."""
    from tasks.media.frames import NativeFrames, iter_frames, write_rendered

    info = probe(clip)
    rgb = np.stack(list(iter_frames(info, start, end)))
    write_rendered(ref, info, 255 - rgb, rgb, NativeFrames(info, end), start)
    return decode_all(ref)


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
    assert np.array_equal(
        got, inverted(clip, 5, 37, tmp_path / "ref.mkv")
    )  # frame-exact, lossless intermediate
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


def _group_runs(ws_root: Path) -> list:
    """The dub-group child runs whose workspace lives under ``ws_root`` (the harness is session-wide)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["dub-group"])))
    return [r for r in runs if r.parameters["ws"]["root"] == str(ws_root.resolve())]


def _task_runs(flow_run_ids: list) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids)))


@pytest.mark.usefixtures("prefect_harness")
def test_dub_film_flow_on_the_sample_film(tmp_path: Path):
    from flows.dub_film import dub_film
    from tasks.media.audio import decode_audio
    from tasks.run.workspace import read_attempts

    meta = json.loads((DATA / "sample_film.json").read_text())
    src, dub = DATA / meta["film"], DATA / meta["dub"]
    out, ws_root = tmp_path / "sample_dubbed.mp4", tmp_path / "ws"
    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(ws_root)}}
    state = dub_film(str(src), str(dub), str(out), config=config, return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == str(out)

    # shot boundaries = the known cuts; each shot is a task run named after its exact span, inside the
    # in-process group runs (passthrough costs no GPU time, so one group holds every shot)
    fps = Fraction(meta["fps"])
    edges = [0, *meta["cut_frames"], meta["frame_count"]]

    def tc(frame: int) -> str:
        ms = round(float(frame / fps) * 1000)
        return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"

    expected = [
        f"shot-{i:04d} {tc(a)}-{tc(b)}" for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))
    ]
    groups = _group_runs(ws_root)
    assert [g.name for g in groups] == ["group-000 shots 0000-0004"]
    runs = _task_runs([g.id for g in groups])
    assert sorted(r.name for r in runs) == expected
    assert all(r.state.is_completed() for r in runs)

    # same frames, same timing; pixels equal the source within the encoder's tolerance
    info, o = probe(src), probe(out)
    assert (o.frame_count, o.fps, o.width, o.height) == (meta["frame_count"], fps, info.width, info.height)
    quality = psnr(decode_all(out), decode_all(src))
    assert quality > 38, (
        f"PSNR {quality:.1f} dB"
    )  # measured ~40 dB: one libx264 crf 18 encode + RGB round trip
    audio_s = decode_audio(out, sample_rate=16000, channels=1).shape[0] / 16000
    assert abs(audio_s - meta["duration_s"]) <= 1 / float(fps)

    # in-process orchestration overhead per shot: task run wall time minus the renderer's own time
    (ws_dir,) = ws_root.iterdir()
    attempts = read_attempts(_ws(ws_dir))
    render_s = {a["shot"]: a["seconds"] for a in attempts}
    overhead = [(r.end_time - r.start_time).total_seconds() - render_s[int(r.name[5:9])] for r in runs]
    print(f"\nin-process per-shot overhead: median {sorted(overhead)[len(overhead) // 2]:.3f} s")

    # a second run reuses everything: no shot rendered, no new group run, no second encode
    mtime = out.stat().st_mtime_ns
    again = dub_film(str(src), str(dub), str(out), config=config, return_state=True)
    assert again.is_completed(), again.message
    assert len(read_attempts(_ws(ws_dir))) == 5 and len(_group_runs(ws_root)) == 1
    assert out.stat().st_mtime_ns == mtime


def _ws(ws_dir: Path):
    from tasks.files import read_json
    from tasks.run.workspace import Workspace

    manifest = read_json(ws_dir / "workspace.json")
    return Workspace(root=str(ws_dir.parent), key=manifest["key"], incarnation=manifest["incarnation"])


@pytest.mark.usefixtures("prefect_harness")
def test_dub_film_flow_fails_naming_the_shot_then_resumes_only_it(tmp_path: Path):
    from flows.dub_film import ShotsFailed, dub_film
    from tasks.run.workspace import read_attempts

    clip = make_clip(tmp_path / "c.mp4", (10, 10, 10), rotation=90)
    info = probe(clip)
    dub = make_audio(tmp_path / "d.wav", info.video_duration_s)
    out, ws_root = tmp_path / "o.mp4", tmp_path / "ws"
    config = {
        "backend": {"name": "passthrough"},
        "workspace": {"root": str(ws_root)},
        "plan": {"frame_num": 5, "motion_frames": 1},  # several chunks per shot
        "encode": {"preset": "veryfast"},
    }
    faulty = {**config, "debug": {"fail_shots": [1]}}
    state = dub_film(str(clip), str(dub), str(out), config=faulty, return_state=True)
    assert state.is_failed() and not out.exists()
    with pytest.raises(ShotsFailed, match=r"1 shot\(s\) failed \[1\]; first: InjectedFault: injected fault"):
        state.result()
    (ws_dir,) = ws_root.iterdir()  # the other shots finished and are kept for a re-run
    ws = _ws(ws_dir)
    assert sorted(p.parent.name[:4] for p in ws_dir.glob("shots/*/shot.mkv")) == ["0000", "0002"]
    assert sorted((a["shot"], a["status"]) for a in read_attempts(ws)) == [
        (0, "done"),
        (1, "failed"),
        (2, "done"),
    ]
    assert list(ws_dir.glob("shots/0001-*/shot.chunks/chunk_*.done"))  # checkpoints of its first half

    # the fault is not part of the shot keys: the re-run resumes and renders shot 1 only
    state = dub_film(str(clip), str(dub), str(out), config=config, return_state=True)
    assert state.is_completed(), state.message
    assert [(a["shot"], a["status"]) for a in read_attempts(ws)][3:] == [(1, "done")]
    assert probe(out).frame_count == info.frame_count
    # workspace.keep=false (not part of the key either): nothing rendered, the workspace removed at the end
    keep_not = {**config, "workspace": {"root": str(ws_root), "keep": False}}
    assert dub_film(str(clip), str(dub), str(out), config=keep_not, return_state=True).is_completed()
    assert not ws_dir.exists() and probe(out).frame_count == info.frame_count
    with pytest.raises(ConfigError, match="unknown backend 'nope'"):
        dub_film(str(clip), str(dub), str(out), config={"backend": {"name": "nope"}})
