"""Who speaks on the composed real-footage cases (tests/speaker_cases.py): the per-case table and the activity split.

Encodes every case as a film, decides it as one shot through the real decode, VAD, faces and gate
(`tasks.decision.shot_decision.decide_shot`), and prints, per case, what is dubbed (side, status, score) against the
truth, the turn-taking switch error and how much of each true turn is dubbed.  Then the per-step mouth
activity (the decision's 0.2 s steps with source speech, smoothed over `speaker.smooth_s`) of talking
mouths against still ones (listeners; still pictures left out), pooled over every case, with their
equal-error point: the value `speaker.activity_on` is derived from.  `--set KEY=VALUE` overrides the
config (e.g. `--set speaker.mouth_lag_s=0.08` for the old two-frame lag).  CPU only, about a minute.
Must not be imported by the pipeline.

    PYTHONPATH=. python benchmarks/bench_speaker.py [--set speaker.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config.pipeline import load_config
from tasks.decision.shot_decision import decide_shot
from tasks.media.probe import probe
from tests.speaker_cases import FPS, SR, Case, cases, encode, side_of, turn_coverage


def _verdict(case: Case, dubbed: list[tuple[int, int, str, str]]) -> str:
    """The tests' criteria for one case, in words."""
    sides = [d[2] for d in dubbed]
    want = [t[2] for t in case.truth]
    if want == [None]:
        return "right" if not dubbed else "WRONG (dubbed)"
    if case.ambiguous:
        ok = all(d[2] == want[0] or d[3] == "uncertain" for d in dubbed)
        return "right or uncertain" if ok else "WRONG"
    cover = turn_coverage(case, [d[:3] for d in dubbed])
    if sides != want or min(cover) < 0.9:
        return "WRONG"
    if len(want) > 1:
        err = dubbed[1][0] / FPS - case.truth[1][0]
        return "right" if abs(err) <= 0.5 else "WRONG (switch)"
    return "right"


def _split(case: Case, faces: dict, smooth: int) -> tuple[list[float], list[float]]:
    """(talking, still) per-step activity of a case's non-still tracks in the speech steps."""
    step = faces["step_frames"]
    talk, still = [], []
    for track, row in zip(faces["tracks"], faces["activity"], strict=True):
        if track["still"]:
            continue
        side = side_of(track["boxes"][0])
        vals = np.array([np.nan if v is None else v for v in row], np.float64)
        ok = ~np.isnan(vals)
        kernel = np.ones(smooth)
        num = np.convolve(np.where(ok, vals, 0.0), kernel, "same")
        den = np.convolve(ok.astype(float), kernel, "same")
        for s, p in enumerate(faces["speech"]):
            if p < 0.5 or den[s] == 0 or not ok[s]:
                continue
            t = (s + 0.5) * step / FPS
            who = next((w for a, b, w in case.truth if a <= t < b), case.truth[-1][2])
            (talk if who == side or case.ambiguous else still).append(float(num[s] / den[s]))
    return talk, still


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    args = ap.parse_args()
    cfg = load_config(overrides=args.set)
    smooth = max(1, round(cfg.speaker.smooth_s / cfg.speaker.step_s))
    talk: list[float] = []
    still: list[float] = []
    print("| case | truth | dubbed: frames side status score | result |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in cases().items():
            info = probe(encode(Path(tmp) / f"{name}.mp4", case.frames, case.audio))
            d = decide_shot(0, 0, info.frame_count, info, case.audio, SR, cfg)
            dubbed = [
                (r.start_frame, r.end_frame, side_of(r.plan.face_box or r.plan.box), r.status, r.score)
                for r in d.regions
            ]
            truth = ", ".join(f"{a:g}-{b:g} s {w or 'none'}" for a, b, w in case.truth)
            shown = "; ".join(f"{a}-{b} {s} {st} {sc:.2f}" for a, b, s, st, sc in dubbed) or d.reason
            extra = ""
            if len(case.truth) > 1 and len(dubbed) > 1:
                cover = turn_coverage(case, [x[:3] for x in dubbed])
                extra = f" (switch {dubbed[1][0] / FPS - case.truth[1][0]:+.2f} s; turns dubbed "
                extra += "/".join(f"{c:.0%}" for c in cover) + ")"
            print(f"| {name} | {truth} | {shown} | {_verdict(case, dubbed)}{extra} |")
            t, s = _split(case, d.faces.to_dict(), smooth)
            talk, still = talk + t, still + s
    tk, st = np.array(talk), np.array(still)
    xs = np.linspace(0.02, 0.4, 381)
    miss = np.array([(tk < x).mean() for x in xs])
    false = np.array([(st >= x).mean() for x in xs])
    i = int(np.argmin(np.abs(miss - false)))
    pct = (10, 50, 90)
    print(
        f"\nper-step activity, talking ({len(tk)} steps) p10/p50/p90: "
        + "/".join(f"{v:.3f}" for v in np.percentile(tk, pct))
        + f"; still ({len(st)}): " + "/".join(f"{v:.3f}" for v in np.percentile(st, pct))
        + f"; AUC {(tk[:, None] > st[None, :]).mean():.3f}"
    )  # fmt: skip
    print(
        f"equal-error point {xs[i]:.3f} (talking below {miss[i]:.1%}, still above {false[i]:.1%}); "
        f"at activity_on {cfg.speaker.activity_on}: talking below {(tk < cfg.speaker.activity_on).mean():.1%}, "
        f"still above {(st >= cfg.speaker.activity_on).mean():.1%}"
    )


if __name__ == "__main__":
    main()
