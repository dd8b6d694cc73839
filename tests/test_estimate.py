"""`dubflow estimate` on the sample film: shots to dub (speech + who speaks on screen), chunks, GPU time."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from flows.cli import main
from flows.estimate import estimate_film
from flows.groups import GpuCost
from tasks.config.media import PlanConfig
from tasks.config.pipeline import PipelineConfig, load_config
from tasks.config.schema import REMOVED_KEYS
from tasks.errors import ConfigError
from tasks.infinitetalk.cost import chunk_price
from tasks.render.cost import latent_frames, shot_gpu_s
from tasks.timeline.plan import ShotPlan, plan_shot
from tasks.timeline.shots import Shot

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
    # the talking heads, each the one face on screen saying the film's own words: dubbed on it, confidently
    # (shot 4's lips lead the speech by only +0.34, below the rhythm bar for a lone face; its lips' content
    # fits the speech, speaker.content_lone, so it is no longer flagged uncertain)
    assert set(dubbed) == {0, 3, 4} and all("; speaker: track 0" in dubbed[k] for k in (0, 3, 4)), dubbed
    for s in estimate.shots:  # one region per dubbed shot: the speaker's crop over the whole shot
        assert [(r["start_frame"], r["end_frame"], r["speaker"]) for r in s.regions] == (
            [(s.start_frame, s.end_frame, 0)] if s.dub else []
        )
        for r in s.regions:
            x0, y0, x1, y1 = r["box"]
            assert 0 <= x0 < x1 <= estimate.display_width and 0 <= y0 < y1 <= estimate.display_height
            assert 0 < r["score"] <= 1
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
    gpu = load_config().estimate.reference_gpu  # the times say which GPU they mean
    assert (
        "H200" in gpu
        and f"expected GPU time on {gpu}: " in text
        and estimate.to_dict()["reference_gpu"] == gpu
    )


def test_tiny_mode_is_not_priced_in_any_form():
    """The default config (tiny random weights, no figures) gives no GPU time at all, not 0:00:00."""
    est = estimate_film(FILM, DUB, load_config())
    assert est.mode == "tiny" and est.dubbed and not est.priced
    text, d = est.format(), est.to_dict()
    assert "0:00:00" not in text and "expected GPU time: not estimated: tiny mode" in text
    assert all(
        line.split()[4] == "n/a" for line in text.splitlines() if line[:4].isdigit() and " yes " in line
    )
    assert d["total_s"] is None and not d["lower_bound"] and d["note"].startswith("tiny mode")
    assert all(s["gpu_s"] is None for s in d["shots"])


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
    assert (out["display_width"], out["display_height"]) == (320, 180)
    forced = next(s for s in out["shots"] if s["index"] == 1)  # the faceless shot forced: full-shot region
    assert forced["reason"] == "forced by override" and len(forced["regions"]) == 1
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


FAST_480 = [
    "infinitetalk.mode=infinitetalk-480", "infinitetalk.steps=4", "infinitetalk.text_guide_scale=1",
    "infinitetalk.audio_guide_scale=1", "infinitetalk.fp8_compute=true", "infinitetalk.fp8_attention=true",
]  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "precision"),
    [
        (["infinitetalk.mode=infinitetalk-480", "estimate.load_s.infinitetalk-480=75"], "bfloat16"),
        (FAST_480, "fp8+fp8attn"),
        ([], "float32"),  # tiny: nothing measured, group sizing uses the cost: stand-ins
    ],
    ids=["quality-480-bf16", "fast-480-fp8-fp8attn", "tiny-fallback"],
)
def test_group_sizing_prices_shots_like_dubflow_estimate(settings, precision):
    """The film run's group sizing (`GpuCost`, on the flow's serialised plans) and `dubflow estimate` give
    every shot the same GPU seconds; where a figure is not measured, sizing uses the `cost.fallback_*`
    stand-in exactly as if it were that figure, while the estimate reports it missing."""
    cfg = load_config(overrides=[*settings, "gate.policy=all"])
    cost = GpuCost.from_config(cfg)
    price = chunk_price(cfg)
    assert price.precision == cost.price.precision == precision
    assert [f.split(" -> ")[0] for f in cost.price.fallbacks] == list(price.missing)  # stand-ins, named
    figured = cfg
    if price.missing:  # price the estimate with the stand-ins written in as its figures
        c = cfg.cost
        stand_in = {"dit_forward_s": c.fallback_dit_forward_s, "vae_chunk_s": c.fallback_vae_chunk_s}
        stand_in["load_s"] = c.fallback_load_s
        written = [f"estimate.{name}={stand_in[name.split('.')[0]]}" for name in price.missing]
        figured = load_config(overrides=[*settings, "gate.policy=all", *written])
    est = estimate_film(FILM, DUB, figured)
    assert est.missing == () and all(s.dub for s in est.shots)
    assert (est.steps, est.branches, est.precision) == (cost.price.steps, cost.price.branches, precision)
    assert cost.model_load_s == est.load_s
    fps = Fraction(est.fps)
    for s in est.shots:
        plan = plan_shot(Shot(s.index, s.start_frame, s.end_frame), fps, cfg.plan)
        flow_plan = ShotPlan.from_dict(json.loads(json.dumps(plan.to_dict())))  # as in the flow's records
        assert s.gpu_s > 0 and cost.shot_s(flow_plan) == pytest.approx(s.gpu_s, rel=1e-12)


def test_chunk_price_follows_the_run_settings():
    """Steps run (denoise strength), guidance branches and the precision key come from infinitetalk:,
    also through backend.options; a null figure is missing unless stand-ins are asked for."""
    cfg = load_config(
        overrides=[
            "infinitetalk.mode=infinitetalk-720", "frames.bucket=720", "infinitetalk.quant=int8",
            "backend.options={denoise_strength: 0.25, text_guide_scale: 1.0}",
        ]
    )  # fmt: skip
    price = chunk_price(cfg)
    assert (price.steps, price.branches, price.precision) == (10, 2, "int8")
    assert price.missing == ("dit_forward_s.infinitetalk-720.int8", "load_s.infinitetalk-720")
    assert price.chunk_s == price.vae_chunk_s == cfg.estimate.vae_chunk_s["infinitetalk-720"]
    filled = chunk_price(cfg, fallbacks=True)
    assert (
        filled.dit_forward_s == cfg.cost.fallback_dit_forward_s and filled.load_s == cfg.cost.fallback_load_s
    )
    assert filled.chunk_s == pytest.approx(10 * 2 * cfg.cost.fallback_dit_forward_s + price.vae_chunk_s)
    bad = load_config(overrides=["infinitetalk.mode=tiny", "estimate.vae_chunk_s.tiny=-1"])
    with pytest.raises(ConfigError, match=r"^estimate: vae_chunk_s.tiny: expected a finite number"):
        chunk_price(bad)


@pytest.mark.parametrize(
    "key", ["steps", "calls_per_step", "s_per_forward", "chunk_overhead_s", "model_load_s"]
)
def test_removed_cost_keys_name_their_new_place(key, tmp_path):
    """A config that still sets a removed cost: key fails in one line that names it and its new place."""
    user = tmp_path / "user.yaml"
    user.write_text(f"cost:\n  {key}: 1\n")
    old = load_config().to_dict()
    old["cost"][key] = 1
    messages = [
        _message(lambda: load_config(user)),  # a user's YAML file
        _message(lambda: load_config(overrides=[f"cost.{key}=1"])),  # --set
        _message(lambda: load_config(updates={"cost": {key: 1}})),  # the flow's config parameter
        _message(lambda: PipelineConfig.from_dict(old, source="old.json")),  # a whole saved config
    ]
    assert messages[0].startswith(f"{user}: unknown key cost.{key} (removed:")
    assert messages[3].startswith(f"old.json: unknown key cost.{key} (removed:")
    for text in messages:
        assert f"unknown key cost.{key}" in text and REMOVED_KEYS[f"cost.{key}"] in text and "\n" not in text
    assert REMOVED_KEYS["cost.s_per_forward"].startswith("estimate.dit_forward_s.<mode>.<precision>")


def _message(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    return str(err.value)
