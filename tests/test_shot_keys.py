"""Per-shot result keys on real files: what changes a shot's key and what does not, re-runs that render
only the shots whose own inputs changed (counted in the workspace's attempt log), an upgrade of the code
that keeps every result, a RENDER_VERSION bump that re-renders them, and the pinned tiny-model pixels
that say when the version must be bumped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import tasks.timeline.shot_key as shot_key
from tasks.config.pipeline import load_config
from tasks.media.audio import DialogueTrack
from tasks.media.probe import probe
from tasks.render.backend import backend_weights_identity
from tasks.timeline.shot_key import conditioning_span, shot_config, shot_settings
from tests.media import decode_all, make_audio, make_clip
from tests.test_infinitetalk import _job, resident, ws_root  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
PINNED = REPO / "tests" / "fixtures" / "render_version"
LENGTHS = (48, 48, 48, 48)  # four 2 s shots at 23.976 fps
SMALL_CONTEXT = 0.2  # workspace.audio_context_s of the film runs below: shots ~2 s apart stay apart


def _track(n_samples: int, rate: int = 16000) -> DialogueTrack:
    return DialogueTrack("unused.wav", "dub.wav", rate, 1, n_samples, "ok", n_samples / rate)


def test_shot_settings_keep_only_what_changes_the_shot():
    base = load_config().to_dict()
    ref = shot_settings(base, 3)
    for change in (  # never pixels: the same key
        ["encode.crf=30", "workspace.keep=false", "debug.fail_shots=[3]", "infinitetalk.offload=true"],
        ["infinitetalk.gpus_per_shot=2", "shots.detector=hash", "gate.overrides={4: skip}"],
    ):
        assert shot_settings(load_config(overrides=change).to_dict(), 3) == ref, change
    for change in (
        ["gate.overrides={3: skip}"], ["infinitetalk.seed=7"], ["color.strength=0.5"],
        ["speaker.uncertain=skip"], ["speaker.detect_every=2"],  # who is dubbed: which pixels change
    ):  # fmt: skip
        assert shot_settings(load_config(overrides=change).to_dict(), 3) != ref, change
    # backend.options win over the section (as in the backend) and count the same way
    via_options = load_config(overrides=["backend.options.steps=5"]).to_dict()
    assert shot_settings(via_options, 3) == shot_settings(
        load_config(overrides=["infinitetalk.steps=5"]).to_dict(), 3
    )
    # one shot's own override, merged over a global entry spelt differently
    merged = shot_config(load_config(overrides=["gate.overrides={3: dub, 5: skip}"]).to_dict(),
                         {"gate": {"overrides": {"3": "skip"}}})  # fmt: skip
    assert merged["gate"]["overrides"] == {5: "skip", "3": "skip"}


def test_weights_identity_counts_the_files_a_shot_can_load(tmp_path: Path):
    """A real root's identity: a changed weights file changes it; a downloader's hidden cache and the
    multi-person checkpoint (for a shot that cannot run two speakers) do not."""
    from model.weights.layout import WeightsLayout

    root = tmp_path / "weights"
    single = root / WeightsLayout().infinitetalk
    single.parent.mkdir(parents=True)
    single.write_bytes(b"single")
    cfg = load_config(None, [f"infinitetalk.weights={root}"]).to_dict()
    base = backend_weights_identity(cfg)
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "x.metadata").write_text("etag")
    multi = root / WeightsLayout().multi
    multi.parent.mkdir(parents=True)
    multi.write_bytes(b"multi")
    assert backend_weights_identity(cfg) == base
    assert backend_weights_identity(cfg, multi=True) != base
    single.write_bytes(b"single, retrained")
    assert backend_weights_identity(cfg) != base


def test_conditioning_span_covers_the_model_window_and_context():
    cfg = load_config()
    plan = {
        "shot_index": 1,
        "start_frame": 48,
        "fps": "24",
        "model_fps": 25,
        "chunks": [{"model_start": 0, "num_frames": 53}],
    }
    track = _track(16000 * 10)
    a, b = conditioning_span(plan, (32000, 64000), track, 0.5)
    # from 2 s - reach to 2 s + 53/25 s (the model window past the shot's end) + reach
    reach = shot_key.LOCAL_REACH_S + 0.5
    assert (a, b) == (int(16000 * (2 - reach)), int(np.ceil(16000 * (2 + 53 / 25 + reach))))
    assert conditioning_span(plan, (32000, 64000), track, None) == (0, track.n_samples)
    assert cfg.workspace.audio_context_s is not None  # the default keeps keys local


def _counts(root: Path) -> Counter:
    """Rendered attempts per shot over every run so far (the workspace's attempt log)."""
    (ws_dir,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    lines = (ws_dir / "attempts.jsonl").read_text().splitlines()
    return Counter(json.loads(line)["shot"] for line in lines if line.strip())


def _renders_since(root: Path, before: Counter) -> list[int]:
    now = _counts(root)
    return sorted((now - before).elements())


def test_only_shots_whose_own_inputs_changed_re_render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from flows.dub_film import dub_film_inline

    clip = make_clip(tmp_path / "film.mp4", LENGTHS)
    info = probe(clip)
    dub = make_audio(tmp_path / "dub.wav", info.video_duration_s)
    out, store = tmp_path / "out.mp4", tmp_path / "ws"
    config = {
        "backend": {"name": "passthrough"},
        "workspace": {"root": str(store), "audio_context_s": SMALL_CONTEXT},
        "encode": {"preset": "ultrafast"},
    }
    dub_film_inline(str(clip), str(dub), str(out), config=config)
    assert _renders_since(store, Counter()) == [0, 1, 2, 3]

    # one shot's override: only that shot
    before = _counts(store)
    override = {**config, "gate": {"overrides": {2: "skip"}}}
    dub_film_inline(str(clip), str(dub), str(out), config=override)
    assert _renders_since(store, before) == [2]

    # a re-recorded line in the middle of shot 1 (3.0 - 3.2 s; it spans 2.0 - 4.0 s; shot 0's model
    # window ends at 2.12 s, shot 2 starts at 4.0 s): only shot 1 is conditioned on those samples
    before = _counts(store)
    wave, rate = sf.read(str(dub), dtype="float32", always_2d=True)
    edited = wave.copy()
    edited[int(3.0 * rate) : int(3.2 * rate)] *= -0.5
    new_dub = tmp_path / "dub_v2.wav"
    sf.write(str(new_dub), edited, rate)
    dub_film_inline(str(clip), str(new_dub), str(out), config=override)
    assert _renders_since(store, before) == [1]
    mtime = out.stat().st_mtime_ns  # the film was re-assembled with the new shot

    # a code change that does not bump RENDER_VERSION (a copy of the code with an edited renderer and
    # flow, run as the dubflow command): every shot reused, the output is already up to date
    before = _counts(store)
    code = tmp_path / "code"
    for part in ("flows", "tasks", "model", "configs"):
        shutil.copytree(REPO / part, code / part, ignore=shutil.ignore_patterns("__pycache__"))
    render = code / "tasks" / "render" / "shot.py"
    render.write_text(render.read_text().replace('"""The per-shot unit', '"""(edited) The per-shot unit', 1))
    flow = code / "flows" / "dub_film.py"
    flow.write_text(flow.read_text().replace('"%s -> %s in %.1f s"', '"(edited) %s -> %s in %.1f s"', 1))
    sets = [f"--set=workspace.root={store}", f"--set=workspace.audio_context_s={SMALL_CONTEXT}",
            "--set=gate.overrides={2: skip}", "--set=encode.preset=ultrafast"]  # fmt: skip
    cmd = [sys.executable, "-m", "flows.cli", "dub", str(clip), "--audio", str(new_dub), "--out", str(out),
           "--backend", "passthrough", "--no-prefect", *sets]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(edited) " in done.stderr  # the edited copy ran
    assert _renders_since(store, before) == [] and out.stat().st_mtime_ns == mtime
    assert "4 of 4 shot(s) reused" in done.stderr

    # bumping RENDER_VERSION: every shot again
    before = _counts(store)
    monkeypatch.setattr(shot_key, "RENDER_VERSION", shot_key.RENDER_VERSION + 1)
    dub_film_inline(str(clip), str(new_dub), str(out), config=override)
    assert _renders_since(store, before) == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- the pinned tiny pixels


def _thumbnail(frames: np.ndarray) -> np.ndarray:
    """8x8 block means of (T, H, W, 3) frames: robust to the 1-LSB rounding flips of CPU thread counts."""
    t, h, w, c = frames.shape
    cut = frames[:, : h // 8 * 8, : w // 8 * 8].astype(np.float32)
    return cut.reshape(t, h // 8, 8, w // 8, 8, c).mean(axis=(2, 4))


def test_pinned_tiny_model_pixels_of_this_render_version(tmp_path: Path, ws_root: Path, resident):  # noqa: F811
    """The tiny model's first five frames of the sample film's shot 0, per RENDER_VERSION.

    Fails when a change alters pixels without bumping `tasks.timeline.shot_key.RENDER_VERSION` (old results would
    be reused as if nothing changed). After bumping it, pin the new pixels with
    `DUBFLOW_PIN_RENDER=1 pytest tests/test_shot_keys.py -k pinned` and commit the new file.
    """
    from tasks.render.shot import render_shot_result

    job = _job(tmp_path, ws_root, 0, (0, 5), ["gate.overrides={0: dub}", "qc.enabled=false"])
    result = render_shot_result(job)
    assert result["dubbed"] and result["tiny"]
    thumb = _thumbnail(decode_all(result["path"]))
    pinned = PINNED / f"tiny_v{shot_key.RENDER_VERSION}.npy"
    if os.environ.get("DUBFLOW_PIN_RENDER") == "1":
        pinned.parent.mkdir(parents=True, exist_ok=True)
        np.save(pinned, thumb.astype(np.float16))
    assert pinned.is_file(), f"{pinned}: no pinned pixels for RENDER_VERSION {shot_key.RENDER_VERSION}"
    want = np.load(pinned).astype(np.float32)
    diff = float(np.abs(want - thumb).max())
    assert diff <= 0.75, (
        f"tiny-model pixels differ from those pinned for RENDER_VERSION {shot_key.RENDER_VERSION} "
        f"(max block difference {diff:.2f}): bump tasks/timeline/shot_key.py RENDER_VERSION and pin the new pixels"
    )
