"""A shot's chunk checkpoints (`<shot>.chunks/`): which chunks are done, verified, and the state to resume.

Per chunk ``k`` the folder holds ``chunk_kkkk.mkv`` (the FFV1 segment; absent for a chunk with no
output frames), ``state_kkkk.safetensors`` (the backend's state after it, `tasks.render.checkpoint_state`;
only the newest is kept) and, written last, ``chunk_kkkk.done``: a JSON marker with the segment's
and the state's records (size, SHA-256, frames), naming its shot folder and chunk count (a marker
copied from another shot's folder is not trusted). Resuming walks the markers in order and stops at
the first chunk that is not verifiably done (marker missing or unreadable, segment or state not
matching its record); if the state needed to continue from there is gone or bad, the shot starts
over. Each such finding is one log line naming the file; nothing here raises for a damaged
checkpoint, and nothing is ever unpickled. Files only: no backend, no Prefect.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.media.intermediates import clean_temps, read_marker, record_written, verify, write_marker
from tasks.render.checkpoint_state import StateError, load_state, save_state

log = logging.getLogger(__name__)

MARKER_FORMAT = 2  # 2: markers name their shot folder and chunk count (bound to their place)


@dataclass(frozen=True)
class ChunkCheckpoints:
    """The checkpoint folder of one shot with `n_chunks` chunks."""

    folder: Path
    n_chunks: int

    @property
    def owner(self) -> str:
        """The shot folder's name (index + shot key): what a marker must name to be trusted here."""
        return self.folder.resolve().parent.name

    def segment(self, k: int) -> Path:
        return self.folder / f"chunk_{k:04d}.mkv"

    def state_path(self, k: int) -> Path:
        return self.folder / f"state_{k:04d}.safetensors"

    def marker(self, k: int) -> Path:
        return self.folder / f"chunk_{k:04d}.done"

    def resume(self) -> tuple[int, Any | None]:
        """(first chunk to compute, the state to continue with); (0, None) starts the shot over."""
        self.folder.mkdir(parents=True, exist_ok=True)
        clean_temps(self.folder, "*")  # half-written segments and states of a crashed attempt
        first, last, problem = 0, None, None
        while first < self.n_chunks:
            body = read_marker(self.marker(first))  # unreadable: logged there
            if body is None:
                break
            problem = self._problem(first, body)
            if problem is not None:
                break
            first, last = first + 1, body
        self._drop_from(first)
        state = None
        if first > 0 and last is not None and last.get("state") is not None:
            try:
                state = load_state(self.state_path(first - 1), last["state"])
            except StateError as exc:
                problem = (
                    (None, f"{exc}; the shot starts over")
                    if problem is None
                    else (problem[0], f"{problem[1]}; the state before it is not kept: the shot starts over")
                )
                first = 0
                self._drop_from(0)
        if problem is not None:
            where = "" if problem[0] is None else f"{problem[0]}: "
            log.warning("%s%s (recomputing from chunk %d)", where, problem[1], first + 1)
        return first, state

    def _problem(self, k: int, body: dict[str, Any]) -> tuple[Path, str] | None:
        """(file, why) when chunk k's marker does not vouch for a good segment, else None."""
        if body.get("format") != MARKER_FORMAT or body.get("chunk") != k or "segment" not in body:
            return self.marker(k), "not a chunk marker of this format"
        if body.get("shot") != self.owner or body.get("n_chunks") != self.n_chunks:
            return self.marker(k), (
                f"a chunk marker of {body.get('shot')!r} ({body.get('n_chunks')} chunks), not of "
                f"{self.owner!r} ({self.n_chunks} chunks): copied from elsewhere"
            )
        if body["segment"] is not None:
            why = verify(self.segment(k), body["segment"])
            if why is not None:
                return self.segment(k), why
        return None

    def _drop_from(self, k: int) -> None:
        """Remove chunks k.. (markers first, so a crash in between leaves nothing marked done)."""
        for j in range(k, self.n_chunks):
            self.marker(j).unlink(missing_ok=True)
        for j in range(k, self.n_chunks):
            self.segment(j).unlink(missing_ok=True)
        for j in range(max(0, k - 1), self.n_chunks):
            if j != k - 1:
                self.state_path(j).unlink(missing_ok=True)

    def commit(self, k: int, frames: int, state: Any | None) -> None:
        """Chunk k's segment (already written, `frames` frames) and state are final: verify, mark done.

        The previous chunk's state is removed afterwards: only the newest is ever resumed from.
        """
        segment = record_written(self.segment(k), frames) if frames else None
        state_record = None if state is None else save_state(self.state_path(k), state)
        write_marker(
            self.marker(k),
            {
                "format": MARKER_FORMAT, "shot": self.owner, "n_chunks": self.n_chunks, "chunk": k,
                "segment": segment, "state": state_record,
            },
        )  # fmt: skip
        if k > 0:
            self.state_path(k - 1).unlink(missing_ok=True)
