"""Does per-film calibration of the content map help?  Leave-one-head-out on the committed talking heads.

For each head X of tests/data/talking/head1-9: the prior fitted *without* X (as the shipped prior is fitted
without a film's people), then that map calibrated (`ContentMap.calibrated`, ridge towards the prior) on one
half of X's clip (X's "other lines" in the film) and judged on the other half (and the halves swapped):
X's own face against every other head's face (a real person saying other words) under X's audio, per
half (2.5-3 s of speech); the own-vs-other fit margin, the share of wins, and X's own fit (the output lip
check's number).  The heads' (audio features, mouth shapes) come from `scripts/fit_content_prior.py --cache`.

    PYTHONPATH=. .venv/bin/python scripts/fit_content_prior.py --cache /tmp/content_heads.npz   # once
    PYTHONPATH=. .venv/bin/python benchmarks/content_calibration.py --heads /tmp/content_heads.npz [--pairs | --lips]

``--pairs`` is the two-person film: for each pair of heads (X, Y) the prior fitted without both, calibrated on
the first half of *both* clips (the film's single-face lines of its two people), then on the second halves X's
face against Y's under X's audio and the other way round (a two-shot of two talking faces), halves swapped too.

``--lips`` is the output lip check's question (`tasks.perception.lip_check`, `qc.lip_min_fit` 0.1): does a
per-face normalisation (the fit against the dub minus the mean fit against the same sound shifted by 1-4.5 s)
or the calibration on the face's other half separate a face saying the dub's words from one saying other words?
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.fit_content_prior import load_heads, speech_mask
from tasks.perception.content import fit, fit_score, load_prior


def pairs(data: dict[int, tuple[np.ndarray, np.ndarray]], lam: float, strengths: list[float]) -> None:
    """The two-person film check (module docstring, ``--pairs``)."""
    import itertools

    sm = {h: speech_mask(h, len(data[h][0])) for h in data}
    res: dict[str, list[tuple[float, float]]] = {}
    for a, b in itertools.combinations(data, 2):
        rest = [k for k in data if k not in (a, b)]
        prior = fit(
            np.concatenate([data[k][0] for k in rest]), np.concatenate([data[k][1] for k in rest]), lam
        )
        for first in (True, False):

            def half(h: int, cal: bool, first: bool = first) -> slice:
                n = len(data[h][0])
                return slice(0, n // 2) if cal == first else slice(n // 2, n)

            xs = np.concatenate([data[h][0][half(h, True)][sm[h][half(h, True)]] for h in (a, b)])
            ys = np.concatenate([data[h][1][half(h, True)][sm[h][half(h, True)]] for h in (a, b)])
            maps = {"prior": prior} | {f"cal {s:g}": prior.calibrated(xs, ys, s) for s in strengths}
            for label, m in maps.items():
                for x, y in ((a, b), (b, a)):
                    t = half(x, False)
                    tt = slice(t.start, min(t.stop, len(data[x][0]), len(data[y][0])))
                    pred = m.predict(data[x][0][tt])
                    own = fit_score(pred, data[x][1][tt], sm[x][tt])
                    other = fit_score(pred, data[y][1][tt], sm[x][tt])
                    if np.isfinite(own) and np.isfinite(other):
                        res.setdefault(label, []).append((own, other))
    print(
        "| map | own face wins | median margin | right by >= 0.1 | wrong by >= 0.1 |\n|---|---|---|---|---|"
    )
    for label, r in res.items():
        d = np.array([o - t for o, t in r])
        print(f"| {label} | {100 * np.mean(d > 0):.1f} % of {len(d)} | {np.median(d):+.3f} | "
              f"{100 * np.mean(d >= 0.1):.1f} % | {100 * np.mean(d <= -0.1):.1f} % |")  # fmt: skip


def lips(data: dict[int, tuple[np.ndarray, np.ndarray]], lam: float, strengths: list[float]) -> None:
    """The lip check's two candidate fixes (module docstring, ``--lips``)."""
    sm = {h: speech_mask(h, len(data[h][0])) for h in data}

    def shifted(m, x, y, sp) -> float:  # the fit against the same sound shifted by 1-4.5 s: chance level
        got = [fit_score(m.predict(np.roll(x, k, 0)), y, np.roll(sp, k)) for k in range(25, len(x) - 25, 12)]
        return float(np.nanmean(got))

    own, other = [], []
    for i in data:
        rest = [k for k in data if k != i]
        m = fit(np.concatenate([data[k][0] for k in rest]), np.concatenate([data[k][1] for k in rest]), lam)
        x, y = data[i]
        a = fit_score(m.predict(x), y, sm[i])
        own.append((i, a, a - shifted(m, x, y, sm[i])))
        for j in rest:
            n = min(len(data[j][0]), len(y))
            xj, spj = data[j][0][:n], sm[j][:n]
            b = fit_score(m.predict(xj), y[:n], spj)
            other.append((b, b - shifted(m, xj, y[:n], spj)))
    o = np.array(other)
    print("whole clip, map without the head: own voice fit / normalised; other words (72 pairs) p90 / max")
    print("  own: " + ", ".join(f"head{i} {a:.3f} / {z:+.3f}" for i, a, z in own))
    print(f"  other words: fit p90 {np.percentile(o[:, 0], 90):.3f} max {o[:, 0].max():.3f}; normalised p90 "
          f"{np.percentile(o[:, 1], 90):+.3f} max {o[:, 1].max():+.3f}")  # fmt: skip
    for strength in [None, *strengths]:
        own_f, oth_f = [], []
        for i in data:
            rest = [k for k in data if k != i]
            prior = fit(
                np.concatenate([data[k][0] for k in rest]), np.concatenate([data[k][1] for k in rest]), lam
            )
            x, y = data[i]
            n, h = len(x), len(x) // 2
            for cal, test in ((slice(0, h), slice(h, n)), (slice(h, n), slice(0, h))):
                sp = sm[i][cal]
                m = prior if strength is None else prior.calibrated(x[cal][sp], y[cal][sp], strength)
                own_f.append(fit_score(m.predict(x[test]), y[test], sm[i][test]))
                for j in rest:
                    t = slice(test.start, min(test.stop, len(data[j][0])))
                    if t.stop - t.start >= 40:
                        oth_f.append(fit_score(m.predict(data[j][0][t]), y[t], sm[j][t]))
        a, b = np.array(own_f), np.array(oth_f)
        print(f"  halves, {'prior' if strength is None else f'calibrated {strength:g}'}: own voice flagged "
              f"{100 * np.mean(a < 0.1):.0f} % of {len(a)} (min {a.min():.3f}), other words passing "
              f"{100 * np.mean(b >= 0.1):.1f} % of {len(b)}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=Path, required=True)
    ap.add_argument("--strength", default="1000,300,100", help="calibration ridge strengths to try")
    ap.add_argument("--pairs", action="store_true", help="the two-person film check instead")
    ap.add_argument("--lips", action="store_true", help="the output lip check's candidate fixes instead")
    args = ap.parse_args()
    data = load_heads(args.heads)
    lam = load_prior().lam
    strengths = [float(v) for v in args.strength.split(",")]
    if args.pairs:
        pairs(data, lam, strengths)
        return
    if args.lips:
        lips(data, lam, strengths)
        return
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
