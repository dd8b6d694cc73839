"""Who speaks in a multi-shot film, per dialogue turn, with and without the film-level verdict.

The film is `tests/film_cases.py`'s (14 shots of 2 s, four recurring people, singles, two-shots of two talking
faces, a speaker beside a still listener, reaction shots under off-screen voices; truth by construction).  It
goes through the product's planning path (`flows.estimate.estimate_film`, what `dubflow estimate --json` runs:
shots, the face analysis, the film step, the gate) with `speaker.film: off` (each shot judged alone),
with the calibration let in on 3 s of lines (alone, and with the binding), and with the defaults (`auto`: the
binding; the calibration needs 20 s, more than these films have), sharing one work folder so the analysis runs once.  Per turn
(one per shot): right & confident, uncertain, wrong (a confident region on another face, or a dub where nobody
on screen speaks), partly missed (confident and on the right face, but under 80 % of the speech dubbed).

    PYTHONPATH=. .venv/bin/python benchmarks/film_speakers.py --work /tmp/film_speakers [--cast b] [--set speaker.KEY=VALUE]
"""

from __future__ import annotations

import argparse
import collections
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.estimate import estimate_film
from tasks.config.pipeline import load_config
from tests.film_cases import FILM, N, Shot, film_audio, side_of, voice, write_film
from tests.speaker_cases import SR


def speech_frames(audio: np.ndarray, n: int) -> np.ndarray:
    """(n,) bool: the frames of a shot's sound the VAD hears speech in (what the gate dubs)."""
    from tasks.perception.vad import StreamingVad, at_frames

    vad = StreamingVad()
    return at_frames(np.concatenate([vad.feed(audio), vad.finish()]), n, 25.0) >= 0.5


def judge_turn(shot: Shot, regions: list[dict[str, Any]], speech: np.ndarray, first: int) -> tuple[str, str]:
    """(right | uncertain | wrong | missed, why) of one shot's turn from the estimate's regions of that shot:
    right = confident regions only, all on the speaking face, covering >= 80 % of the shot's speech frames;
    missed = confident and on that face, but less of the speech dubbed (the rest judged "nobody on screen")."""
    truth = shot.speaker_side()
    if truth is None:
        if not regions:
            return "right", "nobody dubbed"
        if all(r["status"] == "uncertain" for r in regions):
            return "uncertain", "uncertain dub"
        return "wrong", f"dubbed {side_of(regions[0]['box'], shot)} confidently"
    if not regions:
        return "wrong", "speaker missed (nothing dubbed)"
    sure = [r for r in regions if r["status"] == "speaker"]
    if any(side_of(r["box"], shot) != truth for r in sure):
        return "wrong", "a confident region on another face"
    dubbed = np.zeros(len(speech), bool)
    for r in sure:
        dubbed[max(0, r["start_frame"] - first) : r["end_frame"] - first] = True
    share = float(dubbed[speech].mean()) if speech.any() else 1.0
    if sure and all(r["status"] == "speaker" for r in regions):
        return ("right" if share >= 0.8 else "missed"), f"{100 * share:.0f} % of the speech on {truth}"
    return "uncertain", ", ".join(f"{r['status']} {side_of(r['box'], shot)}" for r in regions)


def run(
    source: Path, audio: Path, work: Path, updates: dict[str, Any], cast: str
) -> tuple[list[tuple[str, str]], float]:
    cfg = load_config(updates=updates)
    t0 = time.process_time()
    est = estimate_film(source, audio, cfg, work_dir=work)
    cpu = time.process_time() - t0
    out = []
    for i, shot in enumerate(FILM):
        s = next((e for e in est.shots if e.start_frame <= i * N < e.end_frame), None)
        regs = [r for r in (s.regions if s is not None else ()) if i * N <= r["start_frame"] < (i + 1) * N]
        out.append(judge_turn(shot, regs, speech_frames(voice(shot.voice, cast), N), i * N))
    if len(est.shots) != len(FILM):
        logging.warning("the shot detector found %d shots, the film has %d", len(est.shots), len(FILM))
    return out, cpu


def _value(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tasks.decision.film_speakers").setLevel(logging.INFO)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="speaker.KEY=VALUE for both runs")
    ap.add_argument("--cast", default="a", help="who plays whom (tests/film_cases.py CASTS)")
    ap.add_argument("--fresh", action="store_true", help="remove the work folder's analyses first")
    args = ap.parse_args()
    if args.fresh and args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True, exist_ok=True)
    source = args.work / "film.mp4"
    if not source.is_file():
        write_film(source, FILM, args.cast)
    dub = args.work / "dub.wav"
    if not dub.is_file():
        import soundfile as sf

        sf.write(dub, film_audio(FILM, args.cast), SR, subtype="FLOAT")
    extra: dict[str, Any] = {}
    for item in args.set:
        key, _, val = item.partition("=")
        section, _, name = key.partition(".")
        extra.setdefault(section, {})[name] = _value(val)
    modes = {  # each shot alone; the calibration let in on 3 s (default 20 s), alone and with the binding; defaults
        "off": {"film": "off"},
        "calibration@3s only": {"film": "auto", "bind_min_lines": 10**6, "film_min_s": 3.0},
        "calibration@3s + binding": {"film": "auto", "film_min_s": 3.0},
        "auto": {"film": "auto"},
    }
    results = {}
    for mode, keys in modes.items():
        updates = {**extra, "speaker": {**extra.get("speaker", {}), **keys}}
        turns, cpu = run(source, dub, args.work / "ws", updates, args.cast)
        results[mode] = turns
        n = collections.Counter(v for v, _ in turns)
        print(f"{mode}: {n['right']} right / {n['uncertain']} uncertain / {n['wrong']} wrong / "
              f"{n['missed']} partly missed of {len(turns)} turns ({cpu:.1f} CPU-s)")  # fmt: skip
    print("\n| shot | kind | truth | " + " | ".join(f"film {m}" for m in modes) + " |")
    print("|---|---|---|" + "---|" * len(modes))
    for i, shot in enumerate(FILM):
        truth = shot.voice[0] if shot.speaker_side() else f"none ({shot.voice[0]} off screen)"
        cells = " | ".join(f"{results[m][i][0]} ({results[m][i][1]})" for m in modes)
        print(f"| {i} | {shot.kind()} | {truth} | {cells} |")


if __name__ == "__main__":
    main()
