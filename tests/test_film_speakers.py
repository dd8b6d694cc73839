"""Who speaks, judged over the whole film (tasks/decision/film_speakers.py): the kept verdict inputs, the content
map's calibration on the film's own lines, and voices bound to characters, on real faces through the product's
planning path (`flows.estimate.estimate_film`, what `dubflow estimate` runs).

The film is four shots of `tests/film_cases.py`'s test film (cast "a"): BEN alone, BEN beside the still listener,
the listener alone under an off-screen narrator, and DORA beside BEN while BEN speaks and DORA mouths other
words.  Judged alone, that last shot is uncertain (two moving mouths, content not decisive); BEN's two confident
lines bind his voice, and the line in it, with his face on screen, is his.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from flows.estimate import estimate_film
from tasks.config.pipeline import load_config
from tasks.decision.film_speakers import (
    Line,
    _voices,
    apply_bindings,
    bind_voices,
    bound_speaker,
    cast_characters,
    runs_of,
    with_film_speakers,
)
from tasks.media.probe import probe
from tasks.perception.content import load_prior
from tasks.perception.face_analysis import ShotFaces, source_samples
from tasks.perception.speaker import SpeakerSegment
from tasks.perception.verdict import speaker_verdict
from tasks.perception.verdict_record import VerdictRecord
from tests.film_cases import FILM, N, film_audio, side_of, write_film
from tests.speaker_cases import SR

PICKS = (
    1,
    8,
    4,
    11,
)  # BEN alone; BEN beside the listener; a reaction shot (narrator); DORA | BEN, BEN speaks


@functools.cache
def short_film(root: str) -> tuple[Path, Path]:
    import soundfile as sf

    film = write_film(Path(root) / "film.mp4", FILM, "a", PICKS)
    dub = Path(root) / "dub.wav"
    sf.write(dub, film_audio(tuple(FILM[i] for i in PICKS), "a"), SR, subtype="FLOAT")
    return film, dub


@pytest.fixture(scope="module")
def film(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("film_speakers")
    source, dub = short_film(str(root))
    return source, dub, root / "ws"


def _turns(source: Path, dub: Path, work: Path, **speaker) -> list[list[tuple[str, str]]]:
    """Per shot of the short film: [(status, side)] of its dubbed regions."""
    return _estimate(source, dub, work, **speaker)[0]


def _estimate(
    source: Path, dub: Path, work: Path, **speaker
) -> tuple[list[list[tuple[str, str]]], dict | None]:
    """(`_turns`, the estimate's film_speakers summary)."""
    est = estimate_film(source, dub, load_config(updates={"speaker": speaker}), work_dir=work)
    assert len(est.shots) == len(PICKS)
    turns = [
        [(r["status"], side_of(r["box"], FILM[PICKS[k]])) for r in s.regions] for k, s in enumerate(est.shots)
    ]
    return turns, est.to_dict()["film_speakers"]


def test_the_film_step_settles_a_line_by_its_bound_voice(film, caplog) -> None:
    """Judged alone the two-shot's line is uncertain; with the film step BEN's face (right) says it, confidently,
    and every other turn is as it was: the singles right, the narrator's line over the listener dubbed nowhere.
    With the calibration let in on this little speech (`film_min_s` 1 s; 20 s by default), the map is calibrated
    on the film's single-face line and every shot judged again with it: the same turns."""
    source, dub, work = film
    alone = _turns(source, dub, work, film="off")
    assert alone[0] and all(t == ("speaker", "centre") for t in alone[0])
    assert alone[1] and all(t == ("speaker", "left") for t in alone[1])
    assert alone[2] == []  # nobody on screen says the narrator's line
    assert any(status == "uncertain" for status, _ in alone[3]), alone[3]
    whole, summary = _estimate(source, dub, work, film="auto")
    assert summary is not None and summary["shots_changed"] == [3] and summary["bound_lines"] >= 1, summary
    assert summary["calibrated_s"] == 0.0  # 20 s of single-face lines needed: this film has 2
    assert whole[:3] == alone[:3]
    assert whole[3] and all(t == ("speaker", "right") for t in whole[3]), whole[3]
    caplog.set_level(logging.INFO, logger="tasks.decision.film_speakers")
    calibrated = _turns(source, dub, work, film="auto", film_min_s=1.0)
    seconds = [float(m) for m in re.findall(r"map calibrated on ([0-9.]+) s", caplog.text)]
    assert seconds and seconds[-1] > 1.0, caplog.text
    assert calibrated == whole


def test_the_kept_inputs_judge_each_shot_as_analysed(film) -> None:
    """Each shot's analysis cache keeps its verdict's inputs; judged again from them with the shipped prior (no
    frame decoded), every shot gets exactly the segments its analysis found."""
    source, _dub, work = film
    caches = sorted(p for p in (work / "faces").glob("*.json") if ".ids-" not in p.name)  # not the embeddings
    assert len(caches) == len(PICKS)
    info = probe(str(source))
    for k, path in enumerate(caches):
        body = json.loads(path.read_text())["body"]
        faces = ShotFaces.from_dict(body)
        assert faces.verdict is not None and "verdict" not in faces.to_dict()
        record = VerdictRecord.from_dict(faces.verdict)
        assert record.shapes is not None and record.shapes.shape[:2] == (len(faces.tracks), N)
        audio = source_samples(info, k * N, (k + 1) * N)
        assert audio is not None
        again = speaker_verdict(
            record.inputs(audio, load_prior(), _voices(audio, 25.0)), load_config().speaker
        )
        assert tuple(again) == faces.segments, path.name


# ------------------------------------------------------------------------------ the rules, on plain vectors


def _unit(*v: float) -> np.ndarray:
    a = np.array(v, np.float64)
    return a / np.linalg.norm(a)


def test_a_voice_is_bound_only_from_two_agreeing_lines() -> None:
    sp = load_config().speaker
    a1, a2, b1 = Line(0, 0, 50, 0), Line(1, 0, 50, 0), Line(2, 0, 50, 0)
    chars = {(0, 0): "c1", (1, 0): "c1", (2, 0): "c2"}
    voice = {a1: _unit(1, 0.1, 0), a2: _unit(1, -0.1, 0), b1: _unit(0, 1, 0)}
    bound = bind_voices([a1, a2, b1], voice, chars, sp)
    assert list(bound) == ["c1"]  # c2 has one line only
    voice[a2] = _unit(0, 0, 1)  # two voices under one face: no binding
    assert bind_voices([a1, a2, b1], voice, chars, sp) == {}


def test_a_bound_voice_names_a_face_only_on_screen_and_by_a_clear_margin() -> None:
    sp = load_config().speaker
    bound = {"c1": _unit(1, 0, 0), "c2": _unit(0, 1, 0)}
    assert bound_speaker(_unit(1, 0.2, 0), {3: "c1", 4: "c2"}, bound, sp) == 3
    assert bound_speaker(_unit(1, 0.2, 0), {4: "c2"}, bound, sp) is None  # its character is not on screen
    assert bound_speaker(_unit(1, 0.9, 0), {3: "c1", 4: "c2"}, bound, sp) is None  # too close to both
    assert bound_speaker(_unit(0, 0, 1), {3: "c1"}, bound, sp) is None  # an unbound voice


def test_runs_and_overrides() -> None:
    segs = [
        SpeakerSegment(0, 20, "uncertain", 0, 0.3), SpeakerSegment(25, 35, "uncertain", 0, 0.3),
        SpeakerSegment(35, 60, "speaker", 1, 0.8), SpeakerSegment(70, 80, "uncertain", 1, 0.3),
    ]  # fmt: skip
    assert runs_of(segs, "uncertain", 12) == [[0, 1], [3]]
    over = with_film_speakers({"cast": {"shot": {"tracks": {"0": "c1"}}}}, [segs[0].to_dict()])
    assert over["cast"]["shot"] == {"tracks": {"0": "c1"}, "speakers": [segs[0].to_dict()]}
    records = [{"index": 3, "overrides": over}, {"index": 4}]
    assert cast_characters(records) == {(3, 0): "c1"}
    assert cast_characters([{"index": 4}]) is None
    assert apply_bindings  # exercised on real faces above
