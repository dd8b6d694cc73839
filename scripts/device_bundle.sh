#!/usr/bin/env bash
# The GPU device's side of the offline bundle made by `scripts/device_bundle.py` (run that on a host with
# PyPI first: it writes .whl/bundle-<sha12>.part-K-of-N, each small enough to travel next to the working
# tree in one device command).
#
#   bash scripts/device_bundle.sh install   one device command per part (carry that part): the part is
#                                           kept in $DUBFLOW_DEVICE_DIR/parts; once all N are there the
#                                           bundle is joined, its SHA-256 checked, the wheels installed
#                                           into $DUBFLOW_DEVICE_DIR/site and env.sh written; then `check`
#   bash scripts/device_bundle.sh check     what the film run needs answers: prefect CLI, ffmpeg with
#                                           libx264, the project's imports, unmet requirements (listed)
#   . $DUBFLOW_DEVICE_DIR/env.sh            in every later command (PYTHONPATH, PATH for `prefect`)
#
# DUBFLOW_DEVICE_DIR defaults to /tmp/dubflow-device: outside the repository copy, it survives between
# commands while the host is held (a fresh host starts bare: install again). Needs only python3 + pip.
# DUBFLOW_PIP_ARGS: extra `pip install` arguments, e.g. to rehearse the install on a host of another Python
# ('--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 ...');
# the check (imports) is then skipped.
set -euo pipefail
DEST="${DUBFLOW_DEVICE_DIR:-/tmp/dubflow-device}"
PY="${PYTHON:-python3}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'device_bundle: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

cmd_install() {
  mkdir -p "$DEST/parts"
  local p found=0
  for p in .whl/bundle-*.part-*-of-*; do
    [ -e "$p" ] || continue
    cp "$p" "$DEST/parts/"
    found=1
    say "kept $(basename "$p") in $DEST/parts"
  done
  [ "$found" = 1 ] || [ -n "$(ls "$DEST/parts" 2>/dev/null)" ] || die "no bundle part in .whl/ (carry one: .whl/bundle-<sha12>.part-K-of-N)"
  # the newest bundle with a part here
  local newest sha n have k missing=()
  newest="$(ls -t "$DEST"/parts/bundle-*.part-* | head -n 1)"
  sha="$(basename "$newest" | sed -E 's/^bundle-([0-9a-f]{12})\.part-.*/\1/')"
  n="$(basename "$newest" | sed -E 's/.*-of-([0-9]+)$/\1/')"
  have=0
  for k in $(seq 1 "$n"); do
    if [ -f "$DEST/parts/bundle-$sha.part-$k-of-$n" ]; then have=$((have + 1)); else missing+=("$k"); fi
  done
  if [ "$have" -lt "$n" ]; then
    say "bundle $sha: $have of $n parts here; next: carry the part(s) ${missing[*]} and run install again"
    return 0
  fi
  say "bundle $sha: all $n parts here; joining"
  local joined="$DEST/bundle-$sha.tar"
  for k in $(seq 1 "$n"); do cat "$DEST/parts/bundle-$sha.part-$k-of-$n"; done >"$joined"
  local got
  got="$(sha256sum "$joined" | cut -c1-12)"
  [ "$got" = "$sha" ] || die "bundle $sha: the joined parts hash to $got (a part is damaged or from another bundle)"
  rm -rf "$DEST/unpacked" "$DEST/site"
  mkdir -p "$DEST/unpacked"
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:").extractall(sys.argv[2], filter="data")' \
    "$joined" "$DEST/unpacked"
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade ${DUBFLOW_PIP_ARGS:-} \
    --target "$DEST/site" "$DEST"/unpacked/wheels/*.whl
  chmod +x "$DEST"/site/imageio_ffmpeg/binaries/ffmpeg-* 2>/dev/null || true
  cat >"$DEST/env.sh" <<EOF
# written by scripts/device_bundle.sh install (bundle $sha)
export PYTHONPATH="$DEST/site\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$DEST/site/bin:\$PATH"
EOF
  rm -rf "$DEST/unpacked" "$joined"
  say "installed $(ls "$DEST/site" | grep -c 'dist-info$') distributions into $DEST/site; env: . $DEST/env.sh"
  if [ -n "${DUBFLOW_PIP_ARGS:-}" ]; then
    say "check skipped (DUBFLOW_PIP_ARGS: installed for another interpreter)"
  else
    cmd_check
  fi
}

cmd_check() {
  [ -f "$DEST/env.sh" ] || die "no $DEST/env.sh: run install (every part) first"
  # shellcheck disable=SC1091
  . "$DEST/env.sh"
  local smoke=0
  if [ -d "$DEST/site" ] && ! ls "$DEST/site" | grep -q '^prefect-.*dist-info$'; then
    smoke=1  # a `device_bundle.py --smoke` bundle: the per-shot path only
    say "smoke bundle (no Prefect): checking the per-shot path"
  else
    prefect version >/dev/null 2>&1 || die "prefect CLI does not start: $(prefect version 2>&1 | tail -n 1)"
    say "prefect $(prefect version 2>/dev/null | awk '/^Version:/ {print $2}')"
  fi
  DUBFLOW_SMOKE_BUNDLE=$smoke PYTHONPATH="$PWD:$PYTHONPATH" "$PY" - <<'PY'
import importlib.metadata as md
import subprocess
import sys

from packaging.requirements import Requirement

from tasks.media.ffmpeg import ffmpeg_exe

exe = ffmpeg_exe()
enc = subprocess.run([exe, "-hide_banner", "-encoders"], capture_output=True, text=True).stdout
if "libx264" not in enc:
    sys.exit(f"device_bundle: error: {exe} has no libx264 encoder")
print(f"device_bundle: ffmpeg {exe} (libx264: yes)", file=sys.stderr)
import os

if os.environ["DUBFLOW_SMOKE_BUNDLE"] == "1":
    import tasks.render.shot  # noqa: F401  the per-shot path (benchmarks/gpu_smoke.py)
else:
    import flows.dub_film  # noqa: F401  the orchestration and everything it imports
import tasks.perception.face_analysis  # noqa: F401  faces + VAD (planning)
import tasks.timeline.export  # noqa: F401  the edit-suite timeline

# Not carried on purpose (scripts/device_bundle.py EXCLUDED): unmet requirements naming them are expected.
expected = {"opencv-python", "dlib-bin", "face-recognition-models", "optimum-quanto"}
if os.environ["DUBFLOW_SMOKE_BUNDLE"] == "1":
    expected.add("prefect")
unmet = []
for dist in md.distributions():
    for spec in dist.requires or []:
        try:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
        except Exception:  # a requirement string packaging cannot read: not ours to judge
            continue
        if req.name.lower().replace("_", "-") in expected:
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            unmet.append(f"{dist.metadata['Name']} needs {req} (missing)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{dist.metadata['Name']} needs {req} (have {have})")
print(f"device_bundle: imports ok; {len(unmet)} unmet requirement(s) in the whole environment", file=sys.stderr)
for line in sorted(set(unmet))[:40]:
    print(f"device_bundle:   {line}", file=sys.stderr)
PY
}

case "${1:-}" in
  install) cmd_install ;;
  check) cmd_check ;;
  *) die "usage: $0 install|check" ;;
esac
