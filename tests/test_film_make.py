"""The test film of benchmarks/film_gpu.py (benchmarks/film_make.py): shots, cuts between keyframes, dub."""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import soundfile as sf

from tasks.media.probe import probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from film_gpu import pick_kill_shot
from film_make import GOP, SHOTS, make_film, plan_shots


def test_full_film_is_long_enough_and_no_cut_lands_on_a_keyframe():
    plan = plan_shots(len(SHOTS), None)
    frames = [f for _, f, _, _ in plan]
    assert len(plan) >= 8 and sum(frames) / Fraction(24000, 1001) >= 60
    cuts = [sum(frames[:k]) for k in range(1, len(frames))]
    assert all(c % GOP for c in cuts), cuts
    kinds = {k for k, _, _, _ in plan}
    assert {"close", "left", "right", "faceless", "voice_over"} <= kinds


def test_short_film_encodes_with_cuts_between_keyframes_and_a_dub_of_its_length(tmp_path: Path):
    manifest = make_film(tmp_path, (160, 90), n_shots=8, film_s=6.0)
    info = probe(manifest["film"])
    assert (info.width, info.height, info.fps, info.frame_count) == (
        160,
        90,
        Fraction(24000, 1001),
        manifest["frames"],
    )
    assert manifest["keyframes"][0] == 0 and all(k % GOP == 0 for k in manifest["keyframes"])
    assert manifest["cuts"] and manifest["cuts_on_keyframes"] == []
    dub, sr = sf.read(manifest["dub"])
    assert sr == 16000 and abs(len(dub) / sr - manifest["film_s"]) < 1 / 24
    shots = manifest["shots"]
    for s in shots:  # speech in the dub where someone speaks, silence in the faceless shots
        a, b = (round((s["start_frame"] + d) / Fraction(24000, 1001) * sr) for d in (0, s["frames"]))
        part = dub[a:b]
        assert (abs(part).max() > 0.01) == (s["kind"] != "faceless"), s
    assert [s["expect"] for s in shots] == ["dub", "copy", "dub", "copy", "dub", "dub", "dub", "copy"]
    assert pick_kill_shot(manifest, None) == 4  # a dialogue shot from the middle on, not the first one
