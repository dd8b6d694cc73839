"""Two speakers at once (`tasks.infinitetalk.multi`): the multi checkpoint in the weights layout and loader,
the fallback to the louder speaker, the DiT's own routing of each stem to its person, and a shot rendered
through the per-shot path on the tiny multi checkpoint."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

import model.network.dit_blocks as dit_blocks
from model.weights.layout import WeightsLayout, download_weights, has_multi, verify_weights
from model.weights.loading import LoadSpec, load_models
from tasks.config.pipeline import load_config
from tasks.decision.record import DubRegion, ShotDecision
from tasks.errors import MediaError
from tasks.infinitetalk import InfiniteTalkBackend
from tasks.infinitetalk.cost import switch_load_s
from tasks.infinitetalk.multi import MISSING, TwoSpeakers, resolve_two_speakers, two_speakers
from tasks.media.intermediates import write_marker
from tasks.picture.region import RegionPlan, full_frame_box
from tasks.render.shot import ShotJob, render_shot_result
from tests.media import decode_all
from tests.test_infinitetalk import SHOTS, _job, resident, ws_root  # noqa: F401 (fixtures)

L = WeightsLayout()
DISPLAY_HW = (180, 320)  # the sample film's display size (h, w)
LEFT, RIGHT = [20, 20, 140, 160], [180, 20, 300, 160]  # two people's boxes (display pixels)


@pytest.fixture(scope="module")
def roots(tmp_path_factory, tiny_weights: Path) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("multi")
    multi = Path(shutil.copytree(tiny_weights, base / "multi"))  # = write_tiny_root(base / "multi", seed=0)
    (multi / ".complete").unlink()  # ensure_tiny_root's mark, not part of a weights root
    single = shutil.copytree(multi, base / "single", copy_function=os.link)  # the same root without multi/
    shutil.rmtree(single / Path(L.multi).parent)
    return {"multi": multi, "single": single}


def _full_plan(n: int) -> RegionPlan:
    box, bucket = full_frame_box(DISPLAY_HW, "infinitetalk-480")
    return RegionPlan("full", box, bucket, True, 2, "two speakers: full frame", DISPLAY_HW, n)


def _two_region(n: int, people_order: tuple[int, int] = (0, 1), louder: int = 7) -> DubRegion:
    people = [
        {"track": 7, "character": "alice", "stem": "alice", "box": LEFT},
        {"track": 9, "character": "bob", "stem": "bob", "box": RIGHT},
    ]
    ordered = tuple(people[i] for i in people_order)
    return DubRegion(0, n, louder, 0.8, "two", _full_plan(n), ordered)


def _decision(*regions: DubRegion) -> ShotDecision:
    return ShotDecision(True, "speech 90%; two speakers", regions)


# ------------------------------------------------------------------------------------------- weights


def test_the_multi_checkpoint_is_an_optional_component_of_the_layout(roots, tmp_path):
    assert verify_weights(roots["multi"], multi=True) == [] and has_multi(roots["multi"])
    assert verify_weights(roots["single"]) == [] and not has_multi(roots["single"])  # valid without it
    (problem,) = verify_weights(roots["single"], multi=True)
    assert problem.endswith(f"{L.multi}: missing")
    # present but damaged: reported even when not asked for
    broken = shutil.copytree(roots["multi"], tmp_path / "broken", copy_function=os.link)
    data = (broken / L.multi).read_bytes()
    (broken / L.multi).unlink()  # a hard link: replace, never edit in place
    (broken / L.multi).write_bytes(data[:-16])
    (problem,) = verify_weights(broken)
    assert "multi/infinitetalk.safetensors" in problem and "truncated" in problem
    quant = verify_weights(roots["multi"], quant="int8", multi=True)
    assert any("infinitetalk_multi_int8.safetensors: missing" in p for p in quant)
    assert any("infinitetalk_multi_int8.json: missing" in p for p in quant)


def test_weights_verify_cli_says_whether_two_speakers_can_be_generated(roots, capsys):
    from flows.cli import main

    assert main(["weights", "verify", str(roots["multi"]), "--multi"]) == 0
    assert "multi-person checkpoint present" in capsys.readouterr().out
    assert main(["weights", "verify", str(roots["single"])]) == 0
    assert (
        "no multi-person checkpoint: two-speaker segments dub the louder speaker" in capsys.readouterr().out
    )
    assert main(["weights", "verify", str(roots["single"]), "--multi"]) == 1
    assert "multi/infinitetalk.safetensors: missing" in capsys.readouterr().out


def test_download_fetches_the_multi_files_only_when_asked(tmp_path, monkeypatch):
    import huggingface_hub

    files: list[str] = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, **kw: files.append(name))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: None)
    download_weights(tmp_path)
    assert "single/infinitetalk.safetensors" in files and "multi/infinitetalk.safetensors" not in files
    files.clear()
    download_weights(tmp_path, quant="fp8", multi=True)
    assert {
        "quant_models/infinitetalk_single_fp8.safetensors",
        "quant_models/infinitetalk_multi_fp8.safetensors",
        "quant_models/infinitetalk_multi_fp8.json",
    } <= set(files)


def test_the_loader_reads_the_multi_file_when_asked(roots):
    """Same keys as single, other (audio) values; the Wan2.1 weights are shared."""
    single, multi = (
        load_models(roots["multi"], LoadSpec.cpu_float32(components=("dit",), multi=m)).dit.state_dict()
        for m in (False, True)
    )
    assert single.keys() == multi.keys()
    audio = set(load_file(roots["multi"] / L.multi))
    assert audio == set(load_file(roots["multi"] / L.infinitetalk))
    assert all(not torch.equal(single[k], multi[k]) for k in audio)
    assert all(torch.equal(single[k], multi[k]) for k in single.keys() - audio)


# ------------------------------------------------------------------------------------------ fallback


def test_without_the_multi_checkpoint_the_louder_person_is_dubbed():
    cfg = load_config()
    region = dataclasses.replace(_two_region(40, louder=9), plan=_region_plan(40))
    d = resolve_two_speakers(_decision(region), lambda: False, cfg)
    assert d.reason == f"speech 90%; two speakers; {MISSING} (track 9, bob)"
    (got,) = d.regions
    assert (got.speaker, got.status, got.people) == (9, "speaker", ())
    x0, _, x1, _ = got.plan.box  # re-planned around bob's face, on the right
    assert x0 >= LEFT[2] - 40 and x1 > RIGHT[0]
    assert resolve_two_speakers(d, lambda: False, cfg) == d  # idempotent
    assert two_speakers(d) is None
    kept = resolve_two_speakers(_decision(region), lambda: True, cfg)
    assert kept.reason == "speech 90%; two speakers" and two_speakers(kept).people == region.people


def test_a_missing_stem_is_one_clear_error():
    context = SimpleNamespace(stems={"alice": Path("alice.wav")}, dialogue=SimpleNamespace(path="dub.wav"))
    with pytest.raises(
        MediaError, match=r"dub.wav: two-speaker segment needs the stem 'bob' \(track 9, bob\)"
    ):
        TwoSpeakers(_two_region(9)).stem_paths(context)


def test_one_pair_of_people_per_shot():
    """A second two-speaker segment of another pair is dubbed as its louder person; the longer one stays."""
    long, short = _two_region(40), dataclasses.replace(_two_region(10), start_frame=40, end_frame=50)
    other = dataclasses.replace(
        short, people=(short.people[0], {**short.people[1], "stem": "carol", "track": 3})
    )
    d = resolve_two_speakers(_decision(long, other), lambda: True, load_config())
    assert [r.status for r in d.regions] == ["two", "speaker"]
    assert d.reason.endswith("two speakers: another pair in this shot, dubbing the louder (track 7, alice)")
    assert two_speakers(d).region == long


def _region_plan(n: int) -> RegionPlan:
    return RegionPlan("region", (0, 0, 320, 180), (448, 896), True, 2, "both faces", DISPLAY_HW, n)


def test_pricing_a_two_speaker_shot_adds_the_multi_model_load():
    """The estimate and the film run's group sizing price a two-speaker shot at one extra model load."""
    from fractions import Fraction

    from flows.dub_film import _shot_cost
    from flows.groups import GpuCost
    from tasks.timeline.plan import plan_shot
    from tasks.timeline.shots import Shot

    assert switch_load_s([_two_region(10).to_dict()], 52.0) == 52.0
    one = dataclasses.replace(_two_region(10), status="speaker", people=())
    assert switch_load_s([one.to_dict()], 52.0) == 0.0
    cfg = load_config()
    cost = GpuCost.from_config(cfg)
    plan = plan_shot(Shot(0, 0, 40), Fraction(25), cfg.plan).to_dict()
    single, two = (
        _shot_cost(cost, {"plan": plan, "decision": _decision(r).to_dict()}) for r in (one, _two_region(10))
    )
    assert single > 0 and two == pytest.approx(single + cost.model_load_s)


# ------------------------------------------------------------------------------------- model routing


def _routed_stems(dit, people_order: tuple[int, int]) -> torch.Tensor:
    """Per frame-0 token of the first block: the stem ("alice" 0 / "bob" 1 / background -1) the DiT's own
    routing (`speaker_positions` on its reference map) sends it to, with the conditioning built by
    `TwoSpeakers` from a region whose people come in `people_order`."""
    c = dit.config
    two = TwoSpeakers(_two_region(9, people_order))
    model_hw = (32, 64)
    masks = two.masks(two.region.plan, DISPLAY_HW, model_hw)  # (3, 4, 8): people order
    g = torch.Generator().manual_seed(0)
    stems = {"alice": torch.randn(9, 5, 12, 768, generator=g), "bob": torch.randn(9, 5, 12, 768, generator=g)}
    names = [p["stem"] for p in two.people]
    audio = torch.stack([stems[n] for n in names])  # (2, F_pix, 5, 12, 768), slot s = person s's stem
    g = torch.Generator().manual_seed(1)
    positions: list[torch.Tensor] = []
    real = dit_blocks.speaker_positions

    def record(*args, **kwargs):
        out = real(*args, **kwargs)
        positions.append(out)
        return out

    dit_blocks.speaker_positions = record
    try:
        with torch.no_grad():
            dit(
                torch.randn(1, 16, 3, 4, 8, generator=g), torch.tensor([700.0]),
                torch.randn(1, 6, c.text_dim, generator=g), torch.randn(1, c.clip_tokens, c.clip_dim, generator=g),
                torch.randn(1, 20, 3, 4, 8, generator=g), audio, masks,
            )  # fmt: skip
    finally:
        dit_blocks.speaker_positions = real
    frame0 = positions[0][0, : 2 * 4]  # (T0,) first block, frame-0 tokens (grid 2 x 4)
    slot = torch.full_like(frame0, -1, dtype=torch.long)
    slot[frame0 <= c.speaker_class_interval] = 0  # speaker 1's RoPE range (its audio keys at its centre)
    slot[frame0 >= c.speaker_class_range - c.speaker_class_interval] = 1
    ids = torch.tensor([["alice", "bob"].index(n) for n in names])
    return torch.where(slot >= 0, ids[slot.clamp_min(0)], -1)


def test_each_stem_is_routed_with_its_person_by_the_models_own_routing(roots):
    """People (and with them masks and stems) given in either order: every token hears the same stem, read
    from the DiT's routing; both people are reached. A stem paired with the other person's mask would flip
    the tokens that hear it."""
    dit = load_models(roots["multi"], LoadSpec.cpu_float32(components=("dit",), multi=True)).dit
    ab, ba = _routed_stems(dit, (0, 1)), _routed_stems(dit, (1, 0))
    assert torch.equal(ab, ba), (ab, ba)
    assert {0, 1} <= set(ab.tolist())  # the routing uses both stems


def _latent_box(rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
    m = torch.zeros(4, 8)
    m[rows[0] : rows[1], cols[0] : cols[1]] = 1
    return m


def test_person_masks_are_the_boxes_in_the_model_crop():
    """Display boxes -> model crop -> latent (4 x 8 at the tiny 32 x 64 model size), person order kept."""
    two = TwoSpeakers(_two_region(9))
    # full frame: the official cover-resize 180x320 -> 36x64 and centre crop to 32x64, then / 8
    masks = two.masks(_full_plan(9), DISPLAY_HW, (32, 64))
    assert torch.equal(masks[0], _latent_box((1, 4), (1, 4)))  # alice, x 20..140 -> cols 1..3
    assert torch.equal(masks[1], _latent_box((1, 4), (5, 8)))  # bob, x 180..300 -> cols 5..7
    assert torch.equal(masks[2], 1 - masks[0] - masks[1])  # background
    # a region crop: the boxes relative to the crop box (x 100..260), clipped to it
    crop = RegionPlan("region", (100, 0, 260, 90), (448, 896), True, 2, "", DISPLAY_HW, 9)
    masks = two.masks(crop, DISPLAY_HW, (32, 64))
    assert torch.equal(masks[0], _latent_box((1, 4), (0, 2)))
    assert torch.equal(masks[1], _latent_box((1, 4), (4, 8)))
    swapped = TwoSpeakers(_two_region(9, (1, 0))).masks(crop, DISPLAY_HW, (32, 64))
    assert torch.equal(swapped[0], masks[1]) and torch.equal(swapped[1], masks[0])
    with pytest.raises(ValueError, match=r"track 9, bob's box .* is outside the model crop"):
        two.masks(
            RegionPlan("region", (0, 0, 160, 90), (448, 896), True, 2, "", DISPLAY_HW, 9),
            DISPLAY_HW,
            (32, 64),
        )


# ------------------------------------------------------------------------------------- per-shot path


class StemBackend(InfiniteTalkBackend):
    """The InfiniteTalk backend with the run's stems in its ShotContext (what c18's flows fill in)."""

    stems: dict[str, Path] = {}

    def open_shot(self, *args, context=None, **kwargs):
        return super().open_shot(*args, context=dataclasses.replace(context, stems=self.stems), **kwargs)


def _two_speaker_job(
    tmp: Path, ws: Path, weights: Path, name: str, kept: bool
) -> tuple[ShotJob, dict[str, Path]]:
    """Shot 2 (12 frames: one short chunk) with stems for alice and bob; `kept`: the gate's two-speaker
    decision already kept with the shot's checkpoints (else the gate takes it)."""
    index = 2
    job = _job(tmp, ws, index, SHOTS[index], [f"infinitetalk.weights={weights}"], name)
    if kept:
        seg = Path(job.out_path).with_name(Path(job.out_path).stem + ".chunks")
        seg.mkdir(parents=True, exist_ok=True)
        write_marker(seg / "decision.json", _decision(_two_region(12)).to_dict())
    wave, sr = sf.read(job.dialogue["path"], dtype="float32")
    stems = {"alice": tmp / "alice.wav", "bob": tmp / "bob.wav"}
    sf.write(stems["alice"], wave, sr)
    sf.write(stems["bob"], wave[::-1].copy(), sr)  # another voice
    return job, stems


def _dit_calls(dit) -> list[dict]:
    """Records each DiT call's speaker audio (S, F_pix, 5, 12, 768) of its most-speaker sample and masks."""
    calls: list[dict] = []

    def hook(module, args, kwargs):
        audio = kwargs["audio"]
        if audio.dim() == 6:  # batched guidance branches: the sample with the most speakers
            counts = kwargs.get("audio_speakers") or [audio.shape[1]] * audio.shape[0]
            i = max(range(len(counts)), key=lambda b: counts[b])
            audio = audio[i, : counts[i]]
        calls.append({"audio": audio, "masks": kwargs["ref_target_masks"]})

    dit.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def _render(tmp: Path, ws: Path, weights: Path, name: str, *, multi: bool) -> tuple[dict, list[dict], Any]:
    job, stems = _two_speaker_job(tmp, ws, weights, name, kept=multi)
    cfg = load_config(overrides=["backend.name=infinitetalk", f"infinitetalk.weights={weights}"])
    backend = StemBackend({}, config=cfg)
    backend.stems = stems
    calls = _dit_calls(backend.models("dit", multi=multi)["dit"])  # the DiT the shot should use, resident
    return render_shot_result(job, backend=backend), calls, backend


def test_a_two_speaker_shot_renders_on_the_tiny_multi_checkpoint(
    tmp_path,
    ws_root,  # noqa: F811 (the fixture of tests.test_infinitetalk)
    resident,  # noqa: F811
    roots,
    monkeypatch,
):
    """The product's per-shot path with the gate's two-speaker decision: the multi DiT, two audio slots in
    the people's order (alice's stem = the dialogue's samples, bob's another voice), the person masks."""
    result, calls, backend = _render(tmp_path, ws_root, roots["multi"], "two", multi=True)
    assert result["dubbed"] and result["chunks"] == 1, result
    assert decode_all(Path(result["path"])).shape[0] == SHOTS[2][1] - SHOTS[2][0]
    assert resident.loads["dit"] == 1  # the multi DiT loaded once (before the shot), used by the shot
    two = [c for c in calls if c["audio"].shape[0] == 2]
    assert two, "no two-speaker DiT call"
    assert torch.equal(
        two[0]["masks"], TwoSpeakers(_two_region(12)).masks(_full_plan(12), DISPLAY_HW, (32, 64))
    )
    # the resident holder: one DiT at a time, the other components stay
    assert backend.models("vae")["vae"] is backend.models("vae", multi=True)["vae"]
    single = backend.models("dit")["dit"]  # a one-speaker shot next: the single DiT replaces the multi one
    assert resident.loads["dit"] == 2 and single is backend.models("dit")["dit"]

    # without the multi checkpoint: one speaker, the louder (alice, track 7), on the dialogue's features; the
    # gate's call (c18's, stood in for by the contract's hand-built decision) gets the fallback's reason
    import tasks.infinitetalk.backend as it_backend

    monkeypatch.setattr(it_backend, "decide_shot", lambda *a, **k: _decision(_two_region(12)))
    fallback, one_calls, _ = _render(tmp_path, ws_root, roots["single"], "one", multi=False)
    assert fallback["dubbed"] and one_calls and all(c["audio"].shape[0] == 1 for c in one_calls)
    assert fallback["reason"].endswith(f"{MISSING} (track 7, alice)"), fallback["reason"]
    alice, bob = two[0]["audio"]
    assert torch.equal(alice, one_calls[0]["audio"][0]) and not torch.equal(bob, alice)
