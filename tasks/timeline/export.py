"""The dubbed film as an OpenTimelineIO timeline for the edit suite (DaVinci Resolve, Premiere via OTIO).

Three tracks at the film's exact frame rate, starting at the film's own start timecode: `source` (each
shot a clip of the source film at its own frame range), `dubbed` (each shot's lossless per-shot
intermediate, or the shot's range of the delivered file, which carries the same start timecode, when the
workspace is not kept), and `dub audio` (the 48 kHz / 24-bit WAV for audio post next to the timeline).
Every clip names frames through its own media's timecode, so a conform reads exactly those frames: the
film and the delivered file at the film's timecode, a shot intermediate (which has no timecode track)
from 00:00:00:00 (tests/test_conform.py reads every clip back with ffmpeg). Reels are named after their files in at most 8 characters (the
film, `<stem>DUB` for the delivered file, `D<index>` for a shot's intermediate), clips after their
shots (`SH0001`), so a CMX conform finds every event by reel and timecode. Each clip's metadata names the shot, its result key and
whether it was dubbed. Also, through the OTIO plug-in adapters `otio-cmx3600-adapter` and `otio-fcp-adapter`
(`write_extra_timelines`): a CMX 3600 EDL of the `dubbed` track (an EDL holds one video track, and the
adapter writes no audio events) and a Final Cut Pro 7 XML of all three tracks.

Timeline records only: no media is read; the caller passes paths and frame ranges.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import opentimelineio as otio

from tasks.files import atomic_path


def _range(start: int, frames: int, rate: float) -> otio.opentime.TimeRange:
    return otio.opentime.TimeRange(
        otio.opentime.RationalTime(start, rate), otio.opentime.RationalTime(frames, rate)
    )


def _media(path: str | Path, frames: int, rate: float, first: int = 0) -> otio.schema.ExternalReference:
    """A file whose frame 0 is at timecode frame `first`."""
    return otio.schema.ExternalReference(
        target_url=Path(path).resolve().as_uri(), available_range=_range(first, frames, rate)
    )


def start_frame(timecode: str | None, fps: Fraction) -> int:
    """The film's start timecode (HH:MM:SS:FF, ';' drop-frame) as a frame number at `fps` (0 when None)."""
    if not timecode:
        return 0
    return round(otio.opentime.from_timecode(timecode.replace(".", ":"), float(fps)).value)


def reel_name(stem: str, suffix: str = "", length: int = 8) -> str:
    """A CMX 3600 reel name: upper-case letters and digits of `stem`, then `suffix`, at most `length`."""
    base = re.sub(r"[^A-Z0-9]", "", stem.upper()) or "REEL"
    return base[: length - len(suffix)] + suffix


def shot_name(index: int) -> str:
    """A shot's clip name, 8 characters at most (CMX clip names and Resolve's reel column)."""
    return f"SH{index:04d}" if index < 10_000 else f"S{index:07d}"[:8]


def _clip(name: str, media, start: int, frames: int, rate: float, reel: str, meta: dict) -> otio.schema.Clip:
    meta = {**meta, "cmx_3600": {"reel": reel}}
    return otio.schema.Clip(
        name=name, media_reference=media, source_range=_range(start, frames, rate), metadata=meta
    )


def film_timeline(
    name: str,
    fps: Fraction,
    film: str | Path,
    frame_count: int,
    shots: Sequence[Mapping[str, Any]],
    audio: str | Path,
    delivered: str | Path | None = None,
    timecode: str | None = None,
) -> otio.schema.Timeline:
    """The timeline. `shots`: index, start_frame, end_frame, key, dubbed, reason and `path` (the shot's
    intermediate, or None to cut the shot's range from `delivered`). `timecode`: the film's start
    timecode; source ranges are in each media's own timecode (the film's and the delivered file's start at
    `timecode`, a shot intermediate's at 0), reels are named after their files (<= 8 characters), clips
    after their shots (`shot_name`)."""
    rate = float(fps)
    tc0 = start_frame(timecode, fps)
    film_reel = reel_name(Path(film).stem)
    dub_reel = reel_name(Path(delivered).stem if delivered else Path(film).stem, "DUB")
    source = otio.schema.Track(name="source", kind=otio.schema.TrackKind.Video)
    dubbed = otio.schema.Track(name="dubbed", kind=otio.schema.TrackKind.Video)
    for shot in shots:
        start, end = int(shot["start_frame"]), int(shot["end_frame"])
        label = shot_name(int(shot["index"]))
        meta = {"dubflow": {k: shot.get(k) for k in ("index", "key", "dubbed", "reason")}}
        film_media = _media(film, frame_count, rate, tc0)
        source.append(_clip(label, film_media, tc0 + start, end - start, rate, film_reel, meta))
        if shot.get("path"):  # the shot's own intermediate (no timecode track: it starts at 00:00:00:00)
            media, reel, first = (
                _media(shot["path"], end - start, rate, 0),
                f"D{int(shot['index']):05d}"[:8],
                0,
            )
        elif delivered is not None:  # the delivered film carries the film's start timecode
            media, reel, first = _media(delivered, frame_count, rate, tc0), dub_reel, tc0 + start
        else:
            raise ValueError(f"{label}: no intermediate and no delivered file to cut it from")
        dubbed.append(_clip(f"{label}D"[:8], media, first, end - start, rate, reel, meta))
    sound = otio.schema.Track(name="dub audio", kind=otio.schema.TrackKind.Audio)
    sound.append(
        _clip(Path(audio).name, _media(audio, frame_count, rate, tc0), tc0, frame_count, rate,
              reel_name(Path(audio).stem, "A"), {})
    )  # fmt: skip
    timeline = otio.schema.Timeline(name=name, global_start_time=otio.opentime.RationalTime(tc0, rate))
    timeline.tracks.extend([source, dubbed, sound])
    return timeline


def write_timeline(path: str | Path, timeline: otio.schema.Timeline, adapter: str = "otio_json") -> Path:
    """Write `timeline` with an OTIO adapter (default `.otio` JSON), atomically (`tasks.files.atomic_path`)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        otio.adapters.write_to_file(timeline, str(tmp), adapter_name=adapter)
    return path


# option name -> (OTIO adapter, file suffix, the PyPI package that provides the adapter)
EXTRA_FORMATS = {
    "edl": ("cmx_3600", ".edl", "otio-cmx3600-adapter"),
    "fcp_xml": ("fcp_xml", ".xml", "otio-fcp-adapter"),
}


def edl_timeline(timeline: otio.schema.Timeline) -> otio.schema.Timeline:
    """The timeline an EDL can hold: the `dubbed` track alone (CMX 3600 has a single video track)."""
    out = otio.schema.Timeline(name=timeline.name, global_start_time=timeline.global_start_time)
    out.tracks.extend([t.deepcopy() for t in timeline.tracks if t.name == "dubbed"])
    return out


def write_extra_timelines(
    stem: str | Path, timeline: otio.schema.Timeline, formats: Sequence[str]
) -> list[Path]:
    """`<stem>.edl` / `<stem>.xml` for the `formats` named (keys of `EXTRA_FORMATS`) of a `film_timeline`."""
    have = set(otio.adapters.available_adapter_names())
    out = []
    for name in formats:
        adapter, suffix, package = EXTRA_FORMATS[name]
        if adapter not in have:
            raise RuntimeError(
                f"timeline.{name}: the OTIO adapter {adapter!r} is missing (pip install {package})"
            )
        cut = edl_timeline(timeline) if name == "edl" else timeline
        out.append(write_timeline(Path(stem).with_suffix(suffix), cut, adapter))
    return out
