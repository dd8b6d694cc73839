"""The offline bundle for the GPU device: the wheels dubflow needs that its image lacks, plus an ffmpeg.

The device (see /work/.library/device/) has Python 3.12 with torch and ~200 packages
(`scripts/device_image.txt`) but no Prefect, no ffmpeg and no internet, and each command takes at most
64 MiB of copied files, the working tree included. This script, run on a host with a package registry
and the project's virtual environment:

1. walks the requirements of Prefect and of the project's dependencies (pyproject.toml) through the
   installed distributions' metadata (markers evaluated for CPython 3.12 on Linux x86-64), and pins each
   to the version installed here (the versions the project's tests ran with);
2. drops what the image has (by name) and what the GPU film run never imports (`EXCLUDED`, with why);
3. downloads those wheels (`pip download --no-deps`, cp312 manylinux / pure), the cuDNN frontend (the
   `cuda` extra: fp8 attention of the fast preset) and `imageio-ffmpeg==FFMPEG_WHEEL` (its static ffmpeg
   binary; the newest wheel is 68 MB, over the limit on its own);
4. packs them into one tar and splits it into parts small enough to travel next to the working tree:
   `.whl/bundle-<sha12>.part-K-of-N` (K from 1). `scripts/device_bundle.sh install` on the device
   collects the parts across commands, checks the tar's SHA-256, installs it into a persistent folder.

    /work/main/.venv/bin/python scripts/device_bundle.py [--smoke] [--part-mib N] [--dry-run]

`--smoke`: the GPU smoke's bundle (benchmarks/gpu_smoke.py: the per-shot path, no orchestration): the same
without Prefect and what only Prefect needs (48 MiB against 90: three parts instead of five, so one
device command less of transfer before the smoke).

Prints the plan (what is carried and why the rest is not) and the device commands. Network: PyPI only.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import logging
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

log = logging.getLogger("device_bundle")

PROJECT = Path(__file__).resolve().parents[1]
OUT = PROJECT / ".whl"
LIMIT_MIB = 64  # what one device command may copy, working tree included
MARGIN_MIB = 3  # room for files the later session adds before the run

FFMPEG_WHEEL = "imageio-ffmpeg==0.6.0"  # 29.5 MB wheel, one static ffmpeg 7 binary with libx264
# Not carried, with why (the film run on the GPU does not import them, or the image has an equivalent).
EXCLUDED = {
    "torch": "on the image (the CUDA build)",
    "opencv-python": "the image's opencv-python-headless provides the same cv2 (the full wheel is 60+ MB)",
    "opencv-contrib-python": "mediapipe's requirement; its Face Landmarker runs on the image's headless cv2 (70+ MB)",
    "dlib-bin": "characters only (cast.identify auto without stems/stills/names: never used by the film run)",
    "face-recognition-models": "characters only; a 100 MB sdist",
    "optimum-quanto": "the official quantized DiT files only (infinitetalk.quant none)",
    "imageio-ffmpeg": f"carried at {FFMPEG_WHEEL} (the installed version's wheel is 68 MB)",
}
EXTRA = [
    "nvidia-cudnn-frontend==1.32.0",
    "fa3-fwd==0.0.3",
]  # the `cuda` and `fa3` extras (fp8 attention kernels)
PLATFORMS = [
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
]  # fmt: skip
MARKER_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "os_name": "posix",
}  # fmt: skip


def image_names(path: Path = PROJECT / "scripts" / "device_image.txt") -> set[str]:
    lines = (ln.strip() for ln in path.read_text().splitlines())
    return {canonicalize_name(ln) for ln in lines if ln and not ln.startswith("#")}


def project_roots() -> list[str]:
    """Prefect + the project's runtime dependencies (names only: the installed versions are pinned)."""
    deps = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [Requirement(d).name for d in deps]


def _applies(req: Requirement, extras: tuple[str, ...]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": ex}) for ex in ("", *extras))


def closure(roots: list[str]) -> dict[str, str]:
    """{canonical name: installed version} of `roots` and everything they require (extras followed)."""
    pinned: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(r, ()) for r in roots]
    while todo:
        name, extras = todo.pop()
        if canonicalize_name(name) in EXCLUDED or (canonicalize_name(name), extras) in seen:
            continue
        dist = md.distribution(name)  # PackageNotFoundError: the venv lacks a requirement (pip check)
        key = canonicalize_name(dist.metadata["Name"])
        seen.add((key, extras))
        pinned[key] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if _applies(req, extras):
                todo.append((req.name, tuple(sorted(req.extras))))
    return pinned


def plan(image: set[str], smoke: bool = False) -> tuple[list[str], dict[str, str]]:
    """(pins to download, {name: why not carried}) for the film run on the device (`smoke`: the GPU
    smoke's per-shot path, which never imports Prefect)."""
    roots = [r for r in project_roots() if canonicalize_name(r) != "prefect"]
    needed = closure(roots if smoke else ["prefect", *roots])
    carried = sorted(f"{n}=={v}" for n, v in needed.items() if n not in image)
    skipped = {n: "on the image" for n in needed if n in image}
    skipped |= EXCLUDED
    return [*carried, *EXTRA, FFMPEG_WHEEL], skipped


def download(pins: list[str], dest: Path) -> list[Path]:
    """`pip download --no-deps` each pin as a CPython 3.12 manylinux (or pure) wheel into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run([*cmd, *pins], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"device_bundle: pip download failed:\n{proc.stdout}{proc.stderr}")
    wheels = sorted(dest.glob("*.whl"))
    names = {canonicalize_name(w.name.split("-")[0]) for w in wheels}
    missing = [p for p in pins if canonicalize_name(p.split("==")[0]) not in names]
    if missing:
        raise SystemExit(f"device_bundle: no wheel downloaded for {missing}")
    return wheels


def tree_mib() -> float:
    """MiB of what a device command copies besides carried paths: tracked + untracked-not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=PROJECT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    files = [PROJECT / p.decode() for p in out.split(b"\0") if p]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def pack(wheels: list[Path], pins: list[str], part_bytes: int, out: Path) -> list[Path]:
    """One tar of the wheels (+ requirements.txt), split into `part_bytes` parts named after its SHA-256.
    Not compressed: wheels are zip files already (xz took 2 % off, the ffmpeg binary included)."""
    for old in out.glob("bundle-*"):
        old.unlink()
    tar_path = out / "bundle.tar"
    (out / "requirements.txt").write_text("\n".join(pins) + "\n")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(out / "requirements.txt", arcname="requirements.txt")
        for wheel in wheels:
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    data = tar_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    n = -(-len(data) // part_bytes)
    parts = []
    for k in range(n):
        part = out / f"bundle-{digest[:12]}.part-{k + 1}-of-{n}"
        part.write_bytes(data[k * part_bytes : (k + 1) * part_bytes])
        parts.append(part)
    (out / f"bundle-{digest[:12]}.sha256").write_text(f"{digest}  bundle.tar\n")
    tar_path.unlink()
    return parts


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="device_bundle: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part-mib", type=float, default=None,
                        help="part size (default: 64 MiB - the working tree - 3 MiB)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="the GPU smoke's bundle: no Prefect")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, download nothing")
    parser.add_argument("--no-download", action="store_true", help="pack the wheels already in .whl/wheels")
    args = parser.parse_args(argv)
    pins, skipped = plan(image_names(), smoke=args.smoke)
    for name, why in sorted(skipped.items()):
        log.info("not carried: %s (%s)", name, why)
    log.info("carried (%d): %s", len(pins), " ".join(pins))
    tree = tree_mib()
    part_mib = args.part_mib or LIMIT_MIB - tree - MARGIN_MIB
    log.info("working tree %.1f MiB: parts of %.1f MiB", tree, part_mib)
    if part_mib < 4:
        raise SystemExit(
            f"device_bundle: the working tree ({tree:.1f} MiB) leaves no room under {LIMIT_MIB} MiB"
        )
    if args.dry_run:
        return 0
    cache = OUT / "wheels"
    if args.no_download:
        wheels = sorted(cache.glob("*.whl"))
        if len(wheels) != len(pins):
            raise SystemExit(f"device_bundle: {cache} has {len(wheels)} wheels, the plan {len(pins)}")
    else:
        if cache.exists():  # a fresh download: no wheel of an earlier plan is packed
            shutil.rmtree(cache)
        wheels = download(pins, cache)
    total = sum(w.stat().st_size for w in wheels) / 2**20
    parts = pack(wheels, pins, int(part_mib * 2**20), OUT)
    log.info("%d wheels, %.1f MiB, in %d part(s):", len(wheels), total, len(parts))
    for k, part in enumerate(parts, 1):
        log.info(
            "  device command %d: carry [%r], command `bash scripts/device_bundle.sh install` (%.1f MiB)",
            k, str(part.relative_to(PROJECT)), part.stat().st_size / 2**20,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
