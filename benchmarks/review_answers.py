"""How many answers the review step needs on the composed multi-shot film (`tests/cast_cases.py`: ANNA and BEN
in three two-face shots, CARL alone under ANNA's voice-over), every speaker turn forced uncertain
(`speaker.min_score: 1.01`, as the review tests do) so that the count does not depend on the analysis.

    PYTHONPATH=. python benchmarks/review_answers.py [WORKDIR]

Plans the film as the film run does (decisions, the uncertain turns with their faces), links the turns'
faces into characters and embeds each turn's voice (`flows.film_tasks.review_identities`, called as a plain
function), then answers turns one by one, in film order, with the truth (the face of the character whose
stem speaks in the turn), each time only for turns not yet settled by a carried answer, until every turn is
settled: prints the turns, the answers a person gave and whether every carried answer was right.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

from flows.film_tasks import review_identities
from flows.prepare import LocalSteps, prepare_film
from tasks.config.pipeline import load_config
from tasks.decision.review import NOBODY, face_label, film_turns, settle
from tests.cast_cases import HALF, N, write_film

log = logging.getLogger("review_answers")

# Who speaks when (film frames): the stems of tests/cast_cases.py (shot 2: both at once, ANNA's turn first in
# film order; shot 3: ANNA's voice over CARL, nobody on screen speaks).
TRUTH = [(0, HALF, "ANNA"), (HALF, N, "BEN"), (N, N + HALF, "ANNA"), (N + HALF, 2 * N, "BEN"),
         (2 * N, 3 * N, "ANNA"), (3 * N, 4 * N, None)]  # fmt: skip
SIDES = {0: ("ANNA", "BEN"), 1: ("BEN", "ANNA"), 2: ("ANNA", "BEN"), 3: ("CARL",)}  # left to right per shot


def recurring_film(work: Path) -> dict[str, Path]:
    """Three shots of the same two people (seed 2 speaking, seed 1 talking silently beside), sides swapped in
    the middle shot, each on its own background so the detector cuts: one character's voice across the film."""
    import numpy as np
    import soundfile as sf

    from tests.av_cases import BG, _voice, canvas, talking
    from tests.speaker_cases import SR, encode

    n, shots = 81, []
    for k, (grey, swap) in enumerate(((60, False), (150, True), (220, False))):
        clips = [talking(1, n, 10 + k * n), talking(2, n, k * n)]
        frames, _ = canvas(clips[::-1] if swap else clips, (360, 640))
        frames[(frames == BG).all(axis=-1)] = grey
        shots.append(frames)
    audio = _voice(2, 3 * n)
    film = encode(work / "recurring.mp4", np.concatenate(shots), audio)
    sf.write(work / "recurring.wav", audio, SR, subtype="FLOAT")
    return {"film": film, "mix": work / "recurring.wav"}


def main(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for name, make, truth in (
        ("cast film", write_film, _truth),
        ("recurring speaker", recurring_film, _seed2),
    ):
        print(f"== {name}")
        run(work / name.replace(" ", "_"), make, truth)


def _seed2(turn) -> str:
    """The recurring film's truth: seed 2 speaks in every shot (right in shots 0 and 2, left in shot 1)."""
    faces = sorted(turn.faces, key=lambda f: f["box"][0])
    if len(faces) < 2:
        return NOBODY
    return face_label(faces[0 if turn.shot == 1 else 1]["track"])


def run(work: Path, make, truth_of) -> None:
    work.mkdir(parents=True, exist_ok=True)
    files = make(work)
    cfg = load_config(overrides=["speaker.min_score=1.01", "backend.name=infinitetalk"])
    plan = prepare_film(
        str(files["film"]), str(files["mix"]), cfg, LocalSteps(cfg, work / "scratch", work / "wd")
    )
    records = plan.records
    for r in records:
        r["decision"]["uncertain"] = _uncertain(r, cfg, plan, work)
    turns = film_turns(records)
    spans = [[t.shot, t.start_frame, t.end_frame] for t in turns]
    ids = review_identities.fn(plan.video, records, spans, cfg.to_dict(), str(work / "wd"))
    characters = {(int(i), int(k)): str(c) for i, k, c in ids["faces"]}
    voices = {t.field: ids["voices"].get(f"{t.shot}:{t.start_frame}:{t.end_frame}") for t in turns}
    fps = Fraction(plan.video["fps"])
    print(
        f"characters {sorted(set(characters.values()))}, turn voices {sum(v is not None for v in voices.values())}"
    )
    answers: dict[str, str] = {}
    while True:
        settled = settle(turns, answers, characters, voices, cfg.speaker.voice_min_cos)
        left = [s for s in settled if s.by == "policy" and s.turn.field not in answers]
        if not left:
            break
        t = left[0].turn
        answers[t.field] = truth_of(t)
    print(f"{len(turns)} uncertain turn(s), {len(answers)} answer(s) given")
    wrong = 0
    for s in settled:
        right = truth_of(s.turn)
        got = NOBODY if s.speaker is None else face_label(s.speaker)
        wrong += got != right
        print(f"  shot {s.turn.shot} {s.turn.span(fps)}: {got} by {s.by} (truth {right})")
    print(f"{wrong} settled turn(s) wrong")


def _uncertain(record, cfg, plan, work):
    """The record's uncertain turns as the film run lists them (`flows.film_tasks.decide_speakers`)."""
    from tasks.decision.review import uncertain_of
    from tasks.decision.shot_decision import decide_shot, faces_path
    from tasks.media.audio import read_samples
    from tasks.media.probe import VideoInfo

    info = VideoInfo.from_dict(plan.video)
    s, e = record["plan"]["start_frame"], record["plan"]["end_frame"]
    a, b = record["audio_range"]
    cache = faces_path(work / "wd", record["index"], s, e, cfg)
    d = decide_shot(
        record["index"], s, e, info, read_samples(plan.track, a, b), plan.track.sample_rate, cfg, cache
    )
    return uncertain_of(d, s)


def _truth(turn) -> str:
    """The right choice of a turn: the face of the character whose stem speaks over most of it."""
    mid = (turn.start_frame + turn.end_frame) // 2
    who = next(w for a, b, w in TRUTH if a <= mid < b)
    if who is None:
        return NOBODY
    faces = sorted(turn.faces, key=lambda f: f["box"][0])  # left to right
    names = SIDES[turn.shot]
    match = [f for f, n in zip(faces, names, strict=False) if n == who]
    return face_label(match[0]["track"]) if match else NOBODY


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="review-answers-")))
