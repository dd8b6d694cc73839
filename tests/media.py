"""Helpers that synthesise small test clips and audio with the bundled ffmpeg (no system ffmpeg)."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from tasks.media.ffmpeg import ffmpeg_exe

# Distinct base colours per shot so every cut is a hard cut for any detector.
_PALETTE = [
    (200, 40, 40),
    (40, 180, 60),
    (40, 60, 200),
    (220, 200, 40),
    (160, 40, 200),
    (40, 200, 200),
    (240, 240, 240),
]


def shot_frames(lengths: Sequence[int], size: tuple[int, int] = (128, 72), seed: int = 0) -> np.ndarray:
    """uint8 (N, H, W, 3): one textured colour per shot, a square moving slowly inside each shot."""
    w, h = size
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    frames = []
    for s, n in enumerate(lengths):
        base = np.array(_PALETTE[s % len(_PALETTE)], np.float32)
        tex = rng.uniform(-25, 25, (h, w, 1)).astype(np.float32)
        grad = ((xx + 2 * yy) % 64)[..., None].astype(np.float32) * 0.6
        for i in range(n):
            img = base + tex + grad
            x0 = (8 + 2 * i) % max(w - 16, 1)
            img[h // 3 : h // 3 + 16, x0 : x0 + 16] = 255 - base
            frames.append(np.clip(img, 0, 255).astype(np.uint8))
    return np.stack(frames)


def run_ffmpeg(args: Sequence[str], data: bytes | None = None) -> None:
    subprocess.run(
        [ffmpeg_exe(), "-nostdin", "-v", "error", "-y", *args], input=data, check=True, capture_output=True
    )


def make_clip(
    path: str | Path,
    lengths: Sequence[int] = (24,),
    *,
    size: tuple[int, int] = (128, 72),
    fps: str = "24000/1001",
    codec: str = "libx264",
    audio_channels: int | None = 2,
    audio_rate: int = 48000,
    rotation: int | None = None,
    sar: str | None = None,
    vfr_split: tuple[int, str] | None = None,
    faststart: bool = False,
    gop: int = 12,
    seed: int = 0,
    frames: np.ndarray | None = None,
) -> Path:
    """Encode a multi-shot clip. `vfr_split=(k, rate2)`: frames from k on are timed at rate2 (VFR)."""
    path = Path(path)
    frames = shot_frames(lengths, size, seed) if frames is None else frames
    n = frames.shape[0]
    w, h = frames.shape[2], frames.shape[1]
    rate = Fraction(fps)
    args: list[str] = ["-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}", "-framerate", fps, "-i", "-"]
    duration = float(n / rate)
    if vfr_split is not None:
        k, rate2 = vfr_split
        r2 = Fraction(rate2)
        duration = float(k / rate + (n - k) / r2)
    if audio_channels:
        args += ["-f", "lavfi", "-i", f"sine=frequency=440:sample_rate={audio_rate}:duration={duration:.6f}"]
    vf = []
    if sar:
        vf.append(f"setsar={sar}")
    if vfr_split is not None:
        k, rate2 = vfr_split
        r2 = Fraction(rate2)
        vf.append(f"setpts='if(lt(N,{k}),N/({rate}),{k}/({rate})+(N-{k})/({r2}))/TB'")
    if vf:
        args += ["-vf", ",".join(vf)]
    if vfr_split is not None:
        args += ["-fps_mode", "passthrough"]
    args += ["-map", "0:v"]
    if audio_channels:
        args += [
            "-map",
            "1:a",
            "-ac",
            str(audio_channels),
            "-c:a",
            "aac" if path.suffix != ".webm" else "libopus",
        ]
    args += ["-c:v", codec, "-g", str(gop)]
    if codec == "libx264":
        args += ["-pix_fmt", "yuv420p", "-preset", "veryfast", "-crf", "18"]
    elif codec == "libx265":
        args += [
            "-pix_fmt",
            "yuv420p",
            "-preset",
            "ultrafast",
            "-x265-params",
            "log-level=error",
            "-tag:v",
            "hvc1",
        ]
    elif codec == "libvpx-vp9":
        args += ["-pix_fmt", "yuv420p", "-b:v", "300k", "-deadline", "realtime", "-cpu-used", "8"]
    elif codec == "libsvtav1":
        args += ["-pix_fmt", "yuv420p", "-preset", "12"]
    if faststart:
        args += ["-movflags", "+faststart"]
    if rotation is None:
        run_ffmpeg([*args, str(path)], frames.tobytes())
        return path
    # the display matrix is set on a stream-copy remux (an input option of ffmpeg >= 7)
    tmp = path.with_name("unrotated-" + path.name)
    run_ffmpeg([*args, str(tmp)], frames.tobytes())
    run_ffmpeg(["-display_rotation", str(rotation), "-i", str(tmp), "-map", "0", "-c", "copy", str(path)])
    tmp.unlink()
    return path


def make_audio(
    path: str | Path, seconds: float, *, rate: int = 16000, channels: int = 1, codec: str | None = None
) -> Path:
    """A tone+noise track of exactly `seconds` (before codec padding) in the format of the suffix."""
    path = Path(path)
    src = f"sine=frequency=300:sample_rate={rate}:duration={seconds:.6f}"
    args = ["-f", "lavfi", "-i", src, "-ac", str(channels)]
    if codec:
        args += ["-c:a", codec]
    run_ffmpeg([*args, str(path)])
    return path


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def decode_all(path: str | Path) -> np.ndarray:
    """Every frame, coded orientation, uint8 (N, H, W, 3), via the pipeline's own decoder."""
    from tasks.media.frames import iter_frames
    from tasks.media.probe import probe

    return np.stack(list(iter_frames(probe(path))))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def encoders() -> str:
    return subprocess.run([ffmpeg_exe(), "-hide_banner", "-encoders"], capture_output=True, text=True).stdout
