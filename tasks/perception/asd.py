"""Learned active-speaker scores: per face track and frame, does this face say what the source's audio says?

Holds `FaceCrops` (fed one analysis frame at a time with the tracks' interpolated boxes, like
`tasks.perception.lips.MouthMeter`: it keeps a grey 112x112 crop of each face at the frames nearest to a
25 fps clock) and `asd_scores`, which runs Light-ASD (`model.speaker.light_asd`) on each track's crops with the
MFCCs (`model.speaker.mfcc`) of the same stretch of the source's audio and maps the 25 fps scores back to the
shot's frames.  The crop follows the AVA-trained network's training crops: the face box's longest side as a
square around its centre (grey 110 outside the frame; the lower-face crop of the reference's demo scored
moving listeners as speakers here, docs/models.md).  The encoders run in windows of ``WINDOW`` frames with ``CONTEXT`` frames either side (their
temporal reach is 6 frames, so the windows join exactly); the recurrent part is run over chunks of 1, 2,
4 and 6 s and the scores averaged (its training clips were that short), then smoothed over 5 frames.
Score > 0: speaking.  The score used is the network's plus its *sync lead* (`sync_lead`): how much better
the face goes with its own moment of the audio than with moments ``SHIFTS`` (0.6-1.6 s) away, the audio
and the face each moved against the other, so what either contributes alone cancels: lips that say this
audio lead, a face that only moves while someone speaks (or says other words) does not (the network
alone weighs "mouth moves during speech" heavily).  Must not decode media nor decide who speaks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import cv2
import numpy as np

from model.speaker.light_asd_format import FACE_SIDE, MFCC_PER_FRAME, VIDEO_FPS
from model.speaker.mfcc import mfcc

if TYPE_CHECKING:  # torch is imported where the network runs: cutting crops needs none
    import torch

    from model.speaker.light_asd import LightASD

WINDOW, CONTEXT = 100, 8  # encoder windows (25 fps frames) and their context either side
CHUNKS = (25, 50, 100, 150)  # recurrent chunks (frames): 1, 2, 4, 6 s
SMOOTH = 5  # frames of the final running mean
SHIFTS = (-40, -25, 15, 40)  # audio moves (frames) of the sync lead's baseline
PAD_GREY = 110


def clock(n_frames: int, fps: float) -> np.ndarray:
    """(J,) the shot frame shown at each tick of a 25 fps clock over the shot (the nearest to its middle)."""
    n_ticks = max(1, int(np.floor(n_frames / fps * VIDEO_FPS + 1e-6)))
    return np.minimum(n_frames - 1, np.floor((np.arange(n_ticks) + 0.5) * fps / VIDEO_FPS)).astype(np.int64)


def crop_face(gray: np.ndarray, box: np.ndarray) -> np.ndarray:
    """(112, 112) uint8 crop of one face (box x0, y0, x1, y1 in the frame's pixels)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    side = max(x1 - x0, y1 - y0, 1e-3)
    s = FACE_SIDE / side  # output pixels per frame pixel
    left, top = (x0 + x1 - side) / 2, (y0 + y1 - side) / 2
    m = np.array([[s, 0.0, -left * s], [0.0, s, -top * s]], np.float32)
    return cv2.warpAffine(
        gray, m, (FACE_SIDE, FACE_SIDE), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
        borderValue=PAD_GREY,
    )  # fmt: skip


class FaceCrops:
    """Grey face crops of every track at the 25 fps clock's frames."""

    def __init__(self, n_frames: int, fps: float) -> None:
        self.n_frames, self.fps = n_frames, fps
        self.ticks = clock(n_frames, fps)
        self._tick_of: dict[int, list[int]] = {}
        for j, t in enumerate(self.ticks.tolist()):
            self._tick_of.setdefault(t, []).append(j)
        self._crops: dict[int, dict[int, np.ndarray]] = {}  # track -> {tick: (112, 112) uint8}

    def feed(self, t: int, frame: np.ndarray, faces: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Frame ``t`` (RGB analysis frame) with ``{track: (landmarks, box)}`` of the tracks in it."""
        ticks = self._tick_of.get(t)
        if not ticks or not faces:
            return
        gray = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
        for k, (_, box) in faces.items():
            crop = crop_face(gray, box)
            for j in ticks:
                self._crops.setdefault(k, {})[j] = crop

    def runs(self, track: int) -> list[tuple[int, np.ndarray]]:
        """[(first tick, (L, 112, 112) uint8)] of the track's unbroken stretches of crops."""
        got = self._crops.get(track, {})
        out: list[tuple[int, list[np.ndarray]]] = []
        for j in sorted(got):
            if out and out[-1][0] + len(out[-1][1]) == j:
                out[-1][1].append(got[j])
            else:
                out.append((j, [got[j]]))
        return [(j0, np.stack(c)) for j0, c in out]


def _windows(n: int) -> list[tuple[int, int, int, int]]:
    """[(a, b, keep0, keep1)]: encoder windows [a, b) over n ticks and the part of each that is kept."""
    out = []
    for k0 in range(0, n, WINDOW):
        k1 = min(n, k0 + WINDOW)
        a, b = max(0, k0 - CONTEXT), min(n, k1 + CONTEXT)
        out.append((a, b, k0 - a, k1 - a))
    return out


def _embed(net: LightASD, faces: np.ndarray, feats: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, 128) audio and visual embeddings of one stretch: faces (L, 112, 112), feats (4L, 13)."""
    import torch

    a_out, v_out = [], []
    for a, b, k0, k1 in _windows(len(faces)):
        v = net.visual(torch.from_numpy(faces[a:b]).unsqueeze(0))  # (1, b - a, 128)
        au = net.audio(torch.from_numpy(feats[MFCC_PER_FRAME * a : MFCC_PER_FRAME * b]).unsqueeze(0))
        v_out.append(v[0, k0:k1])
        a_out.append(au[0, k0:k1])
    return torch.cat(a_out), torch.cat(v_out)


def _backend(net: LightASD, a: torch.Tensor, v: torch.Tensor) -> np.ndarray:
    """(L,) speaking score: the recurrent part over chunks of each CHUNKS length, averaged."""
    n = len(a)
    total = np.zeros(n)
    for size in CHUNKS:
        full = n // size * size
        if full:  # the whole chunks as one batch
            s = net.scores(a[:full].reshape(-1, size, 128), v[:full].reshape(-1, size, 128))
            total[:full] += s.reshape(-1).numpy()
        if full < n:
            total[full:] += net.scores(a[None, full:], v[None, full:])[0].numpy()
    return total / len(CHUNKS)


def _smooth(x: np.ndarray) -> np.ndarray:
    """SMOOTH-frame running mean (edges over what exists; a stretch shorter than that: its mean)."""
    if len(x) < SMOOTH:
        return np.full(len(x), float(np.mean(x)))
    k = np.ones(SMOOTH)
    return np.convolve(x, k, "same") / np.convolve(np.ones_like(x), k, "same")


def sync_lead(net: LightASD, a: torch.Tensor, v: torch.Tensor, score: np.ndarray) -> np.ndarray:
    """(L,) how much better this face goes with its own audio than with the audio of other moments: per
    shift d of SHIFTS, score(v_t, a_t) + score(v_t-d, a_t-d) - score(v_t, a_t-d) - score(v_t-d, a_t),
    averaged.  Moving only the audio (the first version) also measures the audio itself: every moving
    face loses when speech is moved onto a pause and gains when a pause is moved onto speech, so a lone
    face mouthing other words led by chance wherever the speech had pauses; the swapped pairs cancel what
    the audio and what the face alone contribute, leaving only whether they belong together."""
    import torch

    out = np.zeros(len(score))
    for d in SHIFTS:
        moved_audio = _backend(net, torch.roll(a, d, 0), v)
        moved_face = _backend(net, a, torch.roll(v, d, 0))
        out += score + np.roll(score, d) - moved_audio - moved_face
    return out / len(SHIFTS)


def asd_scores(
    net: LightASD, crops: FaceCrops, ids: list[int], samples: np.ndarray, sr: int
) -> tuple[np.ndarray, np.ndarray]:
    """(score, sync lead), each (len(ids), n_frames), of each track at each shot frame (NaN where it has no
    crop): score = the network's score + its sync lead (see the module docstring).

    ``samples``: the source's mono audio (float, -1..1) at ``sr`` (16 kHz) from the shot's first frame.
    Runs on one thread: these small convolutions and GRU steps gain nothing from more, and the thread
    pool's spin-waits more than double the CPU time (measured: the GRU part 0.02 vs 1.9 CPU-s per 5 s).
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _scores(net, crops, ids, samples, sr)
    finally:
        torch.set_num_threads(threads)


def _scores(
    net: LightASD, crops: FaceCrops, ids: list[int], samples: np.ndarray, sr: int
) -> tuple[np.ndarray, np.ndarray]:
    ticks = crops.ticks
    feats = mfcc(samples, sr)  # (M, 13) at 100 per second
    need = MFCC_PER_FRAME * len(ticks)
    if len(feats) < need:  # the audio stops short (or the last partial window): hold its last row
        feats = np.concatenate([feats, np.repeat(feats[-1:], need - len(feats), 0)])
    per_tick = np.full((len(ids), len(ticks)), np.nan)
    lead_tick = np.full((len(ids), len(ticks)), np.nan)
    for row, k in enumerate(ids):
        for j0, faces in crops.runs(k):
            seg = feats[MFCC_PER_FRAME * j0 : MFCC_PER_FRAME * (j0 + len(faces))]
            a, v = _embed(net, faces, np.ascontiguousarray(seg))
            score = _backend(net, a, v)
            lead = sync_lead(net, a, v, score)
            per_tick[row, j0 : j0 + len(faces)] = _smooth(score + lead)
            lead_tick[row, j0 : j0 + len(faces)] = _smooth(lead)
    # each shot frame reads the tick whose 1/25 s contains the frame's middle
    mid = (np.arange(crops.n_frames) + 0.5) * VIDEO_FPS / crops.fps
    j_of = np.minimum(len(ticks) - 1, np.floor(mid)).astype(np.int64)
    return per_tick[:, j_of], lead_tick[:, j_of]


__all__ = ["FaceCrops", "asd_scores", "clock", "crop_face", "sync_lead"]
