"""Verified intermediates: what a file was when it was written, and whether it still is.

Every chunk segment and shot intermediate is checked once when it is written (its video packet
count must be the frames that were put in) and described by a record, ``{"file", "size",
"sha256", "frames"}``, that goes into its done marker. Reusing it later costs a size comparison
and one SHA-256 pass (`verify`), no decode: a flipped byte, a truncation or a swapped file is a
mismatch, and a mismatch means "not done" (the caller recomputes and logs one line naming the
file). `crc_errors` is the deeper check ffmpeg itself offers for FFV1 (slice CRCs, a full decode).
Markers are small JSON files written atomically; an unreadable marker reads as None, never as an
error that would stick on every re-run. No Prefect, no workspace layout here: files only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from tasks.errors import DecodeError
from tasks.files import atomic_write_bytes
from tasks.media import ffmpeg

log = logging.getLogger(__name__)

_CHUNK = 4 << 20


class IntermediateError(DecodeError):
    """An intermediate was written wrong (e.g. fewer frames than were encoded)."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes (streamed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def count_packets(path: str | os.PathLike[str]) -> int:
    """Video packets of the first video stream (stream copy, no decode: one FFV1 packet = one frame)."""
    lines = ffmpeg.read_lines(
        ["-v", "error", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "framecrc", "-"],
        path=path,
        what="counting frames",
    )
    return sum(1 for line in lines if line and not line.startswith("#"))


def crc_errors(path: str | os.PathLike[str]) -> list[str]:
    """FFV1 slice-CRC (and other decode) errors of a full decode with `-err_detect crccheck` (empty: clean)."""
    _, err = ffmpeg.run(
        ["-v", "error", "-err_detect", "crccheck", "-i", str(path), "-map", "0:v:0", "-f", "null", "-"],
        path=path,
        what="checking CRCs",
        check=False,
    )
    return [line.strip() for line in err.splitlines() if line.strip()]


def record_written(path: str | os.PathLike[str], frames: int) -> dict[str, Any]:
    """Check a just-written intermediate holds `frames` frames; its record for the done marker."""
    p = Path(path)
    got = count_packets(p)
    if got != frames:
        raise IntermediateError(p, f"wrote {got} frames, expected {frames}")
    return {"file": p.name, "size": p.stat().st_size, "sha256": sha256_file(p), "frames": frames}


def verify(path: str | os.PathLike[str], record: Any) -> str | None:
    """Why `path` is not the file `record` describes (None: it is). Size first, then the hash."""
    p = Path(path)
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return "no integrity record"
    try:
        size = p.stat().st_size
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if size != record.get("size"):
        return f"{size} bytes, {record.get('size')} recorded (truncated or replaced)"
    try:
        digest = sha256_file(p)
    except OSError as exc:
        return f"cannot read ({exc.strerror or exc})"
    if digest != record["sha256"]:
        return "content hash differs from the recorded one (corrupt)"
    return None


def write_marker(path: str | os.PathLike[str], body: dict[str, Any]) -> None:
    """Write a done marker (JSON) atomically; readers see nothing or the whole marker."""
    atomic_write_bytes(path, json.dumps(body, indent=1, sort_keys=True).encode())


def read_marker(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A marker's JSON object, or None when it is missing; an unreadable one is logged and reads as None."""
    p = Path(path)
    try:
        body = json.loads(p.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable marker (%s): treated as not done", p, exc)
        return None
    if not isinstance(body, dict):
        log.warning("%s: marker is not a JSON object: treated as not done", p)
        return None
    return body


def clean_temps(folder: str | os.PathLike[str], stem: str) -> int:
    """Remove leftover temp files of `<stem>.*` in `folder` (from `tasks.files.AtomicFile`, after a crash); count."""
    n = 0
    for tmp in Path(folder).glob(f".{stem}.*.tmp*"):
        try:
            tmp.unlink()
            n += 1
        except OSError as exc:
            log.warning("%s: cannot remove a leftover temp file (%s)", tmp, exc.strerror or exc)
    return n
