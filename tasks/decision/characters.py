"""Characters across a film: face-track embeddings -> character ids, linked only by a clear per-sample vote.

Holds `TrackFaces` (one face track's identity samples: 128-D embeddings of a few of its faces, with the
shot and frames it spans), `sample_votes` (each sample of a track votes for the character holding its
nearest sample, if that one is closer than ``link_distance``; near-ties vote for both) and `link_characters`, a greedy pass over
the tracks in film order: a track joins the character that gets at least ``link_votes`` of its samples'
votes and is not on screen at the same time in the same shot; otherwise it starts a new character
(automatic ids c1, c2, ... in order of first appearance).  Named references (embeddings of a cast's
stills) are characters from the start.  A weak or split vote never merges two characters: some tracks of
one person may stay apart across very different views, which is the safe error.
Pure numpy: must not decode media nor load models (`tasks.perception.face_id` makes the embeddings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TIE = 0.05  # embedding distances this close to a sample's nearest one count as equally near


@dataclass(frozen=True)
class TrackFaces:
    """The identity samples of one face track."""

    shot: int
    track: int
    start_frame: int  # shot-relative, exclusive end
    end_frame: int
    embeddings: np.ndarray  # (n, 128) float; n may be 0 (no face large enough to embed)


@dataclass
class Character:
    """One character: its id, its name (None until a cast or the plan names it) and what it holds."""

    id: str
    name: str | None
    samples: list[np.ndarray] = field(default_factory=list)  # (k, 128) blocks: references and linked tracks
    tracks: list[tuple[int, int]] = field(default_factory=list)  # (shot, track)
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (shot, start, end) on screen

    def members(self) -> np.ndarray:
        return np.concatenate(self.samples) if self.samples else np.zeros((0, 128))

    def on_screen(self, shot: int, start: int, end: int) -> bool:
        """Whether one of its tracks is on screen in ``shot`` during [start, end)."""
        return any(s == shot and a < end and start < b for s, a, b in self.spans)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "tracks": [list(t) for t in self.tracks]}


def sample_votes(
    samples: np.ndarray, characters: Sequence[Character], distance: float, tie: float = TIE
) -> np.ndarray:
    """(len(characters),) share of ``samples`` voting for each character: a sample votes for the character
    holding its nearest sample if that one is closer than ``distance`` (and for every character within
    ``tie`` of that nearest one, so one person split over two characters does not split the vote)."""
    out = np.zeros(len(characters))
    if len(samples) == 0 or not characters:
        return out
    d = np.full((len(characters), len(samples)), np.inf)
    for k, ch in enumerate(characters):
        members = ch.members()
        if len(members):
            d[k] = np.linalg.norm(samples[:, None, :] - members[None, :, :], axis=2).min(axis=1)
    nearest = d.min(axis=0)  # (n,)
    votes = (d < distance) & (d <= nearest[None, :] + tie)
    return votes.sum(axis=1) / len(samples)


def link_characters(
    tracks: Sequence[TrackFaces],
    references: Mapping[str, np.ndarray],
    *,
    link_distance: float,
    link_votes: float,
) -> list[Character]:
    """Characters of a film's tracks (see the module docstring); ``references``: {NAME: (k, 128)}."""
    chars = [Character(name, name, [np.asarray(e, np.float64)]) for name, e in references.items()]
    auto = 0
    for tr in sorted(tracks, key=lambda t: (t.shot, t.start_frame, t.track)):
        emb = np.asarray(tr.embeddings, np.float64).reshape(-1, 128)
        free = [c for c in chars if not c.on_screen(tr.shot, tr.start_frame, tr.end_frame)]
        votes = sample_votes(emb, free, link_distance)
        k = int(np.argmax(votes)) if len(votes) else -1  # ties: the first (references, then the oldest)
        if k >= 0 and votes[k] >= link_votes:
            ch = free[k]
        else:
            auto += 1
            while any(c.id == f"c{auto}" for c in chars):
                auto += 1
            ch = Character(f"c{auto}", None)
            chars.append(ch)
        if len(emb):
            ch.samples.append(emb)
        ch.tracks.append((tr.shot, tr.track))
        ch.spans.append((tr.shot, tr.start_frame, tr.end_frame))
    return [c for c in chars if c.tracks or c.name is not None]


def display_name(character_id: str, names: Mapping[str, Any]) -> str:
    """A character's name: a rename from the plan (`cast.names`) wins over the id (a cast name or c<n>)."""
    return str(names.get(character_id) or character_id)


def shot_characters(characters: Sequence[Character], names: Mapping[str, Any]) -> dict[int, dict[str, str]]:
    """{shot: {track id (str): character name}} of linked characters."""
    out: dict[int, dict[str, str]] = {}
    for ch in characters:
        for shot, track in ch.tracks:
            out.setdefault(shot, {})[str(track)] = display_name(ch.id, names)
    return out


__all__ = [
    "Character",
    "TrackFaces",
    "display_name",
    "link_characters",
    "sample_votes",
    "shot_characters",
]
