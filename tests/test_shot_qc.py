"""A dubbed shot's QC is written after its done marker, on a thread of its own beside the next shot's
render (not on the render's path, where the GPU would idle), recorded in the shot's folder, written again by
the next run when a crash lost it (the render reused), and shown in Prefect as a `qc-NNNN` task run with its
artifact. The sample film with the tiny model on the CPU (TINY RANDOM WEIGHTS: a pipeline check)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.shot_task import QC_RECORD
from tasks.media.intermediates import read_marker
from tasks.media.probe import probe
from tasks.run.workspace import read_attempts, read_shot_done
from tests.test_group_warmup import _workspace
from tests.test_infinitetalk import DUB, FILM, SHOTS
from tests.tiny_weights import seed_cache

DUBBED = (0, 2)  # shot 0: the speaker's face crop; shot 2: no face, forced (the full frame)


@pytest.fixture
def qc_log() -> Iterator[list[tuple[str, str]]]:
    """(thread name, message) of the shot module's log records."""
    lines: list[tuple[str, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((record.threadName, record.getMessage()))

    logger, handler = logging.getLogger("flows.shot_task"), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def _tiny_root(tmp_path: Path, tiny_weights: Path) -> Path:
    """A workspace root whose .cache holds the tiny weights root (the session's, copied)."""
    root = tmp_path / "ws"
    seed_cache(tiny_weights, root / ".cache")
    return root


def _config(ws_root: Path) -> dict:
    return {
        "backend": {"name": "infinitetalk"},
        "workspace": {"root": str(ws_root)},
        "gate": {"overrides": {1: "skip", 2: "dub", 3: "skip", 4: "skip"}},
    }


def _qc_records(ws_root: Path) -> dict[int, dict]:
    ws = _workspace(ws_root)
    keys = {a["shot"]: a["key"] for a in read_attempts(ws)}
    return {i: read_marker(ws.shot_dir(i, keys[i]) / QC_RECORD) for i in sorted(keys)}


def _check_report(out: Path, qc: dict[int, dict]) -> None:
    """The report next to the film, read back: every shot with its SMPTE timecodes (23.976 fps from
    00:00:00:00), dubbed or not and why, the dubbed faces by place with a thumbnail, where the speech came
    from, its QC links; the outputs, the workspace and the log."""
    report = json.loads(out.with_suffix(".report.json").read_text())
    page = out.with_suffix(".report.html").read_text()
    assert report["film"] == str(FILM) and report["fps"] == "24000/1001" and report["frames"] == SHOTS[-1][1]
    assert [(s["shot"], tuple(s["frames"])) for s in report["shots"]] == list(enumerate(SHOTS))
    # 24000/1001 counts 24 frames a timecode second: frame 60 is 00:00:02:12, frame 288 is 00:00:12:00
    assert (report["shots"][0]["tc_in"], report["shots"][0]["tc_out"]) == ("00:00:00:00", "00:00:02:12")
    assert report["shots"][-1]["tc_out"] == report["duration"] == "00:00:12:00"
    assert [s["shot"] for s in report["shots"] if s["dubbed"]] == list(DUBBED) == [0, 2]
    skipped = [s for s in report["shots"] if not s["dubbed"]]
    assert all(s["status"] == "not dubbed (copied through)" and "skip" in s["why"] for s in skipped), skipped
    (face,) = report["shots"][0]["who"]  # the speaker, by place, with its thumbnail and confidence in words
    assert face["track"] == 0 and face["status"] == "speaker" and "close-up" in face["place"]
    assert face["thumbnail"].startswith("data:image/png;base64,") and face["thumbnail"] in page
    assert "confidence" in face["confidence"] and "film's own dialogue" in report["shots"][0]["speech"]
    (forced,) = report["shots"][2]["who"]  # no face: the forced full frame
    assert forced["status"] == "forced" and forced["confidence"].startswith("forced")
    for i in DUBBED:
        shot = report["shots"][i]
        assert (shot["qc_sheet"], shot["qc_preview"]) == (qc[i]["contact_sheet"], qc[i]["preview"])
        assert Path(shot["qc_sheet"]).resolve().as_uri() in page
    assert (
        report["outputs"]["film"] == str(out.resolve())
        and Path(report["outputs"]["timeline (OTIO)"]).is_file()
    )
    assert Path(report["workspace"]).is_dir() and report["log"] is None  # no run log outside the command
    assert any("TINY RANDOM WEIGHTS" in n for n in report["notes"]) and "TINY RANDOM WEIGHTS" in page


def test_qc_is_written_beside_the_next_render_and_again_after_a_lost_one(
    tmp_path: Path, qc_log: list[tuple[str, str]], tiny_weights: Path
):
    from flows.dub_film import dub_film_inline

    ws_root = _tiny_root(tmp_path, tiny_weights)
    dub_film_inline(str(FILM), str(DUB), str(tmp_path / "a.mp4"), config=_config(ws_root))
    ws = _workspace(ws_root)
    attempts = read_attempts(ws)
    keys = {a["shot"]: a["key"] for a in attempts}
    records = _qc_records(ws_root)
    assert [i for i, r in records.items() if r is not None] == list(DUBBED), records
    for i in DUBBED:
        result = read_shot_done(ws, i, keys[i])["result"]
        assert result["qc"] is None and "qc" not in result["timings_s"], result  # not on the render's path
        rec = records[i]
        start, end = SHOTS[i]
        assert probe(rec["preview"]).frame_count == end - start and Path(rec["contact_sheet"]).stat().st_size
        assert rec["seconds"] > 0
    _check_report(tmp_path / "a.mp4", records)
    written = [(t, m) for t, m in qc_log if " QC in " in m]
    assert [m[:9] for _, m in written] == ["shot 0000", "shot 0002"], qc_log
    assert all(t.startswith("shot-qc") for t, _ in written), written  # the QC thread, not the render's

    # a crash after shot 0's done marker lost its QC: the next run reuses the render and writes the QC
    Path(records[0]["preview"]).unlink()
    qc_log.clear()
    dub_film_inline(str(FILM), str(DUB), str(tmp_path / "b.mp4"), config=_config(ws_root))
    assert read_attempts(ws) == attempts  # nothing rendered again
    assert [m[:9] for _, m in qc_log if " QC in " in m] == ["shot 0000"], qc_log
    assert probe(_qc_records(ws_root)[0]["preview"]).frame_count == SHOTS[0][1] - SHOTS[0][0]


@pytest.mark.usefixtures("prefect_harness")
def test_qc_task_runs_and_artifacts_in_the_group_run(tmp_path: Path, tiny_weights: Path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from flows.dub_film import dub_film
    from flows.film_tasks import film_tag
    from flows.progress import artifact_key

    root = _tiny_root(tmp_path, tiny_weights)
    state = dub_film(str(FILM), str(DUB), str(tmp_path / "out.mp4"), config=_config(root), return_state=True)
    assert state.is_completed(), state.message
    records = _qc_records(root)
    with get_client(sync_client=True) as client:
        groups = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["dub-group"])))
        mine = [g.id for g in groups if g.parameters["ws"]["root"] == str(root.resolve())]
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=mine)))
        names = {r.name: r.state.name for r in runs}
        for i in DUBBED:
            key = artifact_key(film_tag(str(FILM)), "shot", f"{i:04d}", "qc")
            arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
            uri = Path(records[i]["preview"]).resolve().as_uri()  # other tests' films share the key
            assert any(uri in a.data for a in arts), [a.data for a in arts]
    qc_runs = {n[:7]: s for n, s in names.items() if n.startswith("qc-")}
    assert qc_runs == {f"qc-{i:04d}": "Completed" for i in DUBBED}, names  # the copied-through: none
    assert [i for i, r in records.items() if r is not None] == list(DUBBED)
