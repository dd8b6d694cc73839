"""Who speaks when two mouths move: the audio-visual cases (tests/av_cases.py) through the real pipeline.

Encodes every case (``--splits``: ``tune``, the one the `speaker.*` thresholds were set on, ``held_out``,
seen while the learned route was built, and ``held_out_2``, run once after the rules were settled) as a
film, decides it as one shot (`tasks.decision.shot_decision.decide_shot`: decode, VAD, faces, agreement,
gate) and prints per case: the truth, the gate's speaker turns (frames, face or none,
status, score; `speaker.uncertain` decides what an uncertain turn dubs), each
face's mean agreement over the speech, the verdict (right / uncertain / wrong), the onset error of each
true turn in frames (first dubbed frame minus the frame its speech starts; <= 0 is in time) and the switch
error of the turn-taking case, plus the analysis's CPU-s per video-s of each case.  `--set KEY=VALUE`
overrides the config.  CPU only, a few minutes.  Must not be imported by the pipeline.

    PYTHONPATH=. python benchmarks/bench_av_speaker.py [--splits tune,held_out,held_out_2] [--only NAME] [--sizes 80,120,...] [--close-ups 0,20] [--set speaker.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config.pipeline import load_config
from tasks.decision.gate import speaker_turns
from tasks.decision.shot_decision import decide_shot
from tasks.media.probe import probe
from tests.av_cases import SETS, av_cases, close_up, judge, small_face
from tests.speaker_cases import FPS, SR, encode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument(
        "--sizes", default="", help="instead: the small-face wide shot at these face heights (px)"
    )
    ap.add_argument(
        "--splits",
        default="tune,held_out",
        help="comma-separated sets (held_out_2..5: see tests/av_cases.py)",
    )
    ap.add_argument(
        "--close-ups",
        default="",
        help="instead: each seed alone with its own voice, from these frames (0,20)",
    )
    args = ap.parse_args()
    cfg = load_config(overrides=args.set)
    print(
        "| case | truth | turns: frames face status score | agreement per face | ASD score per face | result | onset (frames) | switch (s) | CPU-s/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        splits = tuple(args.splits.split(","))
        todo = av_cases(splits)
        if args.sizes:  # the smallest reliable face: the wide shot at several sizes, each set
            px = [int(v) for v in args.sizes.split(",")]
            todo = {
                f"{sp}/small_face_{p}px": small_face(sp, SETS[sp].a, SETS[sp].b, p, SETS[sp].b_phase)
                for p in px
                for sp in splits
            }
        if args.close_ups:  # each seed alone on screen with its own voice, from these frames
            todo = {
                f"close_up/{i}@{f}": close_up(i, int(f))
                for f in args.close_ups.split(",")
                for i in range(1, 6)
            }
        for name, case in todo.items():
            if args.only not in name:
                continue
            info = probe(encode(Path(tmp) / f"{name.replace('/', '_')}.mp4", case.frames, case.audio))
            d = decide_shot(0, 0, info.frame_count, info, case.audio, SR, cfg)
            shot = d.faces
            faces = shot.to_dict()
            turns = [
                (
                    t.start,
                    t.end,
                    None if t.track is None else case.who(shot.track(t.track).boxes[0]),
                    t.status,
                    t.score,
                )
                for t in speaker_turns(shot, cfg.speaker.uncertain, cfg.speaker.min_score)
            ]
            v = judge(case, [t[:4] for t in turns])
            truth = ", ".join(f"{a}-{b} {'none' if k is None else f'face {k}'}" for a, b, k in case.truth)
            shown = "; ".join(
                f"{a}-{b} {'none' if k is None else f'face {k}'} {st} {sc:.2f}" for a, b, k, st, sc in turns
            )
            agree = []
            for t, row in zip(faces["tracks"], faces.get("agreement") or [], strict=False):
                vals = [v for v in row if v is not None]
                k = case.who(t["boxes"][0])
                agree.append(f"{k}: {np.mean(vals):+.2f}" if vals else f"{k}: -")
            asd = ", ".join(
                f"{case.who(shot.track(k).boxes[0])}: {v:+.2f}" for k, v in shot.mean_asd().items()
            )
            cost = faces["cpu_s"] / (case.frames.shape[0] / FPS)
            sw = "" if v.switch_s is None else f"{v.switch_s:+.2f}"
            print(
                f"| {name} | {truth} | {shown} | {', '.join(agree)} | {asd or '-'} | {v.result} ({v.why}) | "
                f"{'/'.join(map(str, v.onset_frames))} | {sw} | {cost:.2f} |"
            )


if __name__ == "__main__":
    main()
