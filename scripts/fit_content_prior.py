"""Fit the content map's shipped prior (model/speaker/assets/content_prior.safetensors) on the committed talking heads.

The material is tests/data/talking/head1-9 (Apache-2.0 sources, tests/data/README.md): each a real person
saying their own words.  Per head: the face box from the project's detector on every frame, the mouth
features of `tasks.perception.mouth_shapes` (z-scored per head), the audio features of
`tasks.perception.content` (z-scored per head); the prior is the ridge map over all heads' frames.
``--eval`` first runs the leave-two-out check of the research note (speaker_evidence.md section 1.3): for each
ordered pair (i, j), a map fitted without heads i and j, then per 2 s window of i's speech, does head i's own
face follow i's audio better than head j's face (a real person saying other words)?

    PYTHONPATH=. .venv/bin/python scripts/fit_content_prior.py [--eval] [--lam 1000] [--cache heads.npz] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.perception.content import PRIOR_PATH, audio_features, fit, fit_score, track_shapes
from tasks.perception.faces import FaceDetector
from tasks.perception.mouth_shapes import MouthShapes
from tests.speaker_cases import FPS, SR, seed_audio, seed_frames

log = logging.getLogger("fit_content_prior")
HEADS = tuple(range(1, 10))


def head_pairs(i: int) -> tuple[np.ndarray, np.ndarray]:
    """(audio features (T, D), z-scored mouth features (T, F)) of head i."""
    frames = seed_frames(i)
    n = len(frames)
    det = FaceDetector(0.5, 24)
    meter = MouthShapes(n, FPS)
    box = None
    for t, frame in enumerate(frames):
        faces = det(frame)
        if faces:
            box = np.asarray(max(faces, key=lambda f: (f.box[2] - f.box[0]) * (f.box[3] - f.box[1])).box)
        if box is not None:
            meter.feed(t, frame, {0: (None, box)})
    meter.close()
    shapes = track_shapes(meter.rows([0]))[0]
    return audio_features(seed_audio(i), SR, n, FPS), shapes


def load_heads(cache: Path | None = None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{head: (audio features, shapes)} of HEADS, measured, or read back from ``cache`` (written if absent)."""
    if cache is not None and cache.is_file():
        with np.load(cache, allow_pickle=False) as z:
            return {i: (z[f"x{i}"], z[f"y{i}"]) for i in HEADS}
    data = {i: head_pairs(i) for i in HEADS}
    if cache is not None:
        np.savez(
            cache, **{f"x{i}": d[0] for i, d in data.items()}, **{f"y{i}": d[1] for i, d in data.items()}
        )
    return data


def speech_mask(i: int, n: int) -> np.ndarray:
    from tasks.perception.vad import RATE, StreamingVad, at_frames

    assert RATE == SR
    vad = StreamingVad()
    probs = np.concatenate([vad.feed(seed_audio(i).astype(np.float32)), vad.finish()])
    return at_frames(probs, n, FPS) >= 0.5


def evaluate(data: dict[int, tuple[np.ndarray, np.ndarray]], lam: float) -> None:
    wins, margins, long_wins = [], [], []
    for i, j in itertools.permutations(data, 2):
        rest = [k for k in data if k not in (i, j)]
        m = fit(np.concatenate([data[k][0] for k in rest]), np.concatenate([data[k][1] for k in rest]), lam)
        x, own = data[i]
        other = data[j][1]
        n = min(len(x), len(other))
        pred, speech = m.predict(x[:n]), speech_mask(i, len(x))[:n]
        for w, out in ((50, wins), (125, long_wins)):
            for s0 in range(0, n - w + 1, w // 2 if w == 50 else w):
                sel = slice(s0, s0 + w)
                if speech[sel].sum() < 0.5 * w:
                    continue
                a, b = (
                    fit_score(pred[sel], own[:n][sel], speech[sel]),
                    fit_score(pred[sel], other[:n][sel], speech[sel]),
                )
                if np.isfinite(a) and np.isfinite(b):
                    out.append(a > b)
                    if w == 50:
                        margins.append(a - b)
    log.info(
        "lam %g: own face wins %.1f %% of %d 2-s windows (median margin %+.2f), %.1f %% of %d 5-s windows",
        lam, 100 * np.mean(wins), len(wins), np.median(margins), 100 * np.mean(long_wins), len(long_wins),
    )  # fmt: skip


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", action="store_true", help="the leave-two-out check first")
    ap.add_argument(
        "--cache", type=Path, help="keep / reuse each head's (audio features, shapes) in this .npz"
    )
    ap.add_argument("--lam", default="1000", help="ridge strength (comma-separated: --eval tries each)")
    ap.add_argument("--out", type=Path, default=PRIOR_PATH)
    args = ap.parse_args()
    data = load_heads(args.cache)
    lams = [float(v) for v in args.lam.split(",")]
    if args.eval:
        for lam in lams:
            evaluate(data, lam)
    from safetensors.numpy import save_file

    m = fit(
        np.concatenate([d[0] for d in data.values()]), np.concatenate([d[1] for d in data.values()]), lams[0]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": m.weight, "lam": np.array([m.lam], np.float32)}, str(args.out))
    log.info("wrote %s: weight %s, lam %g", args.out, m.weight.shape, m.lam)


if __name__ == "__main__":
    main()
