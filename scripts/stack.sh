#!/usr/bin/env bash
# The dubflow Prefect stack on this host: server, work pools, deployments and workers.
#
#   scripts/stack.sh start     server (unless one already answers at PREFECT_API_URL), cpu-pool + gpu-pool,
#                              `prefect deploy --all`, one cpu worker, one gpu worker per GPU
#   scripts/stack.sh team      the server side of a team stack in one command: a private PostgreSQL
#                              (scripts/postgres.sh; unless PREFECT_API_DATABASE_CONNECTION_URL is set),
#                              server + UI on it, pools, deployments, the cpu worker; no gpu worker
#   scripts/stack.sh workers   only the gpu workers, for an extra GPU host (PREFECT_API_URL = the server)
#   scripts/stack.sh status    what runs here; exit 0 when the API answers and every started process lives
#   scripts/stack.sh stop      stop the workers (and their in-flight flow runs), then the server
#
# Safe to run twice: a process whose pid file names a live process is left alone.
# Authentication: a server bound beyond loopback (DUBFLOW_HOST other than 127.x / localhost / ::1) needs
# PREFECT_SERVER_API_AUTH_STRING (basic auth, 'user:password'; env.sh hands it to this host's clients as
# PREFECT_API_AUTH_STRING); every other host sets PREFECT_API_AUTH_STRING. `start`, `team` and `workers`
# refuse to run without it unless DUBFLOW_ALLOW_NO_AUTH=1 (an authenticating proxy, a private network).
# GPUs: GPU_IDS=0,1,3 (any CUDA_VISIBLE_DEVICES tokens, e.g. MIG UUIDs), else N_GPUS=n, else the count of
# `nvidia-smi -L`; without GPUs one worker runs on the CPU (CUDA_VISIBLE_DEVICES empty).
# Other knobs: DUBFLOW_PREFECT_FILE (default prefect.yaml), DUBFLOW_CPU_WORKER_LIMIT (default 4 films),
# DUBFLOW_NO_UI=1 (API only), and everything in scripts/env.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$DUBFLOW_PROJECT_DIR"

HOST_TAG="$(hostname -s 2>/dev/null || hostname)"
RUN_DIR="$PREFECT_HOME/run/$HOST_TAG"     # pid files; per host, so a shared PREFECT_HOME stays correct
LOG_DIR="$PREFECT_HOME/logs/$HOST_TAG"
PREFECT_FILE="${DUBFLOW_PREFECT_FILE:-prefect.yaml}"
CPU_LIMIT="${DUBFLOW_CPU_WORKER_LIMIT:-4}"
STOP_GRACE_S=20

say() { printf 'stack: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

pid_of() { [ -f "$RUN_DIR/$1.pid" ] && cat "$RUN_DIR/$1.pid"; }

# alive NAME: the pid file names a live process that is still a prefect command (not a reused pid).
alive() {
  local pid
  pid="$(pid_of "$1")" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # a killed process not yet reaped (state Z) answers kill -0 but is gone: not alive
  case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*) return 1 ;; esac
  ps -o args= -p "$pid" 2>/dev/null | grep -q prefect
}

# launch NAME CMD...: start CMD in the background in its own process group, logging to LOG_DIR/NAME.log.
# `set -m` matters: without job control, background jobs inherit SIGINT=ignored and prefect workers
# then ignore their first SIGTERM (recipe gotcha G1).
launch() {
  local name="$1"; shift
  if alive "$name"; then
    say "$name already running (pid $(pid_of "$name"))"
    return 0
  fi
  set -m
  nohup "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
  local pid=$!
  set +m
  echo "$pid" >"$RUN_DIR/$name.pid"
  say "$name started (pid $pid, log $LOG_DIR/$name.log)"
}

api_healthy() {
  python - "$PREFECT_API_URL" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/health", timeout=3) as r:
        sys.exit(0 if r.read().strip() == b"true" else 1)
except Exception:
    sys.exit(1)
PY
}

wait_healthy() {
  local deadline=$((SECONDS + ${DUBFLOW_SERVER_TIMEOUT_S:-180}))
  until api_healthy; do
    if [ -f "$RUN_DIR/server.pid" ] && ! alive server; then
      tail -n 30 "$LOG_DIR/server.log" >&2 || true
      die "the Prefect server exited while starting (log: $LOG_DIR/server.log)"
    fi
    [ $SECONDS -lt "$deadline" ] || die "no healthy Prefect API at $PREFECT_API_URL after ${DUBFLOW_SERVER_TIMEOUT_S:-180} s"
    sleep 0.5
  done
}

is_loopback() {
  case "$1" in 127.* | localhost | ::1 | "[::1]") return 0 ;; *) return 1 ;; esac
}

# require_auth: refuse a server bound beyond loopback, or a client of a non-loopback API, without auth.
require_auth() {
  [ "${DUBFLOW_ALLOW_NO_AUTH:-0}" = 1 ] && return 0
  if [ "${1:-}" = server ] && ! is_loopback "$DUBFLOW_HOST" && [ -z "${PREFECT_SERVER_API_AUTH_STRING:-}" ]; then
    die "DUBFLOW_HOST=$DUBFLOW_HOST binds the API beyond loopback without authentication: set PREFECT_SERVER_API_AUTH_STRING='user:password' (clients: PREFECT_API_AUTH_STRING), or DUBFLOW_ALLOW_NO_AUTH=1 behind an authenticating proxy"
  fi
  local host="${PREFECT_API_URL#*://}"
  host="${host%%/*}"
  host="${host%:*}"
  if ! is_loopback "$host" && [ -z "${PREFECT_API_AUTH_STRING:-}" ]; then
    die "PREFECT_API_URL=$PREFECT_API_URL is not on this host and PREFECT_API_AUTH_STRING is unset: set it to the server's PREFECT_SERVER_API_AUTH_STRING (or DUBFLOW_ALLOW_NO_AUTH=1)"
  fi
}

gpu_ids() {
  if [ -n "${GPU_IDS:-}" ]; then
    tr ',' ' ' <<<"$GPU_IDS"
    return
  fi
  local n="${N_GPUS:-}"
  if [ -z "$n" ] && command -v nvidia-smi >/dev/null 2>&1; then
    n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  fi
  if [ -z "$n" ] || [ "$n" -eq 0 ]; then
    echo cpu
  else
    seq 0 $((n - 1))
  fi
}

start_gpu_workers() {
  local id tag visible
  for id in $(gpu_ids); do
    if [ "$id" = cpu ]; then visible=""; tag=cpu; else visible="$id"; tag="${id//[^A-Za-z0-9]/-}"; fi
    launch "gpu-$tag" env CUDA_VISIBLE_DEVICES="$visible" \
      prefect worker start --pool gpu-pool --name "gpu-$HOST_TAG-$tag" --limit 1
  done
}

cmd_start() {
  require_auth server
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$PREFECT_RESULTS_LOCAL_STORAGE_PATH"
  if ! alive server && api_healthy; then
    say "using the Prefect server already answering at $PREFECT_API_URL"
  else
    local ui=()
    [ "${DUBFLOW_NO_UI:-0}" = 1 ] && ui=(--no-ui)
    launch server prefect server start --host "$DUBFLOW_HOST" --port "$DUBFLOW_PORT" "${ui[@]}"
  fi
  wait_healthy
  say "API healthy at $PREFECT_API_URL"
  python "$DUBFLOW_PROJECT_DIR/scripts/ensure_pools.py" cpu-pool gpu-pool || die "cannot create the work pools"
  python "$DUBFLOW_PROJECT_DIR/scripts/ensure_heartbeat_watch.py" || die "cannot create the heartbeat watch automation"
  # Without DUBFLOW_PROJECT_DIR: `prefect deploy` (3.9.1) fills `{{ $VAR }}` of the pull step from its own
  # environment when the variable is set, which would pin every host to this checkout; unset, the
  # placeholder is stored and each flow run resolves it from its worker's environment.
  if ! env -u DUBFLOW_PROJECT_DIR prefect --no-prompt deploy --all --prefect-file "$PREFECT_FILE" \
    >"$LOG_DIR/deploy.log" 2>&1; then
    tail -n 30 "$LOG_DIR/deploy.log" >&2 || true
    die "prefect deploy --all --prefect-file $PREFECT_FILE failed (log: $LOG_DIR/deploy.log)"
  fi
  say "deployed $PREFECT_FILE"
  launch cpu prefect worker start --pool cpu-pool --name "cpu-$HOST_TAG" --limit "$CPU_LIMIT"
  [ "${1:-}" = no-gpu ] || start_gpu_workers
}

# team: PostgreSQL (a private cluster unless a database URL is given), then `start` without gpu workers.
cmd_team() {
  require_auth server
  if [ -z "${PREFECT_API_DATABASE_CONNECTION_URL:-}" ]; then
    PREFECT_API_DATABASE_CONNECTION_URL="$("$DUBFLOW_PROJECT_DIR/scripts/postgres.sh" start)" ||
      die "cannot start PostgreSQL (scripts/postgres.sh start)"
    export PREFECT_API_DATABASE_CONNECTION_URL
    mkdir -p "$RUN_DIR"
    touch "$RUN_DIR/postgres.started"   # `stop` stops the cluster it started
  fi
  cmd_start no-gpu
}

cmd_workers() {
  require_auth client
  mkdir -p "$RUN_DIR" "$LOG_DIR" "$PREFECT_RESULTS_LOCAL_STORAGE_PATH"
  wait_healthy
  start_gpu_workers
}

# descendants PID: every process below PID (flow runs get their own session, so not in PID's group).
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}

# stop_all NAME...: SIGTERM each process group, and each descendant in another group (flow runs get
# their own session); wait up to STOP_GRACE_S, then SIGKILL what is left. One SIGTERM per process:
# a prefect worker answers a second one with SIGKILL to its runs.
stop_all() {
  local name pid child pids=() left=() deadline
  for name in "$@"; do
    if ! alive "$name"; then rm -f "$RUN_DIR/$name.pid"; continue; fi
    pid="$(pid_of "$name")"
    pids+=("$pid")
    for child in $(descendants "$pid"); do
      if [ "$(ps -o pgid= -p "$child" 2>/dev/null | tr -d ' ')" != "$pid" ]; then
        kill -TERM "$child" 2>/dev/null || true
      fi
      pids+=("$child")
    done
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    say "stopping $name (pid $pid)"
  done
  deadline=$((SECONDS + STOP_GRACE_S))
  while [ ${#pids[@]} -gt 0 ]; do
    left=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    pids=("${left[@]+"${left[@]}"}")
    [ ${#pids[@]} -gt 0 ] && [ $SECONDS -lt "$deadline" ] || break
    sleep 0.2
  done
  for pid in "${pids[@]+"${pids[@]}"}"; do
    say "pid $pid ignored SIGTERM for ${STOP_GRACE_S} s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
  done
  for name in "$@"; do rm -f "$RUN_DIR/$name.pid"; done
}

cmd_stop() {
  local workers=() f
  for f in "$RUN_DIR"/*.pid; do
    [ -e "$f" ] || continue
    f="$(basename "$f" .pid)"
    [ "$f" = server ] || workers+=("$f")
  done
  [ ${#workers[@]} -eq 0 ] || stop_all "${workers[@]}"
  stop_all server
  if [ -f "$RUN_DIR/postgres.started" ]; then
    "$DUBFLOW_PROJECT_DIR/scripts/postgres.sh" stop || true
    rm -f "$RUN_DIR/postgres.started"
  fi
  say "stopped"
}

cmd_status() {
  local ok=0 f name
  if api_healthy; then say "API healthy at $PREFECT_API_URL"; else say "API not answering at $PREFECT_API_URL"; ok=1; fi
  for f in "$RUN_DIR"/*.pid; do
    [ -e "$f" ] || continue
    name="$(basename "$f" .pid)"
    if alive "$name"; then say "$name running (pid $(pid_of "$name"))"; else say "$name NOT running"; ok=1; fi
  done
  return $ok
}

case "${1:-}" in
  start) cmd_start ;;
  team) cmd_team ;;
  workers) cmd_workers ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) die "usage: $0 start|team|workers|status|stop" ;;
esac
