"""The dubbed film as an OpenTimelineIO timeline for the edit suite (DaVinci Resolve, Premiere via OTIO).

Three tracks at the film's exact frame rate: `source` (each shot a clip of the source film at its own
frame range), `dubbed` (each shot's lossless per-shot intermediate, or the shot's range of the delivered
file when the workspace is not kept), both at the shot's source timecode, and `dub audio` (the mix or
dialogue track the film was delivered with). Each clip's metadata names the shot, its result key and
whether it was dubbed. Also, through the OTIO plug-in adapters `otio-cmx3600-adapter` and `otio-fcp-adapter`
(`write_extra_timelines`): a CMX 3600 EDL of the `dubbed` track (an EDL holds one video track, and the
adapter writes no audio events) and a Final Cut Pro 7 XML of all three tracks.

Timeline records only: no media is read; the caller passes paths and frame ranges.
"""

from __future__ import annotations

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


def _media(path: str | Path, frames: int, rate: float) -> otio.schema.ExternalReference:
    return otio.schema.ExternalReference(
        target_url=Path(path).resolve().as_uri(), available_range=_range(0, frames, rate)
    )


def film_timeline(
    name: str,
    fps: Fraction,
    film: str | Path,
    frame_count: int,
    shots: Sequence[Mapping[str, Any]],
    audio: str | Path,
    delivered: str | Path | None = None,
) -> otio.schema.Timeline:
    """The timeline. `shots`: index, start_frame, end_frame, key, dubbed, reason and `path` (the shot's
    intermediate, or None to cut the shot's range from `delivered`)."""
    rate = float(fps)
    source = otio.schema.Track(name="source", kind=otio.schema.TrackKind.Video)
    dubbed = otio.schema.Track(name="dubbed", kind=otio.schema.TrackKind.Video)
    for shot in shots:
        start, end = int(shot["start_frame"]), int(shot["end_frame"])
        label = f"shot {shot['index']:04d}"
        meta = {"dubflow": {k: shot.get(k) for k in ("index", "key", "dubbed", "reason")}}
        source.append(
            otio.schema.Clip(
                name=label,
                media_reference=_media(film, frame_count, rate),
                source_range=_range(start, end - start, rate),
                metadata=meta,
            )  # fmt: skip
        )
        if shot.get("path"):
            media, first = _media(shot["path"], end - start, rate), 0
        elif delivered is not None:
            media, first = _media(delivered, frame_count, rate), start
        else:
            raise ValueError(f"{label}: no intermediate and no delivered file to cut it from")
        dubbed.append(
            otio.schema.Clip(
                name=f"{label} dubbed",
                media_reference=media,
                source_range=_range(first, end - start, rate),
                metadata=meta,
            )  # fmt: skip
        )
    sound = otio.schema.Track(name="dub audio", kind=otio.schema.TrackKind.Audio)
    sound.append(
        otio.schema.Clip(
            name=Path(audio).name,
            media_reference=_media(audio, frame_count, rate),
            source_range=_range(0, frame_count, rate),
        )  # fmt: skip
    )
    timeline = otio.schema.Timeline(name=name, global_start_time=otio.opentime.RationalTime(0, rate))
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
