"""Does per-film calibration of the content map help?  Leave-one-head-out on the committed talking heads.

For each head X of tests/data/talking/head1-9: the prior fitted *without* X (as the shipped prior is fitted
without a film's people), then that map calibrated (`ContentMap.calibrated`, ridge towards the prior) on one
half of X's clip (X's "other lines" in the film) and judged on the other half (and the halves swapped):
X's own face against every other head's face (a real person saying other words) under X's audio, per
half (2.5-3 s of speech); the own-vs-other fit margin, the share of wins, and X's own fit (the output lip
check's number).  The heads' (audio features, mouth shapes) come from `scripts/fit_content_prior.py --cache`.

    PYTHONPATH=. .venv/bin/python scripts/fit_content_prior.py --cache /tmp/content_heads.npz   # once
    PYTHONPATH=. .venv/bin/python benchmarks/content_calibration.py --heads /tmp/content_heads.npz
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.fit_content_prior import load_heads, speech_mask
from tasks.perception.content import fit, fit_score, load_prior


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=Path, required=True)
    ap.add_argument("--strength", default="1000,300,100", help="calibration ridge strengths to try")
    args = ap.parse_args()
    data = load_heads(args.heads)
    lam = load_prior().lam
    strengths = [float(v) for v in args.strength.split(",")]
    rows: dict[str, list[tuple[float, float, float]]] = {"prior": []} | {f"cal {s:g}": [] for s in strengths}
    per_head: dict[int, dict[str, list[float]]] = {}
    for x_head in data:
        rest = [k for k in data if k != x_head]
        prior = fit(
            np.concatenate([data[k][0] for k in rest]), np.concatenate([data[k][1] for k in rest]), lam
        )
        x, own = data[x_head]
        speech = speech_mask(x_head, len(x))
        half = len(x) // 2
        for cal, test in ((slice(0, half), slice(half, len(x))), (slice(half, len(x)), slice(0, half))):
            maps = {"prior": prior}
            sp = speech[cal]
            for s in strengths:
                maps[f"cal {s:g}"] = prior.calibrated(x[cal][sp], own[cal][sp], s)
            for label, m in maps.items():
                pred = m.predict(x[test])
                a = fit_score(pred, own[test], speech[test])
                for j in rest:
                    other = data[j][1]
                    n = min(test.stop, len(other)) - test.start
                    if n < 20:
                        continue
                    b = fit_score(pred[:n], other[test.start : test.start + n], speech[test][:n])
                    if np.isfinite(a) and np.isfinite(b):
                        rows[label].append((a, b, a - b))
                per_head.setdefault(x_head, {}).setdefault(label, []).append(a)
    print("| map | own face wins | median margin | mean margin | own fit median | own fit min |")
    print("|---|---|---|---|---|---|")
    for label, r in rows.items():
        arr = np.array(r)
        own = np.array([v for h in per_head.values() for v in h[label]])
        print(
            f"| {label} | {100 * np.mean(arr[:, 2] > 0):.1f} % of {len(arr)} | {np.median(arr[:, 2]):+.3f} | "
            f"{np.mean(arr[:, 2]):+.3f} | {np.nanmedian(own):.3f} | {np.nanmin(own):.3f} |"
        )
    print("\nown fit per head (mean of the two halves):")
    for h, d in per_head.items():
        print(f"  head{h}: " + ", ".join(f"{k} {np.nanmean(v):.3f}" for k, v in d.items()))


if __name__ == "__main__":
    main()
