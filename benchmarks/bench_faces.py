"""Benchmark the planning's face analysis (`tasks.perception.face_analysis.analyse_shot`) at film resolution on the CPU.

Builds a 1920x1080 25 fps clip from the composed speaker cases (tests/speaker_cases.py: two real talking
heads side by side, scaled up; H.264 at crf 18), then analyses it as one shot the way planning does: decode
at analysis size (ffmpeg scales while decoding), RetinaFace on every `speaker.detect_every`-th frame, tracks,
mouth activity on every frame, the source VAD and the speaker segments.  Reports CPU seconds per second of
video: this process (detector, tracker, lips, VAD: the detector and the VAD run on one thread) plus the
ffmpeg child processes (decode and scale; all of their threads count), and the wall time.

``--faces N`` instead lines up N real talking heads (tests/data/talking, seeds 1-5 looped, a sixth seed 1
mirrored; each 256 px clip scaled 1.2x, faces ~120-180 px tall) on one 1920x1080 row under seed 2's voice,
every mouth moving: the cost per extra face (`speaker.asd_max_faces` bounds the learned route's share).
``--repeats`` runs it that many times and reports the median (the box may be shared: state its load).

Usage:
    python benchmarks/bench_faces.py [--seconds 10] [--size 1920x1080] [--faces N] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config.pipeline import load_config
from tasks.media.probe import probe
from tasks.perception.face_analysis import analyse_shot, source_speech
from tests.av_cases import canvas
from tests.speaker_cases import FPS, cases, encode, seed_audio, seed_frames


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _two_faces(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The composed turn-taking case (two heads side by side, 640x360), looped to n frames."""
    case = cases()["turn_taking"]
    reps = -(-n // len(case.frames))
    audio = np.concatenate([case.audio] * reps)[: round(n / FPS * 16000)]
    return np.concatenate([case.frames] * reps)[:n], audio


def _row(faces: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``faces`` talking heads in a row on a 1920x1080 canvas, each clip looped to n frames."""
    clips = []
    for k in range(faces):
        f = seed_frames(k % 5 + 1)
        f = f[np.arange(n) % len(f)]
        clips.append(f[:, :, ::-1] if k >= 5 else f)
    frames, _ = canvas(clips, (1080, 1920), [1.2] * faces)
    voice = seed_audio(2)
    return frames, np.resize(voice, round(n / FPS * 16000)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--faces", type=int, default=0, help="N talking heads in a row instead of the two-face case"
    )
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    n = round(args.seconds * FPS)
    small, audio = _row(args.faces, n) if args.faces else _two_faces(n)
    frames = np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_LINEAR) for f in small])
    cfg = load_config(overrides=args.set).speaker
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        film = encode(Path(tmp) / "film.mp4", frames, audio)
        del frames
        info = probe(film)
        for _ in range(args.repeats):
            cpu0, child0, wall0 = time.process_time(), _children_cpu(), time.perf_counter()
            probs = source_speech(info, 0, info.frame_count)
            shot = analyse_shot(info, 0, info.frame_count, probs, cfg)
            cpu, child = time.process_time() - cpu0, _children_cpu() - child0
            runs.append((cpu + child, cpu, child, time.perf_counter() - wall0))
    video_s = info.frame_count / float(info.fps)
    total, cpu, child, wall = sorted(runs)[len(runs) // 2]  # the median run
    out = {
        "size": f"{w}x{h}", "video_s": round(video_s, 2), "detect_every": cfg.detect_every,
        "faces": args.faces or 2, "asd_max_faces": cfg.asd_max_faces,
        "analysis_hw": list(shot.analysis_hw), "tracks": len(shot.tracks), "segments": len(shot.segments),
        "cpu_s_python": round(cpu, 2), "cpu_s_ffmpeg": round(child, 2),
        "cpu_s_per_video_s": round(total / video_s, 3), "wall_s": round(wall, 2),
        "runs_cpu_s_per_video_s": [round(r[0] / video_s, 3) for r in runs],
        "load_1min": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
