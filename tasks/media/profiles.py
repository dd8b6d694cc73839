"""Delivery profiles: what the final encode writes (`encode.profile`).

* ``web``: `encode.codec` (libx264, libx265, ...) at `encode.crf` / `encode.preset` in `encode.pix_fmt`,
  `encode.audio_codec` at `encode.audio_bitrate`: a viewing copy, within the codec's normal error.
* ``mezzanine``: ProRes 422 HQ (``prores_ks`` profile 3) or DNxHR HQX (`encode.mezzanine`), 10-bit 4:2:2,
  24-bit PCM audio, in .mov or .mkv: what an edit suite ingests.
* ``lossless``: FFV1 (level 3, intra, slice CRCs) in the intermediates' pixel format (the source's own
  when planar Y'CbCr, `tasks.media.native`), 24-bit PCM, in .mkv: every pixel the dub did not change is
  the source's decoded value bit for bit.
Pure: argument lists and checks, no ffmpeg run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tasks.config.media import EncodeConfig
from tasks.errors import MediaError, OutputError
from tasks.media.native import intermediate_pix_fmt

_MEZZANINE = {
    "prores_hq": ["-c:v", "prores_ks", "-profile:v", "3", "-vendor", "apl0"],
    "dnxhr_hqx": ["-c:v", "dnxhd", "-profile:v", "dnxhr_hqx"],
}
CONTAINERS = {
    "web": (".mp4", ".m4v", ".mov", ".mkv", ".webm"),
    "mezzanine": (".mov", ".mkv"),
    "lossless": (".mkv",),
}
_CRF = ("libx264", "libx265", "libsvtav1", "libaom-av1", "libvpx-vp9")
_PRESET = ("libx264", "libx265", "libsvtav1")


@dataclass(frozen=True)
class Delivery:
    """The final encode's video and audio codec arguments and its pixel format."""

    pix_fmt: str
    video: list[str]  # codec arguments, -pix_fmt included
    audio: list[str]  # codec arguments of the dubbed stream (output stream a:0)


def delivery(cfg: EncodeConfig, source_pix_fmt: str) -> Delivery:
    """The encode of `cfg.profile` for a film decoded as `source_pix_fmt`."""
    if cfg.profile == "lossless":
        pix = intermediate_pix_fmt(source_pix_fmt)
        video = ["-c:v", "ffv1", "-level", "3", "-g", "1", "-slicecrc", "1", "-pix_fmt", pix]
        return Delivery(pix, video, ["-c:a:0", "pcm_s24le"])
    if cfg.profile == "mezzanine":
        pix = "yuv422p10le"
        return Delivery(pix, [*_MEZZANINE[cfg.mezzanine], "-pix_fmt", pix], ["-c:a:0", "pcm_s24le"])
    video = ["-c:v", cfg.codec, "-pix_fmt", cfg.pix_fmt]
    if cfg.codec in _CRF:
        video += ["-crf", str(cfg.crf)]
    if cfg.codec in _PRESET:
        video += ["-preset", str(cfg.preset)]
    return Delivery(cfg.pix_fmt, video, ["-c:a:0", cfg.audio_codec, "-b:a:0", cfg.audio_bitrate])


def check_container(cfg: EncodeConfig, out: str | Path) -> None:
    """The output's extension must hold the profile's streams (OutputError naming the file)."""
    suffix = Path(out).suffix.lower()
    allowed = CONTAINERS[cfg.profile]
    if suffix not in allowed:
        raise OutputError(
            out, f"encode.profile={cfg.profile} is written as {', '.join(allowed)}, not {suffix or '(none)'}"
        )


def check_size(cfg: EncodeConfig, path: str | Path, width: int, height: int) -> None:
    """DNxHR encodes frames of at least 256x120 only (MediaError naming the film, before any work)."""
    if cfg.profile == "mezzanine" and cfg.mezzanine == "dnxhr_hqx" and (width < 256 or height < 120):
        raise MediaError(
            path, f"{width}x{height} is below DNxHR's 256x120 minimum; use --set encode.mezzanine=prores_hq"
        )
