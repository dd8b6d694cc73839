"""A multi-shot dialogue film with recurring characters, truth by construction, from the committed talking heads.

Four people (cast "a": ANNA = head6, BEN = head8, CARL = head9, DORA = head4; cast "b" other heads), a listener who never speaks (head1's quiet
stretch, played back and forth) and two voices never seen (head2, head3: off-screen voices over reaction shots).
Every shot is 2 s (50 frames) on its own background grey (the shot detector cuts there) and holds one turn:

- a *line* is a third of a head's 6-s clip (frames and its own sound [50 l, 50 l + 50)); each spoken line is
  heard once in the film (no line is both a calibration pair and a judged turn), while a face in a two-shot
  that does not speak mouths another of its own lines (two moving mouths: rhythm cannot tell them apart);
- singles (one face saying its line), two-shots with a talker mouthing other words, a two-shot beside the still
  listener, reaction shots (the listener alone under an off-screen voice: nobody on screen speaks).

`FILM` lists the shots; `write_film` encodes the film (its audio is the dialogue: a dub track with the same
timing), `truth` gives per shot the speaking person and where their face is ("left", "right", "centre").
`write_film(..., picks=...)` writes a few of the shots (as they are in the whole film), for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.speaker_cases import FPS, LEFT, RIGHT, SIZE, SR, TOP, encode, listener, seed_audio, seed_frames

N = 50  # frames per shot (2 s)
PEOPLE = {"ANNA": 6, "BEN": 8, "CARL": 9, "DORA": 4}
LISTENER = 1  # head1's quiet stretch: a face on screen that never speaks
VOICES = {"NARRATOR": 2, "STRANGER": 3}  # heard, never seen
# who plays whom: "a" is the film the film step was built on; "b" (the same shots, other heads in each part,
# other off-screen voices) was composed before the rules were last changed and run once after (benchmarks/RESULTS.md)
CASTS = {
    "a": {**PEOPLE, **VOICES, "LISTENER": LISTENER},
    "b": {"ANNA": 9, "BEN": 4, "CARL": 6, "DORA": 8, "NARRATOR": 5, "STRANGER": 7, "LISTENER": LISTENER},
}


@dataclass(frozen=True)
class Shot:
    """One shot: who is where (name, line mouthed or spoken; "LISTENER" for the listener) and whose line is heard."""

    left: tuple[str, int] | None
    right: tuple[str, int] | None
    centre: tuple[str, int] | None
    voice: tuple[str, int]  # (person or voice, line) heard over the shot

    def speaker_side(self) -> str | None:
        """Where the face whose line is heard is, or None (nobody on screen says it)."""
        for side in ("left", "right", "centre"):
            who = getattr(self, side)
            if who is not None and who == self.voice:
                return side
        return None

    def kind(self) -> str:
        faces = [getattr(self, s) for s in ("left", "right", "centre") if getattr(self, s) is not None]
        if len(faces) == 1:
            return "single" if self.speaker_side() else "reaction"
        if any(f[0] == "LISTENER" for f in faces):
            return "beside listener"
        return "two talking"


FILM = (
    Shot(None, None, ("ANNA", 0), ("ANNA", 0)),
    Shot(None, None, ("BEN", 0), ("BEN", 0)),
    Shot(("ANNA", 1), ("BEN", 2), None, ("ANNA", 1)),
    Shot(None, None, ("CARL", 0), ("CARL", 0)),
    Shot(None, None, ("LISTENER", 0), ("NARRATOR", 0)),
    Shot(("BEN", 0), ("CARL", 1), None, ("CARL", 1)),
    Shot(None, None, ("DORA", 0), ("DORA", 0)),
    Shot(("ANNA", 0), ("DORA", 1), None, ("DORA", 1)),
    Shot(("BEN", 1), ("LISTENER", 0), None, ("BEN", 1)),
    Shot(None, None, ("LISTENER", 0), ("STRANGER", 0)),
    Shot(("CARL", 0), ("ANNA", 2), None, ("ANNA", 2)),
    Shot(("DORA", 0), ("BEN", 2), None, ("BEN", 2)),
    Shot(None, None, ("CARL", 2), ("CARL", 2)),
    Shot(("DORA", 2), ("CARL", 1), None, ("DORA", 2)),
)
GREYS = (40, 150, 90, 200, 60, 170, 110, 230, 30, 130, 190, 80, 220, 100)


def face(who: tuple[str, int], cast: str = "a") -> np.ndarray:
    """(N, 256, 256, 3) frames of ``who`` = (person, line): that line's frames, or the listener's quiet stretch."""
    name, line = who
    if name == "LISTENER":
        return listener(LISTENER, N)
    frames = seed_frames(CASTS[cast][name])[line * N : (line + 1) * N]
    if len(frames) < N:  # a short clip's last line: held on its last frame
        frames = np.concatenate([frames, np.repeat(frames[-1:], N - len(frames), 0)])
    return frames


def voice(who: tuple[str, int], cast: str = "a") -> np.ndarray:
    """N frames of ``who``'s line as heard (float32 at SR)."""
    name, line = who
    a = seed_audio(CASTS[cast][name])[round(line * N / FPS * SR) :]
    want = round(N / FPS * SR)
    return np.pad(a, (0, max(0, want - len(a))))[:want].astype(np.float32)


def shot_frames(shot: Shot, grey: int, cast: str = "a") -> np.ndarray:
    out = np.full((N, *SIZE, 3), grey, np.uint8)
    for side, x in (("left", LEFT), ("right", RIGHT), ("centre", (SIZE[1] - 256) // 2)):
        who = getattr(shot, side)
        if who is not None:
            out[:, TOP : TOP + 256, x : x + 256] = face(who, cast)
    return out


def film_audio(shots: tuple[Shot, ...] = FILM, cast: str = "a") -> np.ndarray:
    """The film's sound: the shots' lines in order (float32 at SR)."""
    return np.concatenate([voice(s.voice, cast) for s in shots])


def write_film(
    path: Path, shots: tuple[Shot, ...] = FILM, cast: str = "a", picks: tuple[int, ...] | None = None
) -> Path:
    """The film of ``shots`` (played by ``cast``) encoded at ``path`` (H.264 + AAC); ``picks``: only these shots
    of ``shots``, each on its own background as in the whole film."""
    picks = tuple(range(len(shots))) if picks is None else picks
    frames = np.concatenate([shot_frames(shots[i], GREYS[i % len(GREYS)], cast) for i in picks])
    shots = tuple(shots[i] for i in picks)
    audio = film_audio(shots, cast)
    return encode(path, frames, audio)


def side_of(box: list[int] | tuple[int, ...], shot: Shot) -> str:
    """Which face of ``shot`` a display-pixel box lies over."""
    if shot.centre is not None:
        return "centre"
    return "left" if (box[0] + box[2]) / 2 < SIZE[1] / 2 else "right"


__all__ = [
    "CASTS",
    "FILM",
    "N",
    "PEOPLE",
    "Shot",
    "face",
    "film_audio",
    "side_of",
    "voice",
    "write_film",
]
