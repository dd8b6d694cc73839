"""Benchmark the planning's face analysis (`tasks.perception.face_analysis.analyse_shot`) at film resolution on the CPU.

Builds a 1920x1080 25 fps clip from the composed speaker cases (tests/speaker_cases.py: two real talking
heads side by side, scaled up; H.264 at crf 18), then analyses it as one shot the way planning does: decode
at analysis size (ffmpeg scales while decoding), RetinaFace on every `speaker.detect_every`-th frame, tracks,
mouth activity on every frame, the source VAD and the speaker segments.  Reports CPU seconds per second of
video: this process (detector, tracker, lips, VAD: the detector and the VAD run on one thread) plus the
ffmpeg child processes (decode and scale; all of their threads count), and the wall time.

Usage:
    python benchmarks/bench_faces.py [--seconds 10] [--size 1920x1080] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.config import load_config
from tasks.media.probe import probe
from tasks.perception.face_analysis import analyse_shot, source_speech
from tests.speaker_cases import FPS, cases, encode


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    case = cases()["turn_taking"]
    n = round(args.seconds * FPS)
    reps = -(-n // len(case.frames))
    small = np.concatenate([case.frames] * reps)[:n]
    audio = np.concatenate([case.audio] * reps)[: round(n / FPS * 16000)]
    frames = np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_LINEAR) for f in small])
    cfg = load_config().speaker
    with tempfile.TemporaryDirectory() as tmp:
        film = encode(Path(tmp) / "film.mp4", frames, audio)
        del frames
        info = probe(film)
        cpu0, child0, wall0 = time.process_time(), _children_cpu(), time.perf_counter()
        probs = source_speech(info, 0, info.frame_count)
        shot = analyse_shot(info, 0, info.frame_count, probs, cfg)
        cpu, child, wall = time.process_time() - cpu0, _children_cpu() - child0, time.perf_counter() - wall0
    video_s = info.frame_count / float(info.fps)
    out = {
        "size": f"{w}x{h}", "video_s": round(video_s, 2), "detect_every": cfg.detect_every,
        "analysis_hw": list(shot.analysis_hw), "tracks": len(shot.tracks), "segments": len(shot.segments),
        "cpu_s_python": round(cpu, 2), "cpu_s_ffmpeg": round(child, 2),
        "cpu_s_per_video_s": round((cpu + child) / video_s, 3), "wall_s": round(wall, 2),
    }  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
