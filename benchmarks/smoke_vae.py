"""The GPU smoke's `vae` run (benchmarks/gpu_smoke.py): the root's VAE in float32 and bfloat16 on one chunk of
the shot (seconds and bf16 drift), and the conditioning-clip encode with the memo checked bit-identical."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def vae_drift(args: argparse.Namespace) -> dict[str, Any]:
    """The root's VAE in float32 and bfloat16 on one 81-frame chunk of the shot at the 480P bucket:
    encode + decode seconds of each, and the bf16 drift (relative L2 vs float32) of latents and pixels."""
    import torch

    from model.network.vae import load_vae
    from model.weights.layout import WeightsLayout
    from tasks.media.frames import read_frames
    from tasks.media.probe import probe

    work = Path(args.work)
    meta = json.loads((work / "root.json").read_text())
    lay = WeightsLayout()
    info = probe(work / "shot.mp4")
    n = min(info.frame_count, 81 if not args.tiny else 9)
    got = read_frames(info, list(range(n)))
    video = torch.from_numpy(np.stack([got[i] for i in range(n)])).permute(3, 0, 1, 2).float() / 127.5 - 1.0
    hw = (448, 896) if not args.tiny else (64, 128)
    video = torch.nn.functional.interpolate(video, size=hw, mode="bilinear")[None]  # (1, 3, T, H, W)
    cuda = torch.cuda.is_available() and not args.tiny
    device = "cuda:0" if cuda else "cpu"
    out: dict[str, Any] = {"run": "vae", "frames": n, "size": f"{hw[1]}x{hw[0]}"}
    ref: dict[str, torch.Tensor] = {}
    for dtype in (torch.float32, torch.bfloat16):
        vae = load_vae(Path(meta["root"]) / lay.wan_dir / lay.vae, dtype=dtype, device=device)
        with torch.no_grad():
            for _ in range(1 + cuda):  # a warm-up pass on the GPU
                t0 = time.perf_counter()
                z = vae.encode(video)
                torch.cuda.synchronize() if cuda else None
                t1 = time.perf_counter()
                x = vae.decode(z)
                torch.cuda.synchronize() if cuda else None
                t2 = time.perf_counter()
        name = str(dtype).removeprefix("torch.")
        out[name] = {"encode_s": round(t1 - t0, 3), "decode_s": round(t2 - t1, 3)}
        out[name] |= reference_reuse(vae, video, cuda)
        if dtype == torch.float32:
            ref = {"z": z.float(), "x": x.float()}
        else:
            for k, v in (("z", z), ("x", x)):
                out[name][f"drift_{k}"] = float((v.float() - ref[k]).norm() / ref[k].norm())
        if cuda and dtype == torch.bfloat16:  # the same with cuDNN's autotuner (the warm-up turns it on)
            torch.backends.cudnn.benchmark = True
            with torch.no_grad():
                for _ in range(2):
                    t0 = time.perf_counter()
                    vae.encode(video)
                    torch.cuda.synchronize()
                    t1 = time.perf_counter()
                    vae.decode(z)
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
            out[name]["cudnn_benchmark"] = {"encode_s": round(t1 - t0, 3), "decode_s": round(t2 - t1, 3)}
            out[name]["cudnn_benchmark"] |= reference_reuse(vae, video, cuda)
            torch.backends.cudnn.benchmark = False
        del vae
    return out


def reference_reuse(vae: Any, video: Any, cuda: bool) -> dict[str, Any]:
    """The conditioning clip [frame, zeros] of the video's first and last frames: full encode vs
    `encode_reference` (first call fills the memo, second reuses it): seconds, and bit-identity."""
    import torch

    from model.network.vae_net import ZeroTailMemo

    memo, out = ZeroTailMemo(), {}
    n = video.shape[2]
    for name, ref in (("fill", video[:, :, :1]), ("reuse", video[:, :, -1:])):
        with torch.no_grad():
            t0 = time.perf_counter()
            full = vae.encode(torch.cat([ref, torch.zeros_like(video[:, :, 1:])], dim=2))
            torch.cuda.synchronize() if cuda else None
            t1 = time.perf_counter()
            got = vae.encode_reference(ref, n, memo)
            torch.cuda.synchronize() if cuda else None
            t2 = time.perf_counter()
        out[f"ref_{name}"] = {
            "full_s": round(t1 - t0, 3),
            "memo_s": round(t2 - t1, 3),
            "equal": torch.equal(full, got),
        }
    out["memo_gib"] = round(sum(x.numel() * x.element_size() for _, x in memo.steps.values()) / 2**30, 3)
    return out
