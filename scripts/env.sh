# Environment of the dubflow Prefect stack. Source it (`. scripts/env.sh`) in the shell, in workers, in CI.
# Every value can be preset; the defaults give a single-host stack with its state in <checkout>/.prefect.
#   DUBFLOW_PREFECT_HOME  Prefect home (SQLite db, results, logs, pid files)   default <checkout>/.prefect
#   DUBFLOW_HOST/PORT     where `stack.sh start` serves the API                default 127.0.0.1:4200
#   PREFECT_API_URL       the server every CLI/worker/flow talks to           default http://HOST:PORT/api
#   PREFECT_RESULTS_LOCAL_STORAGE_PATH  task results + cache records (shared path for several hosts)
#   DUBFLOW_WORKSPACE     shot intermediates (shared path for several hosts)   default <checkout>/workspace
#   PREFECT_SERVER_API_AUTH_STRING  the server's basic auth 'user:password' (needed beyond loopback);
#                         this host's clients get it as PREFECT_API_AUTH_STRING unless that is set
# shellcheck shell=bash

DUBFLOW_PROJECT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DUBFLOW_PROJECT_DIR                      # the prefect.yaml pull step starts each flow run here
export DUBFLOW_PREFECT_HOME="${DUBFLOW_PREFECT_HOME:-$DUBFLOW_PROJECT_DIR/.prefect}"
export PREFECT_HOME="$DUBFLOW_PREFECT_HOME"
export DUBFLOW_HOST="${DUBFLOW_HOST:-127.0.0.1}"
export DUBFLOW_PORT="${DUBFLOW_PORT:-4200}"
export PREFECT_API_URL="${PREFECT_API_URL:-http://$DUBFLOW_HOST:$DUBFLOW_PORT/api}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_RESULTS_LOCAL_STORAGE_PATH="${PREFECT_RESULTS_LOCAL_STORAGE_PATH:-$PREFECT_HOME/results}"
export PREFECT_WORKER_QUERY_SECONDS="${PREFECT_WORKER_QUERY_SECONDS:-2}"   # default 10 s pickup delay
# API calls retry with exponential backoff (2, 4, ... 256 s: ~8.5 min in all) so a server restart or a
# few minutes' outage fails no shot (Prefect's default 5 retries give up after ~1 min)
export PREFECT_CLIENT_MAX_RETRIES="${PREFECT_CLIENT_MAX_RETRIES:-8}"
if [ -n "${PREFECT_SERVER_API_AUTH_STRING:-}" ] && [ -z "${PREFECT_API_AUTH_STRING:-}" ]; then
  export PREFECT_API_AUTH_STRING="$PREFECT_SERVER_API_AUTH_STRING"
fi
export DUBFLOW_WORKSPACE="${DUBFLOW_WORKSPACE:-$DUBFLOW_PROJECT_DIR/workspace}"

# Use the checkout's virtual environment unless one is already active.
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$DUBFLOW_PROJECT_DIR/.venv/bin/prefect" ]; then
  export PATH="$DUBFLOW_PROJECT_DIR/.venv/bin:$PATH"
fi
