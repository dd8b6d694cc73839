"""`dubflow` command line.

    dubflow dub SOURCE --audio DUB [--mix MIX] --out OUT [--overwrite] [--config FILE] [--backend NAME]
                [--set k=v ...] [--plan PLAN.yaml] [--preview] [--stem NAME=FILE ...] [--cast CAST.yaml]
                [--language CODE] [--no-prefect]
    dubflow shots SOURCE [--config FILE] [--set k=v ...]       # JSON shot list (end_frame/end_s exclusive)
    dubflow plan SOURCE --audio DUB [--config FILE] [--set ...] # JSON chunk plan per shot
    dubflow plan SOURCE --audio DUB --out PLAN.yaml            # the editable shot plan (tasks/decision/plan_file.py)
    dubflow estimate SOURCE --audio DUB [--config FILE] [--set ...] [--json]  # shots to dub, GPU time
    dubflow weights verify DIR | dubflow weights download [--to DIR] [--mode M] [--quant Q] [--multi]

`dub` runs the `dub-film` Prefect flow in this process (against `PREFECT_API_URL` if set, else a
temporary server of its own in its own session: `flows/local_server.py`) or, with `--no-prefect`, the same
tasks as plain calls. One Ctrl-C or SIGTERM stops it in seconds, keeping what finished, with one line saying
how to resume (`tasks/render/interrupts.py`); docs/running.md describes the console, the report and the QC sheets. `shots` and
`plan` never import Prefect or torch. Failures print one line, `dubflow: error: <file>: <problem>`
(`<key>: <problem>` for a config value), and exit with status 1 (no traceback; `--debug` shows it).
`dub` checks before Prefect starts what would otherwise fail late: config values, the output path
(anywhere its user says, never a file dubflow did not write; the output roots of `tasks/run/outputs.py`
confine only the deployment's `out` parameter), the delivery pixel format against the film's frame
size, the dub's and the mix's lengths against the picture, stems, cast and plan file. A run's log file
(`tasks/run/run_log.py`) holds the tracebacks; the error line of a failed run names it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("dubflow")

# Each command imports the project modules it needs inside its function (the only function-local imports
# of flows/): `shots` and `plan` must start without Prefect or torch (tests/test_cli.py checks it). Outside
# them only the standard library loads before `main`'s handlers are in place, so a Ctrl-C at the very start
# still ends with the resume line (only the interpreter's own start-up, before this file, is out of reach).


def _add_cast_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--stem", dest="stems", action="append", default=[], metavar="NAME=FILE",
        help="one character's dub stem (repeatable): who speaks when; --audio stays the track that is muxed",
    )  # fmt: skip
    p.add_argument(
        "--cast", metavar="FILE", help="cast file: characters: {NAME: [still.png, ...]}, undub: [NAME]"
    )


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file overriding configs/default.yaml")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config value, e.g. --set color.strength=0.5 (repeatable)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dubflow", description="Batch film dubbing with InfiniteTalk.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True)

    dub = sub.add_parser("dub", help="dub a film")
    dub.add_argument("source", help="the film (any container/codec ffmpeg reads)")
    dub.add_argument("--audio", required=True, metavar="DUB", help="dubbed dialogue track (drives the lips)")
    dub.add_argument(
        "--mix", metavar="MIX", help="final mix to put in the output (default: the dialogue track)"
    )
    dub.add_argument(
        "--out", required=True, metavar="OUT",
        help="output file (.mp4, .mov, .mkv), anywhere (a missing folder is created)",
    )  # fmt: skip
    dub.add_argument(
        "--overwrite", action="store_true",
        help="replace OUT if it is an earlier dubflow output of another film or pass (never a file dubflow did not write)",
    )  # fmt: skip
    dub.add_argument(
        "--backend", metavar="NAME", help="backend (passthrough = dry run); same as --set backend.name="
    )
    dub.add_argument(
        "--no-prefect", action="store_true", help="run the steps without Prefect (no server, no UI)"
    )
    dub.add_argument(
        "--language", metavar="CODE",
        help="language of the dubbed audio track, ISO 639-2 (deu, fra, spa, ...); same as --set encode.audio_language=",
    )  # fmt: skip
    dub.add_argument("--plan", metavar="PLAN", help="an edited shot plan (dubflow plan --out) to apply")
    dub.add_argument(
        "--preview", action="store_true", help="fast preview pass (configs/preview.yaml), own workspace"
    )
    _add_cast_args(dub)
    _add_config_args(dub)

    shots = sub.add_parser("shots", help="print the shot partition as JSON")
    shots.add_argument("source")
    _add_config_args(shots)

    plan = sub.add_parser(
        "plan", help="print the per-shot chunk plan as JSON, or write the editable shot plan"
    )
    plan.add_argument("source")
    plan.add_argument("--audio", required=True, metavar="DUB")
    plan.add_argument(
        "--out", metavar="PLAN", help="write the editable shot plan YAML here (decisions, override fields)"
    )
    _add_cast_args(plan)
    _add_config_args(plan)

    estimate = sub.add_parser(
        "estimate",
        help="shots to dub, chunks and expected GPU time (no GPU work; decodes a few frames per shot)",
    )
    estimate.add_argument("source")
    estimate.add_argument("--audio", required=True, metavar="DUB")
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    _add_cast_args(estimate)
    _add_config_args(estimate)

    weights = sub.add_parser("weights", help="check or fetch model weights")
    wsub = weights.add_subparsers(dest="weights_command", required=True)
    verify = wsub.add_parser("verify", help="check a weights directory")
    verify.add_argument("dir")
    download = wsub.add_parser("download", help="download the weights (Hugging Face Hub)")
    download.add_argument("--to", default="weights", metavar="DIR")
    for p in (verify, download):
        p.add_argument("--mode", default="infinitetalk-480", help="infinitetalk-480 | infinitetalk-720")
        p.add_argument(
            "--quant", default="none", help="none | fp8 | int8 | gguf-<tag> (gguf-Q8_0, gguf-Q4_K_M, ...)"
        )
        p.add_argument(
            "--multi", action="store_true", help="also the multi-person checkpoint (two speakers at once)"
        )
    return parser


def _config(args: argparse.Namespace, extra: list[str] | None = None) -> Any:
    from tasks.config.pipeline import load_config

    updates = None
    if getattr(args, "cast", None):
        from tasks.decision.cast import read_cast_file

        updates = {"cast": read_cast_file(args.cast)}
    return load_config(
        args.config, [*args.overrides, *(extra or [])], updates=updates,
        preview=bool(getattr(args, "preview", False)),
    )  # fmt: skip


def _stems(args: argparse.Namespace) -> dict[str, str]:
    """`--stem NAME=FILE` as {NAME: FILE}, each file's header read now (a bad file fails before any work)."""
    from tasks.decision.stems import parse_stems
    from tasks.media.probe import read_header

    stems = parse_stems(getattr(args, "stems", None) or [])
    for path in stems.values():
        read_header(path)
    return stems


def cmd_shots(args: argparse.Namespace) -> int:
    from tasks.media.probe import probe
    from tasks.timeline.shots import detect_shots

    cfg = _config(args)
    info = probe(args.source, frame_count=cfg.probe.frame_count)
    shots = detect_shots(info, cfg.shots)
    print(json.dumps([s.to_dict(shots.fps) for s in shots.shots], indent=1))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import tempfile

    from flows.prepare import LocalSteps, prepare_film
    from tasks.render.preflight import check_config

    cfg = _config(args)
    check_config(cfg)
    if args.out:
        return _write_plan_file(args, cfg, _stems(args))
    with tempfile.TemporaryDirectory(prefix="dubflow-plan-") as scratch:
        film = prepare_film(args.source, args.audio, cfg, LocalSteps(cfg, Path(scratch)), through="plans")
    out = []
    for shot, r in zip(film.shots["shots"], film.records, strict=True):
        d = dict(r["plan"])
        d["start_s"], d["end_s"] = shot["start_s"], shot["end_s"]
        d["audio_samples"] = list(r["audio_range"])
        d["sample_rate"] = cfg.audio.sample_rate
        out.append(d)
    print(json.dumps(out, indent=1))
    return 0


def _write_plan_file(args: argparse.Namespace, cfg: Any, stems: dict[str, str]) -> int:
    """`dubflow plan --out`: the gate's decision and its dubbed regions (speaker per turn) per shot, as YAML."""
    from fractions import Fraction

    from flows.estimate import estimate_film
    from tasks.backends import plan_auto
    from tasks.decision.plan_file import plan_document, write_plan
    from tasks.media.deliver import check_replaceable

    # before any work: never over an input, a user's file or an edited plan (the delivery rules)
    check_replaceable(args.out, [args.source, args.audio, args.cast, args.config, *stems.values()])
    est = estimate_film(args.source, args.audio, cfg, stems)
    config = cfg.to_dict()
    shots = [{**dataclasses.asdict(s), "backend": plan_auto(config, s.index)} for s in est.shots]
    doc = plan_document(args.source, args.audio, Fraction(est.fps), est.frames, shots)
    if (
        est.characters
    ):  # the automatic clusters, to confirm or rename (tasks.decision.cast.plan_names reads them)
        from tasks.decision.cast import plan_characters

        doc["characters"] = plan_characters(est.characters)
    print(write_plan(args.out, doc))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from flows.estimate import estimate_film

    est = estimate_film(args.source, args.audio, _config(args), _stems(args))
    print(json.dumps(est.to_dict(), indent=1) if args.json else est.format())
    return 0


def _check_dub_inputs(args: argparse.Namespace, cfg: Any) -> dict[str, str]:
    """Everything about the inputs that can fail, checked before Prefect starts (one line each).

    The film is probed (frame count and rate), the dub and the mix are decoded at 8 kHz and measured
    against the picture under `audio.length_policy`; the stems, the cast and the plan file open.
    Returns the stems.
    """
    from tasks.media.audio import check_mix
    from tasks.media.probe import probe, read_header
    from tasks.media.profiles import check_size, delivery
    from tasks.render.preflight import check_frame_size

    info = probe(args.source, frame_count=cfg.probe.frame_count)
    check_frame_size(args.source, info.width, info.height, delivery(cfg.encode, info.pix_fmt).pix_fmt)
    check_size(cfg.encode, args.source, info.width, info.height)
    for p in (args.audio, args.mix):
        if p:
            read_header(p)
            check_mix(p, frame_count=info.frame_count, fps=info.fps, policy=cfg.audio.length_policy)
    stems = _stems(args)
    from tasks.decision.cast import check_cast, plan_names

    names = plan_names(args.plan) if args.plan else {}  # a stem may be named after a plan's rename
    check_cast(
        dataclasses.replace(cfg, cast=dataclasses.replace(cfg.cast, names={**cfg.cast.names, **names})), stems
    )
    if args.plan:
        from tasks.decision.plan_file import read_plan

        read_plan(args.plan)  # a malformed plan fails here; shot indices and spans are checked by the run
    return stems


def _language(code: str) -> str:
    """`--language`: an ISO 639-2 code (three lower-case letters, e.g. deu), else a one-line ConfigError."""
    from tasks.errors import ConfigError

    if not re.fullmatch(r"[a-z]{3}", code):
        raise ConfigError(
            "--language", f"{code!r} is not an ISO 639-2 code (three letters: deu, fra, spa, jpn, ...)"
        )
    return code


def cmd_dub(args: argparse.Namespace) -> int:
    extra = [f"backend.name={args.backend}"] if args.backend else []
    if args.language:
        extra.append(f"encode.audio_language={_language(args.language)}")
    cfg = _config(args, extra)
    from tasks.media.assemble import check_output_path
    from tasks.media.profiles import check_container
    from tasks.render.preflight import check_config, check_run_config
    from tasks.run.outputs import local_output, local_output_allowed

    # cheap checks before any Prefect start-up: the config can work, the output is usable
    check_config(cfg)
    check_output_path(args.out, args.source, args.audio, args.mix)
    check_container(cfg.encode, args.out)
    local_output(args.out)  # anywhere the user says; never a file dubflow did not write
    from tasks.run.run_log import log_path
    from tasks.run.workspace_roots import workspace_root

    log_file = log_path(workspace_root(cfg), args.source)
    if not args.debug:  # model loaders' progress bars (transformers, huggingface_hub) stay off the console
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from flows.prefect_signals import dubflow_owns_sigterm, outside_prefect_engine
    from tasks.render.interrupts import check_stop, stop_on_signals

    with contextlib.ExitStack() as stack:
        server = None
        if not args.no_prefect and not os.environ.get("PREFECT_API_URL"):
            # no server configured: a temporary one of our own (flows/local_server.py) in its own session,
            # started while the inputs are checked; its URL set before Prefect is imported (read once)
            from flows.local_server import TemporaryServer

            server = TemporaryServer()
            server.keep_log_as = log_file.with_suffix(".server.log")
            stack.callback(server.stop)  # before it starts: a stop at any instant after this stops it
        # from here a Ctrl-C / SIGTERM only asks to stop; the stop is raised where it is safe (a line of
        # ours, not of Prefect's engine), else the last resort ends the process (flows/prefect_signals.py)
        stack.enter_context(
            stop_on_signals(
                cfg.checks.interrupt_grace_s, _stopping, safe_to_raise=outside_prefect_engine,
                last_resort=lambda name: _last_resort(name, args.argv, server),
                last_resort_s=cfg.checks.interrupt_grace_s + 2.0,
            )
        )  # fmt: skip
        if server is not None:
            server.start()
            os.environ["PREFECT_API_URL"] = server.api_url
            stack.callback(os.environ.pop, "PREFECT_API_URL", None)
        stems = _check_dub_inputs(args, cfg)
        check_run_config(cfg)  # the backend's own options (imports it: after the header-only checks)
        check_stop()  # a Ctrl-C during the checks: nothing started yet
        import flows.film_tasks  # noqa: F401 - Prefect's import (and its logging setup, undone here)
        from tasks.run.run_log import quiet_console, run_log

        quiet_console(logging.DEBUG if args.debug else logging.INFO)
        stack.enter_context(run_log(log_file))
        if not args.no_prefect:
            stack.enter_context(dubflow_owns_sigterm())
        out = stack.enter_context(local_output_allowed(args.out, args.source))
        if server is not None:
            log.debug("temporary Prefect server ready in %.1f s", server.wait_ready(180))
        check_stop()
        if args.no_prefect:
            from flows.dub_film import dub_film_inline

            final = dub_film_inline(
                args.source, args.audio, str(out), args.mix, cfg.to_dict(), args.plan, overwrite=args.overwrite,
                stems=stems,
            )  # fmt: skip
        else:
            from flows.dub_film import dub_film

            final = dub_film(
                args.source, args.audio, str(out), args.mix, cfg.to_dict(), plan=args.plan,
                overwrite=args.overwrite, stems=stems,
            )  # fmt: skip
    print(final)
    return 0


def _stopping(signal_name: str) -> None:
    """The line a first Ctrl-C / SIGTERM prints (from the signal handler: one raw write; a console that is
    gone, e.g. a `| tee` the same Ctrl-C ended, must not raise on the run's current line)."""
    with contextlib.suppress(OSError):
        os.write(
            2, f"dubflow: {signal_name}: stopping after the chunk in flight (again to stop now)\n".encode()
        )


def _last_resort(signal_name: str, argv: list[str], server: Any) -> None:
    """A stop that could not end the run in time (it was due on lines where raising it is unsafe, or the
    clean-up hangs, e.g. on a QC thread): the resume line, the temporary server stopped, exit 130 now.
    Finished chunks and shots are on disk already and locks are flocks the kernel drops (called from a
    timer thread)."""
    with contextlib.suppress(OSError):
        os.write(2, (_resume_line(signal_name, argv) + "\n").encode())
    if server is not None:
        server.kill()  # whatever the main thread's own stop of it had reached
    os._exit(130)


def _resume_line(name: str, argv: list[str]) -> str:
    """The one line an interrupted command ends with: what stopped it (a signal's name) and the command
    that resumes."""
    import shlex

    return (
        f"dubflow: stopped by {name}; finished shots and chunks are kept; to resume, run again: "
        f"{shlex.join(['dubflow', *argv])}"
    )


def cmd_weights(args: argparse.Namespace) -> int:
    from model.weights.layout import download_files, download_weights, has_multi, verify_weights

    if args.weights_command == "verify":
        problems = verify_weights(Path(args.dir), args.mode, args.quant, multi=args.multi)
        for p in problems:
            print(p)
        if problems:
            print(f"dubflow: error: {args.dir}: {len(problems)} problem(s) with the weights", file=sys.stderr)
            return 1
        multi = (
            "multi-person checkpoint present"
            if has_multi(Path(args.dir), args.quant, args.mode)
            else "no multi-person checkpoint: two-speaker segments dub the louder speaker"
        )
        print(f"{args.dir}: weights OK ({args.mode}, quant {args.quant}; {multi})")
        return 0
    from tasks.run.outputs import delivered_folder

    # by the delivery rules: staged privately, then each file moved in with its record; never over a file
    # dubflow did not write (every file known in advance is checked before anything is created or fetched)
    expected = [f.path for f in download_files(args.mode, args.quant, multi=args.multi)]
    key = f"weights:{args.mode}:{args.quant}"
    with delivered_folder(args.to, key, expected, stem="weights") as staged:
        download_weights(staged, args.mode, args.quant, multi=args.multi)
    print(Path(args.to).expanduser().resolve())
    return 0


def _exit_now(code: int) -> None:
    """Exit at once with `code` after flushing the console and the log files (threads are not joined)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a console that is gone
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _log_note(ex: BaseException) -> str:
    """`` (traceback in PATH)`` when the failure happened in a run that has a log file."""
    path = getattr(ex, "run_log", None)
    return f" (traceback in {path})" if path else ""


def _console(args: argparse.Namespace) -> None:
    """The console's logging: one line per message (tracebacks go to the run's log file), or everything
    with `--debug`."""
    from tasks.run.run_log import FORMAT, console_handler

    level = logging.DEBUG if args.debug else logging.INFO
    if args.debug:
        logging.basicConfig(level=level, format=FORMAT, datefmt="%H:%M:%S", stream=sys.stderr)
    else:  # tracebacks go to the run's log file (tasks/run/run_log.py), not to the console
        logging.basicConfig(level=level, handlers=[console_handler(level)])
    for noisy in ("httpx", "httpcore"):  # Prefect's API client logs every request at INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    command = argv is None  # the `dubflow` command itself (not a call from Python)
    argv = sys.argv[1:] if argv is None else list(argv)
    args: argparse.Namespace | None = None
    handlers = {
        "dub": cmd_dub, "shots": cmd_shots, "plan": cmd_plan, "estimate": cmd_estimate, "weights": cmd_weights,
    }  # fmt: skip
    try:  # everything, so that a Ctrl-C at any instant ends with the lines below
        args = build_parser().parse_args(argv)
        args.argv = argv
        _console(args)
        return handlers[args.command](args)
    except KeyboardInterrupt as ex:  # a Ctrl-C or SIGTERM (tasks.render.interrupts): what finished is kept
        if args is not None and args.debug:
            raise
        name = getattr(ex, "signal_name", "SIGINT")
        with contextlib.suppress(OSError):  # a console that is gone (`| tee` ended by the same Ctrl-C)
            print(
                _resume_line(name, argv) if argv[:1] == ["dub"] else "dubflow: interrupted", file=sys.stderr
            )
        if command:  # everything that must be undone was (locks, children, the server): no waiting for
            _exit_now(130)  # a helper thread still busy with the next shot's preparation
        return 130
    except Exception as ex:  # a user's error (DubflowError: the line says it all) or an unexpected failure
        if args is not None and args.debug:
            raise
        from tasks.errors import DubflowError

        if isinstance(ex, DubflowError):
            print(f"dubflow: error: {ex}", file=sys.stderr)
            return 1
        where = getattr(args, "source", None) or getattr(args, "dir", None) or "dubflow"
        msg = " ".join(f"{type(ex).__name__}: {ex}".split())
        note = _log_note(ex) or " (run with --debug for the traceback)"
        print(f"dubflow: error: {where}: {msg}{note}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
