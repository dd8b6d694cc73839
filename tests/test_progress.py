"""UI helpers: names and keys (pure), and the artifacts a run really creates (Prefect test server)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from tqdm import tqdm

from flows.progress import (
    ShotProgress,
    TqdmToLogger,
    artifact_key,
    publish_shot_table,
    publish_summary,
    shot_run_name,
    timecode,
)


def test_artifact_key_is_valid_for_prefect():
    assert artifact_key("My Film (2024).mp4", "shot", "0042") == "my-film-2024-mp4-shot-0042"
    assert artifact_key("Été", 7) == "t-7"
    with pytest.raises(ValueError, match="nothing usable"):
        artifact_key("__", "?")


def test_timecode_and_shot_names():
    assert timecode(723.125) == "00:12:03.125"
    assert timecode(59.9996) == "00:01:00.000"
    assert timecode(3 * 3600 + 0.5) == "03:00:00.500"
    assert shot_run_name(42, 723.125, 729.0) == "shot-0042 00:12:03.125-00:12:09.000"
    with pytest.raises(ValueError, match="finite time"):
        timecode(-1.0)


def test_tqdm_bridge_forwards_refreshes_to_the_logger(caplog: pytest.LogCaptureFixture):
    logger = logging.getLogger("test.tqdm")
    with caplog.at_level(logging.INFO, logger="test.tqdm"):
        for _ in tqdm(range(3), file=TqdmToLogger(logger), mininterval=0, desc="chunks"):
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "test.tqdm"]
    assert lines and lines[-1].startswith("chunks: 100%") and "3/3" in lines[-1]


@pytest.mark.usefixtures("prefect_harness")
def test_artifacts_of_a_run(tmp_path: Path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    output = tmp_path / "film dubbed.mp4"
    output.write_bytes(b"x")

    @flow(name="progress-helpers")
    def demo() -> None:
        progress = ShotProgress("film-shot-0001", "shot 0001 of film")
        for fraction in (0.25, 0.25, 1.5):  # repeated values are skipped, overshoot clamps
            progress(fraction)
        publish_shot_table(
            "film-shots",
            [
                {"index": 0, "start_s": 0.0, "end_s": 2.5, "frames": 60, "chunks": 1, "backend": "fake"},
                {"index": 1, "start_s": 2.5, "end_s": 4.0, "status": "failed", "reason": "OOM"},
            ],
            "shot plan",
        )
        publish_summary("film-summary", title="film dubbed", output=output, timings={"render": 12.34})

    state = demo(return_state=True)
    assert state.is_completed()
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    by_key = {a.key: a for a in found}
    assert set(by_key) == {"film-shot-0001", "film-shots", "film-summary", "film-summary-output"}
    assert by_key["film-shot-0001"].type == "progress" and by_key["film-shot-0001"].data == 100.0
    rows = json.loads(by_key["film-shots"].data)
    assert rows[0] == {
        "shot": "0000",
        "start": "00:00:00.000",
        "end": "00:00:02.500",
        "frames": 60,
        "chunks": 1,
        "backend": "fake",
        "status": "pending",
        "reused": "",
        "speaker": "",
        "score": "",
        "agreement": "",
        "lips": "",
        "reason": "",
    }
    assert rows[1]["status"] == "failed" and rows[1]["reason"] == "OOM"
    assert f"`{output}`" in by_key["film-summary"].data and "| render | 12.3 |" in by_key["film-summary"].data
    assert by_key["film-summary-output"].data == f"[{output.name}]({output.as_uri()})"
