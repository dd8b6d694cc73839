"""The film-level tasks of `dub-film`: probe, workspace, shot detection, dialogue, final-mix check, chunk
plans and the final assembly, plus the small helpers that name a film's output, workspace root and
artifact tag, and `NON_SHOT_CONFIG` (the config left out of the workspace key).

Each task is one step over `tasks/` (media work) or `flows/workspace.py` (markers); nothing per shot or
per group lives here (that is `flows/shot_task.py` and `flows/runners.py`), and no flow.
"""

from __future__ import annotations

import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

from prefect import task

from flows.progress import artifact_key
from flows.runtime import run_logger
from flows.workspace import (
    DONE,
    Workspace,
    atomic_write_json,
    film_fingerprint,
    open_workspace,
    read_json,
    stable_hash,
    verify_shot_done,
)
from tasks.assemble import AudioSource, assemble
from tasks.audio import check_mix, prepare_dialogue
from tasks.config import PipelineConfig, load_config
from tasks.intermediates import IntermediateError
from tasks.plan import plan_film
from tasks.preflight import check_free_space, workspace_need
from tasks.probe import VideoInfo, probe
from tasks.shots import ShotList, detect_shots

log = logging.getLogger(__name__)

# Config sections that never change a shot's pixels: outside the workspace key, so changing them resumes
# (sequence parallelism and block offload give bit-identical outputs; profiling only adds device syncs)
NON_SHOT_CONFIG = (
    "encode", "workspace", "checks", "cost", "estimate", "debug", "infinitetalk.gpus_per_shot",
    "infinitetalk.profile", "infinitetalk.offload",
)  # fmt: skip


def default_output(source: str) -> str:
    """``$DUBFLOW_OUT_DIR`` (default ``./out``) / ``<film stem>.dubbed<.mp4|.mov|.mkv>``."""
    suffix = Path(source).suffix.lower()
    suffix = suffix if suffix in (".mp4", ".mov", ".mkv") else ".mp4"
    root = Path(os.environ.get("DUBFLOW_OUT_DIR", "out"))
    return str((root / f"{Path(source).stem}.dubbed{suffix}").resolve())


def workspace_root(cfg: PipelineConfig) -> str:
    """`workspace.root`, except that `DUBFLOW_WORKSPACE` replaces the default root (shared across hosts)."""
    env = os.environ.get("DUBFLOW_WORKSPACE", "").strip()
    if env and cfg.workspace.root == load_config().workspace.root:
        return env
    return cfg.workspace.root


def film_tag(source: str) -> str:
    """Artifact-key prefix of a film (its file stem)."""
    try:
        return artifact_key(Path(source).stem)
    except ValueError:
        return "film"


@task(task_run_name="probe {name}")
def probe_source(source: str, config: dict[str, Any], name: str = "") -> dict[str, Any]:
    """Probe the source video (exact frame count and rate, rotation, SAR, audio streams)."""
    cfg = PipelineConfig.from_dict(config)
    info = probe(source, frame_count=cfg.probe.frame_count)
    run_logger(log).info(
        "%s: %d frames at %s fps (%s%s), %dx%d SAR %s rotation %d",
        source, info.frame_count, info.fps, info.codec, ", VFR" if info.vfr else "",
        info.width, info.height, info.sar, info.rotation,
    )  # fmt: skip
    return info.to_dict()


@task(task_run_name="workspace {name}")
def open_film_workspace(
    source: str, audio: str, config: dict[str, Any], root: str, name: str = ""
) -> dict[str, str]:
    """Create or reopen the run workspace of film + dub track + shot config + code version."""
    ws = open_workspace(root, source, config, inputs=[audio], exclude=NON_SHOT_CONFIG)
    run_logger(log).info("workspace %s", ws.path)
    return ws.as_dict()


@task(task_run_name="shots {name}")
def find_shots(video: dict[str, Any], config: dict[str, Any], ws: dict[str, str], name: str = "") -> dict:
    """Frame-exact shot partition of the whole film; kept in the workspace, so a re-run skips detection."""
    saved = Workspace.from_dict(ws).path / "shots.json"
    if saved.exists():
        return read_json(saved)
    cfg = PipelineConfig.from_dict(config)
    shots = detect_shots(VideoInfo.from_dict(video), cfg.shots)
    run_logger(log).info("%d shot(s): cuts at %s", len(shots.shots), [s.start_frame for s in shots.shots[1:]])
    atomic_write_json(saved, shots.to_dict())
    return shots.to_dict()


@task(task_run_name="audio {name}")
def load_dialogue(
    audio: str, frame_count: int, fps: str, config: dict[str, Any], out_wav: str, name: str = ""
) -> dict[str, Any]:
    """Decode and length-check the dubbed dialogue track into the workspace."""
    cfg = PipelineConfig.from_dict(config)
    track = prepare_dialogue(
        audio, frame_count=frame_count, fps=Fraction(fps), cfg=cfg.audio, out_wav=out_wav
    )
    return track.to_dict()


@task(task_run_name="mix {name}")
def check_final_mix(mix: str, frame_count: int, fps: str, config: dict[str, Any], name: str = "") -> str:
    """Length-check the final mix; returns the action ('ok', 'pad' or 'trim')."""
    cfg = PipelineConfig.from_dict(config)
    return check_mix(mix, frame_count=frame_count, fps=Fraction(fps), policy=cfg.audio.length_policy).action


@task(task_run_name="plan {name}")
def plan_shots(shots: dict[str, Any], config: dict[str, Any], name: str = "") -> list[dict[str, Any]]:
    """Chunk plan (25 fps timeline, sliding reference frames) of every shot."""
    cfg = PipelineConfig.from_dict(config)
    sl = ShotList.from_dict(shots)
    return [p.to_dict() for p in plan_film(sl.shots, sl.fps, cfg.plan)]


@task(task_run_name="verify {name}")
def check_workspace(
    ws: dict[str, str],
    shots: list[dict[str, Any]],
    video: dict[str, Any],
    config: dict[str, Any],
    name: str = "",
) -> list[int]:
    """Before any rendering: every done shot's intermediate still matches its marker (size + SHA-256;
    a mismatch is logged and the shot rendered again), and the disk holds what the rest will write.

    Returns the shots that still have to be rendered.
    """
    workspace, cfg = Workspace.from_dict(ws), PipelineConfig.from_dict(config)
    todo = []
    for shot in shots:
        done = verify_shot_done(workspace, shot["index"])
        if done is None or done.get("plan_hash") != shot["plan_hash"]:
            todo.append(shot)
    need = workspace_need([s["frames"] for s in todo], video["width"], video["height"], cfg.checks.ffv1_ratio)
    check_free_space(workspace.path, need, f"the {len(todo)} shot(s) still to render")
    return [s["index"] for s in todo]


@task(task_run_name="assemble {name}")
def assemble_film(
    video: dict[str, Any],
    shot_paths: list[str],
    out: str,
    audio_path: str,
    pad_audio: bool,
    config: dict[str, Any],
    workdir: str,
    name: str = "",
    records: list[dict[str, Any] | None] | None = None,
    stamp: str | None = None,
) -> str:
    """Join the shots, encode once, mux the dubbed audio, write `out` atomically.

    `records`: the shots' file records from their done markers, each verified before use (a shot
    that fails is marked not done, so a re-run renders it again). `stamp`: the output's dubflow tag.
    Skipped when `out` is the file this workspace last assembled from the same shot files, audio and
    encode settings (`assembled.json`): re-running a finished film costs no second encode.
    """
    cfg = PipelineConfig.from_dict(config)
    inputs = stable_hash(
        {
            "shots": [[p, Path(p).stat().st_size, Path(p).stat().st_mtime_ns] for p in shot_paths],
            "audio": film_fingerprint(audio_path),
            "pad": pad_audio,
            "encode": cfg.encode,
            "out": str(Path(out).resolve()),
        }
    )
    stamp_path = Path(workdir) / "assembled.json"
    if stamp_path.exists() and Path(out).is_file():
        stamp, st = read_json(stamp_path), Path(out).stat()
        if stamp.get("inputs") == inputs and [stamp.get("size"), stamp.get("mtime_ns")] == [
            st.st_size,
            st.st_mtime_ns,
        ]:
            run_logger(log).info(
                "%s is up to date (same shots, audio and encode settings): not re-encoded", out
            )
            return out
    try:
        final = assemble(
            VideoInfo.from_dict(video),
            shot_paths,
            out,
            cfg.encode,
            audio=AudioSource(audio_path, pad_audio),
            workdir=workdir,
            records=records,
            stamp=stamp,
        )
    except IntermediateError as exc:  # changed since it was verified: not done any more
        (Path(exc.path).parent / DONE).unlink(missing_ok=True)
        raise IntermediateError(
            exc.path, f"{exc.problem}; marked not done, re-run to render it again"
        ) from exc
    st = Path(final).stat()
    atomic_write_json(
        stamp_path, {"inputs": inputs, "out": final, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    )
    return final
