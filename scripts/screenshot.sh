#!/usr/bin/env bash
# Screenshot of a flow run's page in the Prefect UI (headless Chromium, fully offline).
#   scripts/screenshot.sh RUN_ID OUT.png [WIDTHxHEIGHT]
# The UI is the one serving PREFECT_API_URL (see scripts/env.sh). Installs Debian's `chromium` with
# apt-get when no Chromium is found (needs root or sudo).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

[ $# -ge 2 ] || { echo "usage: $0 RUN_ID OUT.png [WIDTHxHEIGHT]" >&2; exit 2; }
run_id="$1"
out="$(realpath -m "$2")"
size="${3:-1600x1000}"

browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -z "$browser" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "screenshot: installing chromium with apt-get" >&2
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >&2
  browser="$(command -v chromium)"
fi

ui="${PREFECT_API_URL%/api}"
url="$ui/runs/flow-run/$run_id"
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
mkdir -p "$(dirname "$out")"
# virtual-time-budget lets the single-page app fetch and lay out the run graph before the capture.
"$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
  --disable-background-networking --disable-component-update --disable-sync --no-first-run \
  --user-data-dir="$profile" --window-size="${size/x/,}" --virtual-time-budget=20000 \
  --screenshot="$out" "$url" >/dev/null 2>&1 || true
[ -s "$out" ] || { echo "screenshot: chromium wrote no image for $url" >&2; exit 1; }
echo "$out"
