#!/usr/bin/env bash
# `make demo`: dub the bundled sample film through the real deployment on this machine.
#
# Starts the local stack (scripts/stack.sh start: server + UI, pools, deployments, the cpu worker and one
# gpu-pool worker on GPU 0, or on the CPU without a GPU), then runs
#   prefect deployment run dub-film/default --param source=... --param audio=... --param out=... --watch
# and prints the output path, the report next to it (and its notes) and the run's page in the UI.
# Safe to run twice: the second run reuses every shot (and the assembled output). The stack keeps running for the UI; `make stack-stop` stops it.
# Knobs: GPU_IDS / N_GPUS (see stack.sh), DEMO_OUT (output file), DEMO_TIMEOUT_S (watch limit, 3600).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$DUBFLOW_PROJECT_DIR"

if [ -z "${GPU_IDS:-}" ] && [ -z "${N_GPUS:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    export GPU_IDS=0
  else
    export N_GPUS=0
  fi
fi
scripts/stack.sh start

source="$DUBFLOW_PROJECT_DIR/data/sample_film.mp4"
audio="$DUBFLOW_PROJECT_DIR/data/sample_dub.wav"
out="${DEMO_OUT:-$DUBFLOW_PROJECT_DIR/out/sample_film.dubbed.mp4}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rc=0
prefect deployment run dub-film/default --param source="$source" --param audio="$audio" \
  --param out="$out" --watch --watch-timeout "${DEMO_TIMEOUT_S:-3600}" 2>&1 | tee "$log" || rc=$?
run_id="$(grep -oE 'UUID: [0-9a-f-]{36}' "$log" | head -n 1 | cut -d' ' -f2 || true)"
ui="${PREFECT_API_URL%/api}"
echo
if [ "$rc" -eq 0 ]; then
  echo "demo: output  $out"
  # the report next to the film, and its notes (without weights: TINY RANDOM WEIGHTS, not a dub), which the
  # run's event stream above never shows
  report="${out%.*}.report.html"
  [ ! -f "$report" ] || echo "demo: report  $report (every shot: dubbed or not and why, who, QC links)"
  python - "${out%.*}.report.json" <<'PY' || true
import json, sys
try:
    notes = json.load(open(sys.argv[1], encoding="utf-8")).get("notes", [])
except (OSError, ValueError):
    notes = []
for note in notes:
    print(f"demo: note    {note}")
PY
else
  echo "demo: the film run did not complete (exit $rc); see the run page and $PREFECT_HOME/logs/" >&2
fi
[ -z "$run_id" ] || echo "demo: UI      $ui/runs/flow-run/$run_id"
echo "demo: stop the stack with: make stack-stop"
exit "$rc"
