"""The film-level tasks of `dub-film`: probe, workspace, shot detection, dialogue, final-mix check, chunk
plans, shot keys, the speaker-aware dub decisions (CPU, before any GPU work) and the final assembly,
plus the small helpers that name a film's output, workspace root and artifact tag.

Each task is one step over `tasks/` (media work) or `tasks/run/workspace.py` (markers); nothing per shot or
per group lives here (that is `flows/shot_task.py` and `flows/runners.py`), and no flow.
"""

from __future__ import annotations

import functools
import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

from prefect import task

from flows.progress import artifact_key
from flows.runtime import run_logger
from tasks.config.pipeline import PipelineConfig
from tasks.decision.cast import film_cast
from tasks.decision.film_speakers import cast_characters, film_speakers, record_spans
from tasks.decision.plan_file import plan_overrides
from tasks.decision.review import uncertain_of
from tasks.decision.shot_decision import decide_shot, faces_path, regions_json
from tasks.errors import ConfigError, OutputError
from tasks.files import atomic_write_json, bound_body, write_bound_json
from tasks.media.assemble import AudioSource, assemble
from tasks.media.audio import DialogueTrack, check_mix, prepare_dialogue, read_samples, write_post_wav
from tasks.media.deliver import Destination, deliver, staging, written_record
from tasks.media.intermediates import IntermediateError
from tasks.media.probe import VideoInfo, probe
from tasks.render.backend import backend_model_size, backend_weights_identity, check_backend_options
from tasks.render.preflight import check_free_space, workspace_need
from tasks.run.inputs import check_inputs_unchanged
from tasks.run.run_files import BadRunFile, read_run_file
from tasks.run.workspace import (
    DONE,
    STORE_LAYOUT,
    Workspace,
    config_hash,
    film_fingerprint,
    open_workspace,
    stable_hash,
    verify_shot_done,
    workspace_key,
)
from tasks.timeline.export import EXTRA_FORMATS, film_timeline, write_extra_timelines, write_timeline
from tasks.timeline.plan import plan_film
from tasks.timeline.shot_key import shot_config, shot_configs, shot_inputs
from tasks.timeline.shots import ShotList, detect_shots

log = logging.getLogger(__name__)


def default_output(source: str) -> str:
    """``$DUBFLOW_OUT_DIR`` (default ``./out``) / ``<film stem>.dubbed<.mp4|.mov|.mkv>``."""
    suffix = Path(source).suffix.lower()
    suffix = suffix if suffix in (".mp4", ".mov", ".mkv") else ".mp4"
    root = Path(os.environ.get("DUBFLOW_OUT_DIR", "out"))
    return str((root / f"{Path(source).stem}.dubbed{suffix}").resolve())


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
def open_film_workspace(source: str, config: dict[str, Any], root: str, name: str = "") -> dict[str, str]:
    """Create or reopen the film's run workspace (one per film and pass: quality or preview)."""
    cfg = PipelineConfig.from_dict(config)
    ws = open_workspace(root, source, _pass(cfg))
    run_logger(log).info("workspace %s", ws.path)
    return ws.as_dict()


def _pass(cfg: PipelineConfig) -> dict[str, str]:
    """What a film's workspace is keyed by besides the film: its pass (quality or preview)."""
    return {"pass": "preview" if cfg.workspace.preview else "quality"}


def film_workspace_key(source: str, cfg: PipelineConfig) -> str:
    """The key `open_film_workspace` gives `source`'s workspace, computed without creating anything."""
    return workspace_key(source, film_fingerprint(source), config_hash(_pass(cfg)), STORE_LAYOUT)


def dialogue_wav(ws: Workspace, audio: str) -> str:
    """Where the decoded dub track lives in the workspace (one file per dub file's fingerprint)."""
    return str(ws.path / f"dialogue-{film_fingerprint(audio)[:16]}.wav")


@task(task_run_name="shots {name}")
def find_shots(video: dict[str, Any], config: dict[str, Any], ws: dict[str, str], name: str = "") -> dict:
    """Frame-exact shot partition of the whole film; kept in the workspace per detection config, bound to
    the film it was detected in (`tasks.files.write_bound_json`), so a re-run skips detection and a
    partition of another film, other settings or damaged is set aside and detected again."""
    cfg = PipelineConfig.from_dict(config)
    saved = Workspace.from_dict(ws).path / f"shots-{stable_hash([cfg.probe, cfg.shots], length=12)}.json"
    made_from = {"film": film_fingerprint(video["path"]), "frames": video["frame_count"], "fps": video["fps"],
                 "probe": cfg.probe, "shots": cfg.shots}  # fmt: skip
    kept = read_run_file(saved, functools.partial(_bound_shots, made_from))  # else set aside (logged)
    if kept is not None:
        return kept
    shots = detect_shots(VideoInfo.from_dict(video), cfg.shots)
    run_logger(log).info("%d shot(s): cuts at %s", len(shots.shots), [s.start_frame for s in shots.shots[1:]])
    if film_fingerprint(video["path"]) == made_from["film"]:  # kept only when read from what it names
        write_bound_json(saved, made_from, shots.to_dict())
    return shots.to_dict()


def _bound_shots(made_from: dict[str, Any], data: Any) -> dict[str, Any]:
    """A saved partition made from `made_from` (`tasks.files.bound_body`) that tiles the film, else BadRunFile."""
    try:
        body = bound_body(data, made_from)
    except ValueError as exc:
        raise BadRunFile(str(exc)) from exc
    return checked_shots(body)


def checked_shots(data: Any) -> dict[str, Any]:
    """A saved shot partition, if it is one: shots 0..n-1 tiling [0, frame_count) (else BadRunFile)."""
    shots = ShotList.from_dict(data)
    edges = [(s.start_frame, s.end_frame) for s in shots.shots]
    ok = bool(edges) and [s.index for s in shots.shots] == list(range(len(edges)))
    ok = ok and edges[0][0] == 0 and edges[-1][1] == shots.frame_count and all(a < b for a, b in edges)
    if not ok or any(edges[i][1] != edges[i + 1][0] for i in range(len(edges) - 1)):
        raise BadRunFile("not a shot partition of the film (shots must tile its frames)")
    return data


def _mapping(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadRunFile(f"a JSON {type(data).__name__}, not an object")
    return data


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


def stem_wav(ws: Workspace, name: str, path: str) -> str:
    """Where a character's checked dub stem lives in the workspace (one file per stem file's fingerprint)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return str(ws.path / f"stem-{safe}-{film_fingerprint(path)[:16]}.wav")


@task(task_run_name="stems {name}")
def load_stems(
    stems: dict[str, str],
    frame_count: int,
    fps: str,
    config: dict[str, Any],
    ws: dict[str, str],
    name: str = "",
) -> dict[str, dict[str, Any]]:
    """Decode and check every character's dub stem like the dialogue track (length, rate, finite samples)
    into the workspace: {NAME: DialogueTrack dict}."""
    cfg, workspace = PipelineConfig.from_dict(config), Workspace.from_dict(ws)
    out = {}
    for character, path in sorted(stems.items()):
        wav = stem_wav(workspace, character, path)
        track = prepare_dialogue(path, frame_count=frame_count, fps=Fraction(fps), cfg=cfg.audio, out_wav=wav)
        out[character] = track.to_dict()
    return out


@task(task_run_name="characters {name}")
def plan_characters(
    video: dict[str, Any], records: list[dict[str, Any]], dialogue: dict[str, Any],
    stems: dict[str, dict[str, Any]], config: dict[str, Any], work_dir: str, name: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The film's characters and each shot's `cast.shot` (`tasks.decision.cast.film_cast`: the planning's face
    analyses and per-track embeddings, cached in the run workspace, then each stem's speech); the
    characters are also written to ``characters.json`` in the workspace."""
    info, track = VideoInfo.from_dict(video), DialogueTrack.from_dict(dialogue)
    cfg_of = shot_configs(config, records)

    def mono(t: DialogueTrack):
        return read_samples(t, 0, t.n_samples).mean(axis=1)

    stem_mono = {n: mono(DialogueTrack.from_dict(t)) for n, t in stems.items()}
    cast = film_cast(
        info, record_spans(records), lambda a, b: read_samples(track, a, b), track.sample_rate, stem_mono,
        cfg_of, work_dir,
    )  # fmt: skip
    atomic_write_json(Path(work_dir) / "characters.json", {"characters": list(cast.characters)})
    run_logger(log).info(
        "characters: %s", ", ".join(f"{c['name'] or c['id']} (shots {c['shots']})" for c in cast.characters)
    )
    return cast.to_dict()


@task(task_run_name="film speakers {name}")
def judge_speakers(
    video: dict[str, Any], records: list[dict[str, Any]], dialogue: dict[str, Any], config: dict[str, Any],
    work_dir: str, name: str = "",
) -> dict[str, Any]:  # fmt: skip
    """Who speaks, judged over the whole film (`tasks.decision.film_speakers`: every shot's face analysis,
    cached in the run workspace; the content map calibrated on the film's confident single-face lines; voices
    bound to characters): the changed shots' segments, which the planning puts into their `cast.shot`."""
    info, track = VideoInfo.from_dict(video), DialogueTrack.from_dict(dialogue)
    verdict = film_speakers(
        info, record_spans(records), lambda a, b: read_samples(track, a, b), track.sample_rate,
        shot_configs(config, records), work_dir,
        cast_characters(records),
    )  # fmt: skip
    run_logger(log).info(
        "film speakers: %d confident single-face line(s), map calibrated on %.1f s, voices bound %s, %d shot(s) changed",
        verdict.lines, verdict.calibrated_s, list(verdict.bound) or "none", len(verdict.segments),
    )  # fmt: skip
    return verdict.to_dict()


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


@task(task_run_name="plan file {name}")
def apply_plan_file(
    path: str,
    records: list[dict[str, Any]],
    config: dict[str, Any],
    name: str = "",
    video: dict[str, Any] | None = None,
) -> list:
    """The records with each shot's overrides from the editable shot plan at `path` (`tasks.decision.plan_file`;
    crops checked against `video`'s display frame), each naming the plan (`plan_file`) for later errors."""
    spans = [
        {"index": r["index"], **{k: r["plan"][k] for k in ("start_frame", "end_frame")}} for r in records
    ]
    frame_hw = None if video is None else VideoInfo.from_dict(video).display_size[::-1]
    overrides = plan_overrides(path, config, spans, frame_hw, check_options=check_backend_options)
    run_logger(log).info("%s: overrides for shot(s) %s", path, sorted(overrides) or "none")
    return [
        {**r, "overrides": overrides[r["index"]], "plan_file": path} if r["index"] in overrides else r
        for r in records
    ]


@task(task_run_name="keys {name}")
def key_shots(
    source: str,
    records: list[dict[str, Any]],
    dialogue: dict[str, Any],
    config: dict[str, Any],
    name: str = "",
    stems: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The records with each shot's result key (`tasks.timeline.shot_key`: its frames, conditioning audio and
    stems, effective settings, weights, render version)."""
    cfg = PipelineConfig.from_dict(config)
    fingerprint, track = film_fingerprint(source), DialogueTrack.from_dict(dialogue)
    stem_tracks = {n: DialogueTrack.from_dict(t) for n, t in (stems or {}).items()}
    out = []
    for record in records:
        inputs = shot_inputs(
            film_fingerprint=fingerprint,
            plan=record["plan"],
            audio_range=tuple(record["audio_range"]),
            track=track,
            config=shot_config(config, record.get("overrides")),
            context_s=cfg.workspace.audio_context_s,
            stems=stem_tracks,
            weights_identity=backend_weights_identity,
        )
        out.append({**record, "key": inputs.key()})
    return out


@task(task_run_name="speakers {name}")
def decide_speakers(
    video: dict[str, Any],
    records: list[dict[str, Any]],
    dialogue: dict[str, Any],
    config: dict[str, Any],
    work_dir: str,
    name: str = "",
) -> dict[int, dict[str, Any]]:
    """Every shot's dub decision before any GPU work, under its effective config (the shot's overrides
    applied): the dub slice's speech, then who on screen speaks (face analysis on the CPU, cached under the
    run workspace's faces/ by `tasks.timeline.shot_key.faces_key`, where the GPU workers and later runs find it)."""
    info = VideoInfo.from_dict(video)
    track = DialogueTrack.from_dict(dialogue)
    logger = run_logger(log)
    out: dict[int, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: "plan_file" not in r):  # a plan's bad speaker fails first
        plan, (a, b) = r["plan"], r["audio_range"]
        cfg = PipelineConfig.from_dict(shot_config(config, r.get("overrides")))
        s, e = plan["start_frame"], plan["end_frame"]
        cache = faces_path(work_dir, r["index"], s, e, cfg)
        try:
            d = decide_shot(r["index"], s, e, info, read_samples(track, a, b), track.sample_rate, cfg, cache)
        except ConfigError as ex:  # e.g. the plan's speaker is no face track of the shot: name the plan
            if "plan_file" not in r or ex.path != "gate":
                raise
            raise ConfigError(r["plan_file"], ex.problem) from ex
        agree = d.faces.mean_agreement() if d.faces is not None else {}
        asd = d.faces.mean_asd() if d.faces is not None else {}
        out[r["index"]] = {"dub": d.dub, "reason": d.reason, "regions": regions_json(d, plan["start_frame"]),
                           "agreement": {str(k): v for k, v in agree.items()},
                           "asd": {str(k): v for k, v in asd.items()},
                           "model_hw": backend_model_size(cfg, d, info, e - s),
                           "uncertain": uncertain_of(d, s)}  # fmt: skip
        logger.info("shot %04d: %s (%s)", r["index"], "dub" if d.dub else "pass through", d.reason)
    return out


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
        if verify_shot_done(workspace, shot["index"], shot["key"]) is None:
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
    dest: dict[str, Any] | None = None,
    key: str = "",
    noted: dict[str, list[int | str]] | None = None,
) -> str:
    """Join the shots, encode once, mux the dubbed audio, write `out` atomically.

    `dest`: the output folder and files as `tasks.run.outputs.claim_output` found them (checked again
    at the final rename); `key`: the workspace key the delivery record names; `noted`: the run's
    inputs as noted when it began (`tasks.run.inputs`), verified again after the encode read them.

    `records`: the shots' file records from their done markers, each verified before use (a shot
    that fails is marked not done, so a re-run renders it again). `stamp`: the output's container
    comment (`tasks.run.outputs.output_comment`: the dubflow stamp, plus the preview label of a preview).
    Skipped when `out` is the file this workspace last assembled from the same shot files, audio and
    encode settings (`assembled.json`) and its delivery record (this user's own, the file's bytes still
    its SHA-256) names those bytes: re-running a finished film costs no second encode, and an edited
    output is never "up to date".
    """
    cfg = PipelineConfig.from_dict(config)
    inputs = stable_hash(
        {
            "shots": [[p, Path(p).stat().st_size, Path(p).stat().st_mtime_ns] for p in shot_paths],
            "audio": film_fingerprint(audio_path),
            "pad": pad_audio,
            "encode": cfg.encode,
            "preview": cfg.workspace.preview,
            "out": str(Path(out).resolve()),
        }
    )
    stamp_path = Path(workdir) / "assembled.json"
    last = read_run_file(stamp_path, _mapping)  # `last`: never shadow the `stamp` parameter
    if last is not None and last.get("inputs") == inputs:
        delivered = written_record(out)  # this user's own record, the file's bytes still its (hashed)
        if delivered is not None and delivered.get("sha256") == last.get("sha256"):
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
            dest=None if dest is None else Destination.from_dict(dest),
            key=key,
            check=functools.partial(check_inputs_unchanged, noted) if noted else None,
        )
    except IntermediateError as exc:  # changed since it was verified: not done any more
        (Path(exc.path).parent / DONE).unlink(missing_ok=True)
        raise IntermediateError(
            exc.path, f"{exc.problem}; marked not done, re-run to render it again"
        ) from exc
    delivered = written_record(final) or {}
    atomic_write_json(stamp_path, {"inputs": inputs, "out": final, "sha256": delivered.get("sha256")})
    return final


@task(task_run_name="timeline {name}")
def export_timeline(
    out: str,
    source: str,
    video: dict[str, Any],
    records: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    audio_path: str,
    config: dict[str, Any],
    name: str = "",
    dest: dict[str, Any] | None = None,
    key: str = "",
    noted: dict[str, list[int | str]] | None = None,
) -> str:
    """`<out stem>.otio` next to `out`: source shots, dubbed shots (their lossless intermediates when the
    workspace is kept, else their range of `out`) and the dub audio (`<out stem>.dub.wav`, 48 kHz
    24-bit), at the source's timecodes; with
    `timeline.edl` / `timeline.fcp_xml` also `<out stem>.edl` / `.xml`."""
    cfg = PipelineConfig.from_dict(config)
    shots = [
        {
            "index": r["index"], "start_frame": r["plan"]["start_frame"], "end_frame": r["plan"]["end_frame"],
            "key": r["key"], "dubbed": row["status"] == "done", "reason": row["reason"],
            "path": row["output"] if cfg.workspace.keep else None,
        }
        for r, row in zip(records, rows, strict=True)
    ]  # fmt: skip
    fps = Fraction(video["fps"])
    wav = Path(out).with_suffix(".dub.wav")  # the dub for audio post, exactly the picture's duration
    post = {"duration_s": float(video["frame_count"] / fps), "pad": True}
    timeline = film_timeline(
        Path(source).stem, fps, source, video["frame_count"], shots, wav, out, timecode=video.get("timecode")
    )
    formats = [name for name in EXTRA_FORMATS if getattr(cfg.timeline, name)]
    if dest is None:  # every writer through the delivery rules: only a claimed output gets sidecars
        raise OutputError(
            out, "no claimed destination (tasks.run.outputs.claim_output): sidecars not written"
        )
    where = Destination.from_dict(dest)  # staged privately, then delivered like the film
    with staging(where, Path(out).name) as folder:
        staged = [write_post_wav(audio_path, folder / wav.name, **post)]
        staged += [write_timeline(folder / Path(out).with_suffix(".otio").name, timeline)]
        staged += write_extra_timelines(folder / Path(out).name, timeline, formats)
        check_inputs_unchanged(noted or {})  # the dub track read above is still the one noted
        _, path, *extras = [deliver(where, f, f.name, key, Path(out).name) for f in staged]
    run_logger(log).info("edit-suite timeline %s (OpenTimelineIO)", path)
    for extra in extras:
        run_logger(log).info("edit-suite timeline %s", extra)
    return str(path)


def timeline_paths(out: str, config: dict[str, Any]) -> list[str]:
    """The sidecars `export_timeline` writes next to `out` (`.dub.wav`, `.otio`, then `.edl` / `.xml`)."""
    cfg = PipelineConfig.from_dict(config)
    suffixes = [".dub.wav", ".otio"] + [
        EXTRA_FORMATS[n][1] for n in EXTRA_FORMATS if getattr(cfg.timeline, n)
    ]
    return [str(Path(out).with_suffix(suffix)) for suffix in suffixes]
