"""`dubflow estimate` on the sample film: shots to dub (speech + face gate), chunks, expected GPU time."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from flows.cli import main
from tasks.config import PlanConfig, load_config
from tasks.estimate import estimate_film, latent_frames, shot_gpu_s
from tasks.plan import plan_shot
from tasks.shots import Shot

REPO = Path(__file__).resolve().parents[1]
FILM, DUB = REPO / "data" / "sample_film.mp4", REPO / "data" / "sample_dub.wav"
SAMPLE = json.loads((REPO / "data" / "sample_film.json").read_text())
_FIGURES = load_config().estimate.dit_forward_s
FWD_480, FWD_720 = _FIGURES["infinitetalk-480"]["bfloat16"], _FIGURES["infinitetalk-720"]["bfloat16"]


@pytest.fixture(scope="module")
def estimate():
    cfg = load_config(
        overrides=[
            "infinitetalk.mode=infinitetalk-480",
            "estimate.vae_chunk_s.infinitetalk-480=12",
            "estimate.load_s.infinitetalk-480=90",
        ]
    )
    return estimate_film(FILM, DUB, cfg)


def test_sample_film_shots_gate_and_gpu_time(estimate):
    assert [(s.start_frame, s.end_frame) for s in estimate.shots] == [
        (s["start_frame"], s["end_frame"]) for s in SAMPLE["shots"]
    ]
    dubbed = {s.index: s.reason for s in estimate.shots if s.dub}
    passed = {s.index: s.reason for s in estimate.shots if not s.dub}
    assert set(dubbed) == {0, 3, 4} and all(
        "face" in r for r in dubbed.values()
    )  # astronaut shots with speech
    assert passed[1] == "no face found" and passed[2].startswith("no speech")  # coffee cup; the 12-frame shot
    assert estimate.missing == () and (estimate.steps, estimate.branches) == (40, 3)
    # every dubbed shot fits one chunk; the cost follows its latent frames (81 frames = 21 latent frames)
    fps = Fraction(SAMPLE["fps"])
    expected = 90.0
    for s in estimate.shots:
        plan = plan_shot(Shot(s.index, s.start_frame, s.end_frame), fps, PlanConfig(25, 81, 9))
        assert s.chunks == len(plan.chunks) == 1
        if s.dub:
            frames = plan.chunks[0].num_frames  # 4n+1 frames covering the shot on the 25 fps timeline
            assert (
                frames >= round((s.end_frame - s.start_frame - 1) * 25 / float(fps)) + 1
            )  # last frame's time
            expected += (40 * 3 * FWD_480 + 12) * (1 + (frames - 1) // 4) / 21
        else:
            assert s.gpu_s == 0.0
    assert estimate.total_s == pytest.approx(expected)
    text = estimate.format()
    assert "dubbed: 3 shots" in text and "passthrough: 2 shots" in text and "at least" not in text


def test_chunk_cost_scales_with_latent_frames():
    plan = plan_shot(Shot(0, 0, 297), Fraction(25), PlanConfig(25, 81, 9))  # 81 + 3 x 72: 4 full chunks
    assert [c.num_frames for c in plan.chunks] == [81, 81, 81, 81]
    assert shot_gpu_s(plan, 10.0) == pytest.approx(40.0)
    short = plan_shot(
        Shot(0, 0, 10), Fraction(25), PlanConfig(25, 81, 9)
    )  # one 13-frame chunk: 4 latent frames
    assert latent_frames(13) == 4 and shot_gpu_s(short, 21.0) == pytest.approx(4.0)


def test_cli_json_with_missing_figures_is_a_lower_bound(capsys):
    # denoise 0.5 runs half the steps; text scale 1 needs 2 branches; tiny mode has no figures at all
    rc = main(
        ["estimate", str(FILM), "--audio", str(DUB), "--json", "--set", "infinitetalk.mode=infinitetalk-720",
         "--set", "frames.bucket=720", "--set", "infinitetalk.denoise_strength=0.5",
         "--set", "infinitetalk.text_guide_scale=1.0", "--set", "gate.overrides={0: skip, 1: dub}",
         "--set", "estimate.vae_chunk_s.infinitetalk-720=null"]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["steps"], out["branches"], out["precision"]) == (20, 2, "bfloat16")
    assert [s["index"] for s in out["shots"] if s["dub"]] == [1, 3, 4]  # overrides win over the gate
    assert out["lower_bound"] and "vae_chunk_s.infinitetalk-720" in out["missing"]
    assert out["dubbed_shots"] == 3 and out["passthrough_shots"] == 2 and out["dubbed_chunks"] == 3
    assert out["total_s"] > 3 * 20 * 2 * FWD_720 * 13 / 21  # at least the DiT work of three short chunks


def test_fp8_settings_price_chunks_with_their_own_figures(capsys):
    """fp8 GEMMs and fp8 attention each pick their measured forward time (key `fp8+fp8attn`)."""
    rc = main(
        ["estimate", str(FILM), "--audio", str(DUB), "--json", "--set", "infinitetalk.mode=infinitetalk-480",
         "--set", "infinitetalk.fp8_compute=true", "--set", "infinitetalk.fp8_attention=true"]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "fp8+fp8attn"
    assert out["dit_forward_s"] == _FIGURES["infinitetalk-480"]["fp8+fp8attn"] < FWD_480
