#!/usr/bin/env bash
# Screenshot of a flow run's page in the Prefect UI (headless Chromium, fully offline), with the run
# graph's subflows expanded: a film run shows its group runs and, inside them, every shot task run with
# its progress artifact (scripts/ui_capture.py drives Chromium over the DevTools protocol).
#   scripts/screenshot.sh RUN_ID OUT.png [WIDTHxHEIGHT]
# The UI is the one serving PREFECT_API_URL (see scripts/env.sh). Installs Debian's `chromium` with
# apt-get when no Chromium is found (needs root or sudo). SCREENSHOT_COLORS=0 keeps full colour
# (default: a 256-colour PNG).
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
mkdir -p "$(dirname "$out")"
rm -f "$out"
python "$DUBFLOW_PROJECT_DIR/scripts/ui_capture.py" "$url" "$out" --size "$size" --expand-subflows \
  --colors "${SCREENSHOT_COLORS:-256}" --browser "$browser" || true
[ -s "$out" ] || { echo "screenshot: chromium wrote no image for $url" >&2; exit 1; }
echo "$out"
