"""The film preparation, written once: probe -> shots -> dialogue -> slice bounds -> chunk plans -> plan
file -> cast -> keys -> decide (`prepare_film`), for `dub-film`, `dubflow estimate` and `dubflow plan`.

The sequence is the same for all three; where each step's work lands is not. The flow hands in steps that
run each one as a Prefect task over its run workspace (`flows.dub_film.FlowSteps`: the task runs show in the
UI as before); `dubflow estimate` and `dubflow plan` hand in `LocalSteps`, plain calls over a scratch folder.
A step returns the plain dicts the Prefect tasks pass (video, shot list, dialogue track, chunk plans,
per-shot records), so both kinds serve the one sequence.

No Prefect and no torch at import: `dubflow plan` (JSON) runs through here on the light path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Protocol

from tasks.config.pipeline import PipelineConfig
from tasks.decision.cast import CastPlan, cast_active, film_cast
from tasks.decision.film_speakers import cast_characters, film_speakers, record_spans, with_film_speakers
from tasks.decision.shot_decision import decide_shot, faces_path, regions_json
from tasks.media.audio import DialogueTrack, prepare_dialogue, read_samples, slice_bounds
from tasks.media.probe import VideoInfo, probe
from tasks.render.backend import backend_model_size
from tasks.timeline.plan import plan_film
from tasks.timeline.shot_key import shot_config, shot_configs
from tasks.timeline.shots import ShotList, detect_shots

log = logging.getLogger(__name__)


@dataclass
class FilmPlan:
    """What the preparation knows before any rendering (plain dicts: they cross Prefect task boundaries)."""

    video: dict[str, Any]  # VideoInfo.to_dict(), frame_count the shot list's (the decoded count)
    shots: dict[str, Any]  # ShotList.to_dict()
    track: DialogueTrack  # the dub track, decoded and length-checked
    stems: dict[str, dict[str, Any]]  # {character: DialogueTrack dict}
    # per shot: index, start_s, end_s, frames, chunks, plan, audio_range (+ overrides, plan_file, key, decision)
    records: list[dict[str, Any]]
    cast: CastPlan | None = None
    # what the film-level verdict did (`FilmVerdict.to_dict()` less the segments); None when it did not run
    speakers: dict[str, Any] | None = None


class FilmSteps(Protocol):
    """The steps `prepare_film` runs, in its order; each returns the dicts the Prefect tasks pass."""

    def probe(self, source: str) -> dict[str, Any]: ...
    def open(self, video: dict[str, Any]) -> None: ...  # where the film's work files go (checks first)
    def claim(self) -> None: ...  # the output, once every check of the inputs passed
    def shots(self, video: dict[str, Any]) -> dict[str, Any]: ...
    def dialogue(self, audio: str, frame_count: int, fps: str) -> dict[str, Any]: ...
    def stems(self, stems: dict[str, str], frame_count: int, fps: str) -> dict[str, dict[str, Any]]: ...
    def plans(self, shots: dict[str, Any]) -> list[dict[str, Any]]: ...
    def plan_file(
        self, path: str, records: list[dict[str, Any]], video: dict[str, Any]
    ) -> list[dict[str, Any]]: ...
    def characters(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any],
        stems: dict[str, dict[str, Any]],
    ) -> dict[str, Any]: ...  # fmt: skip
    def speakers(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any]
    ) -> dict[str, Any]: ...  # `tasks.decision.film_speakers.FilmVerdict.to_dict()`
    def keyed(
        self, records: list[dict[str, Any]], track: dict[str, Any], stems: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]: ...  # the flow keys and verifies its workspace here, before the CPU analysis
    def decide(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any]
    ) -> dict[int, dict[str, Any]]: ...


def prepare_film(
    source: str,
    audio: str,
    cfg: PipelineConfig,
    steps: FilmSteps,
    *,
    stems: dict[str, str] | None = None,
    plan: str | None = None,
    decide: bool = True,
    through: Literal["plans", "decisions"] = "decisions",
) -> FilmPlan:
    """The film preparation (the one sequence of `dub-film`, `dubflow estimate` and `dubflow plan`).

    probe -> (open the work folder) -> shots -> dialogue (decode, length check) [-> stems] -> chunk plans
    with each shot's audio slice bounds; `through="plans"` stops there (`dubflow plan` JSON). Then the shot
    plan file's overrides (`plan`), the output claimed (`claim`: after the inputs' last check), and with `decide` (the backend gates shots): the cast (characters and
    who speaks when, when linked) -> the film's speakers (`speaker.film`: every shot analysed, judged again
    with the film's calibrated content map and bound voices) -> shot keys -> every shot's dub decision
    (record["decision"]).
    """
    video = steps.probe(source)
    steps.open(video)
    shots = steps.shots(video)
    n, fps = shots["frame_count"], shots["fps"]
    if n != video["frame_count"]:
        video = {**video, "frame_count": n}
    track = DialogueTrack.from_dict(steps.dialogue(audio, n, fps))
    stem_tracks = steps.stems(stems, n, fps) if stems else {}
    records = shot_records(shots, steps.plans(shots), track)
    if through == "plans":
        return FilmPlan(video, shots, track, stem_tracks, records)
    if plan:
        records = steps.plan_file(plan, records, video)
    steps.claim()  # the inputs' last check passed: only now is anything created where the output goes
    cast = None
    if decide and cast_active(cfg, stems):  # characters and who speaks when, before the keys
        cast = CastPlan(**steps.characters(video, records, track.to_dict(), stem_tracks))
        records = [{**r, "overrides": cast.overrides(r["index"], r.get("overrides"))} for r in records]
    speakers = None
    if decide and cfg.speaker.film != "off":  # who speaks, judged over the whole film (calibration, voices)
        verdict = steps.speakers(video, records, track.to_dict())
        film = verdict["segments"]
        speakers = {
            **{k: v for k, v in verdict.items() if k != "segments"},
            "shots_changed": sorted(map(int, film)),
        }
        records = [{**r, "overrides": with_film_speakers(r.get("overrides"), film[str(r["index"])])}
                   if str(r["index"]) in film else r for r in records]  # fmt: skip
    records = steps.keyed(records, track.to_dict(), stem_tracks)
    if decide:  # who speaks where, on the CPU: GPU workers read the cached face analysis
        decisions = steps.decide(video, records, track.to_dict())
        records = [{**r, "decision": decisions[r["index"]]} for r in records]
    return FilmPlan(video, shots, track, stem_tracks, records, cast, speakers)


def shot_records(
    shots: dict[str, Any], plans: list[dict[str, Any]], track: DialogueTrack
) -> list[dict[str, Any]]:
    """Small serialisable per-shot records: span, plan, audio samples (`key_shots` adds the result key)."""
    edges = [s["start_frame"] for s in shots["shots"]] + [shots["frame_count"]]
    bounds = slice_bounds(edges, Fraction(shots["fps"]), track.sample_rate, track.n_samples)
    records = []
    for s, plan, (a, b) in zip(shots["shots"], plans, bounds, strict=True):
        record = {
            "index": s["index"],
            "start_s": s["start_s"],
            "end_s": s["end_s"],
            "frames": s["end_frame"] - s["start_frame"],
            "chunks": len(plan["chunks"]),
            "plan": plan,
            "audio_range": [a, b],
        }
        records.append(record)
    return records


@dataclass
class LocalSteps:
    """The preparation as plain calls (`dubflow estimate`, `dubflow plan`): the decoded dub track and stems
    under `scratch`, the face analyses and embeddings under `work_dir` (where a later estimate finds them;
    default: `scratch`)."""

    cfg: PipelineConfig
    scratch: Path
    work_dir: Path | None = None

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir or self.scratch)

    def probe(self, source: str) -> dict[str, Any]:
        return probe(source, frame_count=self.cfg.probe.frame_count).to_dict()

    def open(self, video: dict[str, Any]) -> None:
        for folder in (self.scratch, self.work_dir):
            folder.mkdir(parents=True, exist_ok=True)

    def claim(self) -> None:
        """No output: the local preparation delivers nothing."""

    def shots(self, video: dict[str, Any]) -> dict[str, Any]:
        return detect_shots(VideoInfo.from_dict(video), self.cfg.shots).to_dict()

    def dialogue(self, audio: str, frame_count: int, fps: str) -> dict[str, Any]:
        return self._decode(audio, frame_count, fps, self.scratch / "dialogue.wav")

    def stems(self, stems: dict[str, str], frame_count: int, fps: str) -> dict[str, dict[str, Any]]:
        return {
            name: self._decode(path, frame_count, fps, self.scratch / f"stem-{i}.wav")
            for i, (name, path) in enumerate(sorted(stems.items()))
        }

    def plans(self, shots: dict[str, Any]) -> list[dict[str, Any]]:
        sl = ShotList.from_dict(shots)
        return [p.to_dict() for p in plan_film(sl.shots, sl.fps, self.cfg.plan)]

    def plan_file(
        self, path: str, records: list[dict[str, Any]], video: dict[str, Any]
    ) -> list[dict[str, Any]]:
        raise NotImplementedError("the local preparation reads no shot plan file (only `dubflow dub` does)")

    def characters(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any],
        stems: dict[str, dict[str, Any]],
    ) -> dict[str, Any]:  # fmt: skip
        """The film's characters (`tasks.decision.cast.film_cast`), as `flows.film_tasks.plan_characters`."""
        dialogue = DialogueTrack.from_dict(track)
        mono = {n: _mono(DialogueTrack.from_dict(t)) for n, t in stems.items()}
        cast = film_cast(
            VideoInfo.from_dict(video), record_spans(records), lambda a, b: read_samples(dialogue, a, b),
            dialogue.sample_rate, mono, lambda _i: self.cfg, self.work_dir,
        )  # fmt: skip
        return cast.to_dict()

    def speakers(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any]
    ) -> dict[str, Any]:
        """Who speaks over the whole film (`tasks.decision.film_speakers`), as `flows.film_tasks.judge_speakers`."""
        dialogue = DialogueTrack.from_dict(track)
        verdict = film_speakers(
            VideoInfo.from_dict(video), record_spans(records), lambda a, b: read_samples(dialogue, a, b),
            dialogue.sample_rate, shot_configs(self.cfg.to_dict(), records), self.work_dir,
            cast_characters(records),
        )  # fmt: skip
        return verdict.to_dict()

    def keyed(
        self, records: list[dict[str, Any]], track: dict[str, Any], stems: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        return records  # nothing is rendered from here: no result keys

    def decide(
        self, video: dict[str, Any], records: list[dict[str, Any]], track: dict[str, Any]
    ) -> dict[int, dict[str, Any]]:
        """Each shot's dub decision under its effective config, as `flows.film_tasks.decide_speakers`."""
        info, dialogue = VideoInfo.from_dict(video), DialogueTrack.from_dict(track)
        config = self.cfg.to_dict()
        out: dict[int, dict[str, Any]] = {}
        for r in records:
            plan, (a, b) = r["plan"], r["audio_range"]
            cfg = PipelineConfig.from_dict(shot_config(config, r.get("overrides")))
            s, e = plan["start_frame"], plan["end_frame"]
            cache = faces_path(self.work_dir, r["index"], s, e, cfg)
            samples = read_samples(dialogue, a, b)
            d = decide_shot(r["index"], s, e, info, samples, dialogue.sample_rate, cfg, cache)
            hw = backend_model_size(cfg, d, info, e - s)  # what the group's load warms
            out[r["index"]] = {
                "dub": d.dub,
                "reason": d.reason,
                "regions": regions_json(d, s),
                "model_hw": hw,
            }
            log.debug("shot %04d: %s (%s)", r["index"], "dub" if d.dub else "pass", d.reason)
        return out

    def _decode(self, path: str, frame_count: int, fps: str, out_wav: Path) -> dict[str, Any]:
        track = prepare_dialogue(
            path, frame_count=frame_count, fps=Fraction(fps), cfg=self.cfg.audio, out_wav=out_wav
        )
        return track.to_dict()


def _mono(track: DialogueTrack) -> Any:
    return read_samples(track, 0, track.n_samples).mean(axis=1)
