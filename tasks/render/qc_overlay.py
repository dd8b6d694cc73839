"""Who-speaks overlays for the QC contact sheet: every face track, the chosen speaker, the speech timeline.

Holds `SpeakerOverlay`, built from a shot's face analysis (`tasks.perception.face_analysis.ShotFaces`) and its dubbed
regions (`tasks.decision.record.DubRegion`): `annotate` draws on a source frame (display orientation, display
pixels) every track visible at that frame (grey; still pictures red) with its character's name when
known, the dubbed speaker's face (both faces of a two-speaker turn) in green with its track id and score,
and the dubbed crop box, each face labelled with its audio-visual agreement with the speech ("av +0.42")
and its learned speaking score ("asd +1.9", Light-ASD) where measured; `timeline` draws a strip under the sheet: the source's speech probability, each track's
mouth activity and agreement, and who is dubbed when.
Pure drawing on arrays; must not decode or decide anything.
"""

from __future__ import annotations

import cv2
import numpy as np

from tasks.decision.record import DubRegion, ShotDecision
from tasks.perception.face_analysis import ShotFaces
from tasks.render.qc import outlined_text, wrap_text

GREY, RED, GREEN, YELLOW = (170, 170, 170), (230, 60, 60), (60, 220, 90), (250, 210, 60)
LEGEND = (
    "speech (grey), mouth activity per track (lines), agreement with the speech (dots), dubbed turns (bars)"
)
TRACK_COLOURS = [(90, 160, 255), (255, 150, 60), (200, 90, 255), (60, 220, 220), (255, 90, 160)]


def _text(
    img: np.ndarray, text: str, org: tuple[int, int], colour: tuple[int, int, int], scale: float
) -> None:
    outlined_text(img, text, org, colour, scale)


def _label_origin(shape: tuple[int, ...], box: list[int], label: str, scale: float) -> tuple[int, int]:
    """Where a face's label goes: above its box, or under it when the box touches the frame's top band (the
    contact sheet's timecode lives there), moved left so it ends inside the frame (never over the next cell)."""
    (w, h), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
    top_band = round(34 * scale / 0.45)  # the cell label's height (`tasks.render.qc._put_label`) and a margin
    y = box[1] - 4
    if y - h < top_band:
        y = min(shape[0] - 3, box[3] + h + 4)
    x = max(1, min(box[0], shape[1] - w - 2))
    return x, y


class SpeakerOverlay:
    """Draws a shot's tracks, dubbed speakers and speech timeline (see the module docstring)."""

    def __init__(
        self,
        faces: ShotFaces,
        regions: list[DubRegion],
        names: dict[str, str] | None = None,
        scale: float = 1.0,
    ) -> None:
        self.faces = faces
        self.regions = regions
        self.names = names or {}  # track id (str) -> character name
        self.scale = (
            scale  # pixels of the frames drawn on per display pixel of the film (a downscaled decode)
        )

    def region_at(self, t: int) -> DubRegion | None:
        return next((r for r in self.regions if r.start_frame <= t < r.end_frame), None)

    def annotate(self, t: int, frame: np.ndarray) -> np.ndarray:
        """A copy of display frame ``t`` with the tracks (boxes interpolated between detections) drawn."""
        out = np.ascontiguousarray(frame).copy()
        thick = max(1, round(out.shape[0] / 240))
        scale = max(0.4, out.shape[0] / 500)
        region = self.region_at(t)
        for tr in self.faces.tracks:
            if not tr.start_frame <= t < tr.end_frame:
                continue
            b = np.array(tr.boxes, np.float64)
            box = [int(round(np.interp(t, tr.frames, b[:, k]) * self.scale)) for k in range(4)]
            chosen = region is not None and (
                region.speaker == tr.id or any(p["track"] == tr.id for p in region.people)
            )
            colour = GREEN if chosen else RED if tr.still else GREY
            cv2.rectangle(out, (box[0], box[1]), (box[2], box[3]), colour, thick * (2 if chosen else 1))
            label = (
                f"{tr.id}"
                + (f" {self.names[str(tr.id)]}" if str(tr.id) in self.names else "")
                + (" still" if tr.still else "")
                + (f" speaks {region.score:.2f}" if chosen else "")
                + self._agreement_label(tr.id, t)
            )
            _text(out, label, _label_origin(out.shape, box, label, scale), colour, scale)
        if region is not None:
            x0, y0, x1, y1 = (round(v * self.scale) for v in region.plan.box_at(t - region.start_frame))
            cv2.rectangle(out, (x0, y0), (x1 - 1, y1 - 1), YELLOW, thick)
        return out

    def _agreement_label(self, track: int, t: int) -> str:
        """ " av +0.42 asd +1.9": the track's audio-visual agreement and learned speaking score at frame t
        (each left out where there is none)."""
        out = ""
        for rows, name, fmt in ((self.faces.agreement, "av", "+.2f"), (self.faces.asd, "asd", "+.1f")):
            if track >= len(rows) or not rows[track]:
                continue
            v = rows[track][min(len(rows[track]) - 1, t // max(1, self.faces.step_frames))]
            out += "" if v is None else f" {name} {v:{fmt}}"
        return out

    def timeline(self, width: int) -> np.ndarray:
        """(h, width, 3) strip: speech probability (white), mouth activity per track, dubbed turns below."""
        faces = self.faces
        n_steps = len(faces.speech)
        h_plot, h_bar = 60, 14
        img = np.full((h_plot + h_bar + 20, width, 3), 24, np.uint8)
        if n_steps == 0:
            return img
        xs = np.linspace(0, width - 1, n_steps).astype(int)
        speech = np.array(faces.speech)
        for x0, x1, p in zip(xs[:-1], xs[1:], speech[:-1], strict=True):
            top = int(h_plot * (1 - p))
            cv2.rectangle(img, (x0, top), (x1, h_plot), (70, 70, 70), -1)
        peak = max([v for row in faces.activity for v in row if v is not None] or [1e-6])
        for k, row in enumerate(faces.activity):
            colour = TRACK_COLOURS[k % len(TRACK_COLOURS)]
            pts = [
                (int(x), int(h_plot * (1 - min(1.0, v / peak))))
                for x, v in zip(xs, row, strict=True)
                if v is not None
            ]
            if len(pts) > 1:
                cv2.polylines(img, [np.array(pts, np.int32)], False, colour, 1, cv2.LINE_AA)
        for k, row in enumerate(faces.agreement):  # agreement -1..1 as dots (0 at mid height)
            colour = TRACK_COLOURS[k % len(TRACK_COLOURS)]
            for x, v in zip(xs, row, strict=False):
                if v is not None:
                    cv2.circle(img, (int(x), int(h_plot * (1 - (v + 1) / 2))), 2, colour, -1)
        n = max(1, faces.num_frames)
        for r in self.regions:
            a, b = int(r.start_frame / n * (width - 1)), int(r.end_frame / n * (width - 1))
            colour = TRACK_COLOURS[(r.speaker or 0) % len(TRACK_COLOURS)] if r.speaker is not None else GREY
            cv2.rectangle(img, (a, h_plot + 2), (b, h_plot + h_bar), colour, -1)
            who = [p["track"] for p in r.people] or [r.speaker]
            label = "+".join(f"{k}" + (f" {self.names[str(k)]}" if str(k) in self.names else "") for k in who)
            if (
                cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.35, 1)[0][0] <= b - a - 4
            ):  # inside its turn
                _text(img, label, (a + 2, h_plot + h_bar - 2), (255, 255, 255), 0.35)
        legend = wrap_text(LEGEND, width - 8, 0.38)  # wrapped: no word runs off the sheet or over another
        strip = np.full((len(legend) * 14 + 6, width, 3), 24, np.uint8)
        for k, line in enumerate(legend):
            _text(strip, line, (4, 12 + 14 * k), GREY, 0.38)
        return np.concatenate([img[: h_plot + h_bar + 2], strip], axis=0)


def speaker_overlay(decision: ShotDecision, scale: float = 1.0) -> SpeakerOverlay | None:
    """The overlay of a shot decision (None when the decision carries no face analysis); `scale`: see
    `SpeakerOverlay`."""
    if decision.faces is None:
        return None
    return SpeakerOverlay(decision.faces, list(decision.regions), decision.characters, scale)


__all__ = ["SpeakerOverlay", "speaker_overlay"]
