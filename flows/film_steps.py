"""The film preparation's steps as the dub-film tasks: `FlowSteps` hands `flows.prepare.prepare_film` the
film-level tasks of `flows/film_tasks.py`, each run through the film run's runner (a Prefect task run, or a
plain call without Prefect), over the film's run workspace, which `FlowSteps.open` creates and locks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect.runtime import flow_run

from flows.film_tasks import (
    apply_plan_file,
    check_final_mix,
    check_workspace,
    decide_speakers,
    dialogue_wav,
    find_shots,
    judge_speakers,
    key_shots,
    load_dialogue,
    load_stems,
    open_film_workspace,
    plan_characters,
    plan_shots,
    probe_source,
    timeline_paths,
)
from flows.run_report import report_paths
from tasks.config.pipeline import PipelineConfig
from tasks.media.profiles import check_size, delivery
from tasks.render.preflight import check_frame_size
from tasks.run.outputs import claim_output
from tasks.run.run_lock import hold_lock
from tasks.run.workspace import MANIFEST, RUN_LOCK, Workspace


def _lock_workspace(
    held: contextlib.ExitStack, runner: Any, ws: Workspace, source: str, cfg: PipelineConfig
) -> Workspace:
    """Hold `ws`'s run lock until the run ends; reopen the workspace if the run waited for removed it."""
    lock = hold_lock(
        ws.path / RUN_LOCK,
        f"workspace {ws.path}",
        wait_s=cfg.checks.lock_wait_s,
        run=str(flow_run.name or ""),
    )
    held.enter_context(lock)
    if not (ws.path / MANIFEST).exists():  # removed by the run we waited for (workspace.keep: false)
        cfgd = cfg.to_dict()
        ws = Workspace.from_dict(runner.call(open_film_workspace, source, cfgd, cfg.workspace.root))
    return ws


@dataclass
class FlowSteps:
    """`flows.prepare.prepare_film`'s steps as the dub-film tasks (through `runner`: Prefect task runs, or
    plain calls without Prefect) over the film's run workspace, which `open` creates and locks."""

    runner: Any
    cfg: PipelineConfig
    source: str
    out: str
    overwrite: bool
    held: contextlib.ExitStack
    mix: str | None = None
    ws: Workspace | None = None
    video: dict[str, Any] | None = None
    mix_action: str | None = None  # the final mix's length check ('ok', 'pad', 'trim')
    dest: Any = None  # the claimed output (`tasks.run.outputs.claim_output`), set by `open`

    def __post_init__(self) -> None:
        self.cfgd, self.name = self.cfg.to_dict(), Path(self.source).name

    def probe(self, source: str) -> dict[str, Any]:
        video = self.runner.call(probe_source, source, self.cfgd, name=self.name)
        check_frame_size(
            source, video["width"], video["height"], delivery(self.cfg.encode, video["pix_fmt"]).pix_fmt
        )
        check_size(self.cfg.encode, source, video["width"], video["height"])
        return video

    def open(self, video: dict[str, Any]) -> None:
        """The run workspace, held locked until the run ends."""
        args = (self.source, self.cfgd, self.cfg.workspace.root)
        ws = Workspace.from_dict(self.runner.call(open_film_workspace, *args, name=self.name))
        self.ws, self.video = _lock_workspace(self.held, self.runner, ws, self.source, self.cfg), video

    def claim(self) -> None:
        """The output and the files it delivers, locked until the run ends (an output of another pass is
        refused here): once the inputs' last check (the plan file's, against the film's shots) passed, so a
        refused run leaves nothing under the output's folder, not even the folder."""
        self.dest = claim_output(
            self.held, self.out, self.ws.key, self.overwrite,
            [*timeline_paths(self.out, self.cfgd), *report_paths(self.out)],
            str(flow_run.name or ""),
        )  # fmt: skip

    def shots(self, video: dict[str, Any]) -> dict[str, Any]:
        return self.runner.call(find_shots, video, self.cfgd, self._ws.as_dict(), name=self.name)

    def dialogue(self, audio: str, frame_count: int, fps: str) -> dict[str, Any]:
        """The dub track into the workspace; the final mix (if any) length-checked right after it."""
        wav = dialogue_wav(self._ws, audio)
        track = self.runner.call(
            load_dialogue, audio, frame_count, fps, self.cfgd, wav, name=Path(audio).name
        )
        if self.mix:
            args = (self.mix, frame_count, fps, self.cfgd)
            self.mix_action = self.runner.call(check_final_mix, *args, name=Path(self.mix).name)
        return track

    def stems(self, stems: dict[str, str], frame_count: int, fps: str) -> dict[str, dict[str, Any]]:
        args = (stems, frame_count, fps, self.cfgd, self._ws.as_dict())
        return self.runner.call(load_stems, *args, name=self.name)

    def plans(self, shots: dict[str, Any]) -> list[dict[str, Any]]:
        return self.runner.call(plan_shots, shots, self.cfgd, name=self.name)

    def plan_file(
        self, path: str, records: list[dict[str, Any]], video: dict[str, Any]
    ) -> list[dict[str, Any]]:
        return self.runner.call(apply_plan_file, path, records, self.cfgd, name=Path(path).name, video=video)

    def characters(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any],
        stems: dict[str, dict[str, Any]],
    ) -> dict[str, Any]:  # fmt: skip
        args = (video, records, track, stems, self.cfgd, str(self._ws.path))
        return self.runner.call(plan_characters, *args, name=self.name)

    def speakers(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any]
    ) -> dict[str, Any]:
        return self.runner.call(
            judge_speakers, video, records, track, self.cfgd, str(self._ws.path), name=self.name
        )

    def keyed(
        self, records: list[dict[str, Any]], track: dict[str, Any], stems: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The shot keys, then the workspace verified (done shots' files) with room for the rest."""
        records = self.runner.call(
            key_shots, self.source, records, track, self.cfgd, name=self.name, stems=stems
        )
        args = (self._ws.as_dict(), records, self.video, self.cfgd)
        self.runner.call(check_workspace, *args, name=self.name)
        return records

    def decide(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any]
    ) -> dict[int, dict[str, Any]]:
        args = (video, records, track, self.cfgd, str(self._ws.path))
        return self.runner.call(decide_speakers, *args, name=self.name)

    @property
    def _ws(self) -> Workspace:
        assert self.ws is not None, "open() runs first"
        return self.ws
