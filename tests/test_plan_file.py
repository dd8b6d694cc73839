"""The editable shot plan: `dubflow plan --out` on a real clip, bad plan files as one-line errors, and an
edited plan driving a real `dub-film` flow run in which only the edited shots re-render (the shot table
says which shots were reused)."""

from __future__ import annotations

import json
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from flows.cli import main
from tasks.backends import backend_option
from tasks.config.pipeline import load_config
from tasks.decision.plan_file import plan_document, plan_overrides, read_plan, to_config_overrides, write_plan
from tasks.errors import ConfigError
from tasks.media.probe import probe
from tasks.render.backend import check_backend_options
from tasks.timeline.shot_key import shot_config
from tests.media import make_audio, make_clip

SPANS = [{"index": i, "start_frame": 24 * i, "end_frame": 24 * (i + 1)} for i in range(3)]


def _plan(tmp_path: Path, **override) -> Path:
    shot = {"index": 1, "start_frame": 24, "end_frame": 48, "override": {"dub": "auto", **override}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"format": "dubflow-shot-plan/1", "shots": [shot]}))
    return path


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"sed": 3}, "shot 1: unknown override field 'sed' (known: dub, speaker,"),
        ({"dub": "maybe"}, "shot 1: dub must be auto, yes or no, got 'maybe'"),
        ({"steps": "many"}, "shot 1: steps must be int, got 'many'"),
        ({"speaker": "B"}, "shot 1: speaker must be int, got 'B'"),
        ({"denoise_strength": 1.5}, "shot 1: infinitetalk.denoise_strength: must be in (0, 1], got 1.5"),
    ],
)
def test_bad_overrides_are_one_line_errors_naming_the_file_and_shot(tmp_path: Path, override, message):
    path = _plan(tmp_path, **override)
    with pytest.raises(ConfigError) as err:
        plan_overrides(path, load_config().to_dict(), SPANS, check_options=check_backend_options)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_plans_that_do_not_fit_the_film(tmp_path: Path):
    cfg = load_config().to_dict()
    with pytest.raises(ConfigError, match=r"shot 7: no such shot \(the film has shots 0-2\)"):
        bad = _plan(tmp_path)
        bad.write_text(bad.read_text().replace("index: 1", "index: 7"))
        plan_overrides(bad, cfg, SPANS, check_options=check_backend_options)
    with pytest.raises(ConfigError, match="shot 1: frames 24-40 in the plan, 24-48 in the film"):
        bad = _plan(tmp_path)
        bad.write_text(bad.read_text().replace("end_frame: 48", "end_frame: 40"))
        plan_overrides(bad, cfg, SPANS, check_options=check_backend_options)
    (tmp_path / "x.yaml").write_text("shots: [")
    with pytest.raises(ConfigError, match="invalid YAML"):
        read_plan(tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("a: 1\n")
    with pytest.raises(ConfigError, match="not a dubflow shot plan"):
        read_plan(tmp_path / "y.yaml")


def test_overrides_map_onto_config_keys(tmp_path: Path):
    fields = {"dub": False, "seed": 100, "steps": 12, "color_strength": 0.5, "prompt": "whispering"}
    assert to_config_overrides(4, fields) == {
        "gate": {"overrides": {"4": "skip"}},
        "backend": {
            "options": {"prompt": "whispering", "seed": 96, "steps": 12}
        },  # the sampler adds the index
        "color": {"strength": 0.5},
    }
    # the model's fields are backend options, over the run's own (which win over the backend's section)
    cfg = load_config(overrides=["backend.options.steps=30", "backend.options.seed=7"]).to_dict()
    got = plan_overrides(_plan(tmp_path, steps=6), cfg, SPANS, check_options=check_backend_options)
    assert got[1]["backend"]["options"] == {"steps": 6, "seed": 7}
    assert backend_option(shot_config(cfg, got[1]), "steps") == 6


def test_the_plan_shows_the_estimate_regions(tmp_path: Path):
    """`auto.regions` is the estimate's regions JSON (frames, display-pixel box, speaker, score) as YAML."""
    region = {"start_frame": 24, "end_frame": 40, "box": (10, 20, 110, 140), "speaker": 1, "score": 0.73,
              "status": "speaker"}  # fmt: skip
    shots = [
        {"index": 0, "start_frame": 0, "end_frame": 24, "dub": False, "reason": "speaker off screen",
         "regions": (), "backend": {"seed": 42}},
        {"index": 1, "start_frame": 24, "end_frame": 48, "dub": True, "reason": "speech 80%; speaker: track 1",
         "regions": (region,), "backend": {"seed": 43}},
    ]  # fmt: skip
    doc = plan_document("film.mp4", "dub.wav", Fraction(24), 48, shots)
    path = write_plan(tmp_path / "plan.yaml", doc)
    auto = [s["auto"] for s in yaml.safe_load(path.read_text())["shots"]]
    assert auto[0]["regions"] == [] and auto[1]["regions"] == [{**region, "box": [10, 20, 110, 140]}]
    assert "region" not in auto[1] and "speaker" not in auto[1]  # one way: the regions carry both
    assert read_plan(path)[1]["overrides"] == {}


def _renders(ws_root: Path) -> Counter:
    (ws_dir,) = [p for p in ws_root.iterdir() if not p.name.startswith(".")]
    return Counter(json.loads(line)["shot"] for line in (ws_dir / "attempts.jsonl").read_text().splitlines())


def planned_clip(tmp_path: Path) -> tuple[Path, Path, Path, Path, Path, list[str]]:
    """A 3-shot clip, its dub track and `dubflow plan --out` of them (passthrough backend): the clip, dub,
    output, workspace root and plan paths and the `--set` arguments used."""
    clip = make_clip(tmp_path / "scene.mp4", (24, 24, 24), audio_channels=None)
    dub = make_audio(tmp_path / "dub.wav", probe(clip).video_duration_s)
    out, ws_root, plan = tmp_path / "out.mp4", tmp_path / "ws", tmp_path / "plan.yaml"
    sets = ["--set", "backend.name=passthrough", "--set", f"workspace.root={ws_root}"]
    assert main(["plan", str(clip), "--audio", str(dub), "--out", str(plan), *sets]) == 0
    return clip, dub, out, ws_root, plan, sets


@pytest.mark.usefixtures("prefect_harness")
def test_an_edited_plan_drives_a_flow_run_that_renders_only_the_edited_shots(tmp_path: Path, capsys):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.dub_film import dub_film, dub_film_inline

    clip, dub, out, ws_root, plan, sets = planned_clip(tmp_path)
    doc = yaml.safe_load(plan.read_text())
    assert [(s["index"], s["start_frame"], s["end_frame"]) for s in doc["shots"]] == [
        (0, 0, 24), (1, 24, 48), (2, 48, 72)
    ]  # fmt: skip
    assert all(s["auto"]["reason"] and s["override"]["dub"] == "auto" for s in doc["shots"])
    assert all(s["auto"]["regions"] == [] for s in doc["shots"] if not s["auto"]["dub"])
    assert all(v is None for s in doc["shots"] for k, v in s["override"].items() if k != "dub")

    config = {"backend": {"name": "passthrough"}, "workspace": {"root": str(ws_root)}}
    dub_film_inline(str(clip), str(dub), str(out), config=config, plan=str(plan))  # the plan as written
    assert sorted(_renders(ws_root).elements()) == [0, 1, 2]

    # the editor forces shot 1 and turns shot 2's colour matching down; a comment-preserving text edit
    text = plan.read_text().split("- index: ")
    text[2] = text[2].replace("dub: auto", "dub: yes")
    text[3] = text[3].replace("color_strength: null", "color_strength: 0.5")
    plan.write_text("- index: ".join(text))
    state = dub_film(str(clip), str(dub), str(out), config=config, plan=str(plan), return_state=True)
    assert state.is_completed(), state.message
    assert sorted(_renders(ws_root).elements()) == [0, 1, 1, 2, 2]
    with get_client(sync_client=True) as client:
        tables = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["scene-shots"]))
        )
    rows = max(tables, key=lambda a: a.created).data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert [(r["shot"], r["reused"]) for r in rows] == [("0000", "yes"), ("0001", ""), ("0002", "")]

    # a plan naming a shot the film does not have: one line, before any render
    plan.write_text(plan.read_text().replace("- index: 2", "- index: 9"))
    capsys.readouterr()
    cmd = [
        "dub",
        str(clip),
        "--audio",
        str(dub),
        "--out",
        str(out),
        "--plan",
        str(plan),
        "--no-prefect",
        *sets,
    ]
    assert main(cmd) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"dubflow: error: {plan}: shot 9: no such shot (the film has shots 0-2)"
    assert sorted(_renders(ws_root).elements()) == [0, 1, 1, 2, 2]
