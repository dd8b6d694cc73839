#!/usr/bin/env bash
# A private PostgreSQL cluster for the Prefect server of a team stack (`scripts/stack.sh team` runs it).
#
#   scripts/postgres.sh start    initdb on first use, start on 127.0.0.1:$DUBFLOW_PG_PORT, create the
#                                role and database `prefect`; prints the connection URL for Prefect
#   scripts/postgres.sh url      the connection URL (postgresql+asyncpg://prefect:<password>@127.0.0.1:port/prefect)
#   scripts/postgres.sh status   exit 0 when the cluster runs
#   scripts/postgres.sh stop     fast shutdown (pg_ctl -m fast)
#   scripts/postgres.sh install  apt-get install postgresql when no initdb is found (root, Debian)
#
# DUBFLOW_PG_DIR (default $PREFECT_HOME/postgres) holds data/, the socket, pg.log and the generated
# password (mode 600); DUBFLOW_PG_PORT (default 5433). PostgreSQL refuses to run as root: as root the
# cluster runs as the `postgres` system user (Debian's package creates it), so DUBFLOW_PG_DIR must be a
# folder that user can enter (not below a 0700 folder of root's). Only loopback listens; password auth.
# `start` installs the Debian package itself when run as root without one (what CI relies on).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

PG_DIR="${DUBFLOW_PG_DIR:-$PREFECT_HOME/postgres}"
PG_PORT="${DUBFLOW_PG_PORT:-5433}"
DATA="$PG_DIR/data"

say() { printf 'postgres: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

bin_dir() {
  local found
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return; fi
  found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

cmd_install() {
  if bin_dir >/dev/null; then return 0; fi
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 ||
    die "no PostgreSQL server found (initdb): install it (Debian: apt-get install -y postgresql)"
  say "installing PostgreSQL (apt-get install -y postgresql)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q postgresql >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; } ||
    die "apt-get install -y postgresql failed"
  bin_dir >/dev/null || die "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
}

# as_owner CMD...: run CMD as the cluster's owner (the postgres user when we are root).
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

password() { cat "$PG_DIR/password"; }

cmd_url() {
  [ -f "$PG_DIR/password" ] || die "no cluster in $PG_DIR (run scripts/postgres.sh start)"
  echo "postgresql+asyncpg://prefect:$(password)@127.0.0.1:$PG_PORT/prefect"
}

running() { [ -d "$DATA" ] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

psql_super() {
  PGPASSWORD="$(password)" "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"
}

cmd_start() {
  cmd_install
  BIN="$(bin_dir)"
  mkdir -p "$PG_DIR"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs the postgres system user (Debian's postgresql package)"
    chown postgres: "$PG_DIR"
    runuser -u postgres -- test -w "$PG_DIR" ||
      die "the postgres user cannot write $PG_DIR (a parent folder is private): set DUBFLOW_PG_DIR"
  fi
  if [ ! -f "$DATA/PG_VERSION" ]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$PG_DIR/password")
    [ "$(id -u)" = 0 ] && chown postgres: "$PG_DIR/password"
    as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=scram-sha-256 --pwfile="$PG_DIR/password" \
      -E UTF8 >"$PG_DIR/initdb.log" 2>&1 || { tail -n 20 "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
    say "cluster created in $DATA"
  fi
  if running; then
    say "already running (port $PG_PORT)"
  else
    as_owner "$BIN/pg_ctl" -D "$DATA" -l "$PG_DIR/pg.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR" start >/dev/null ||
      { tail -n 20 "$PG_DIR/pg.log" >&2; die "pg_ctl start failed (log: $PG_DIR/pg.log)"; }
    say "started on 127.0.0.1:$PG_PORT (log $PG_DIR/pg.log)"
  fi
  if [ -z "$(psql_super -tA -c "select 1 from pg_roles where rolname = 'prefect'")" ]; then
    psql_super -c "create role prefect login password '$(password)'" -c "create database prefect owner prefect"
    say "role and database prefect created"
  fi
  cmd_url
}

cmd_stop() {
  BIN="$(bin_dir)" || { say "no PostgreSQL installed: nothing to stop"; return 0; }
  if running; then
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    say "stopped"
  fi
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  url) cmd_url ;;
  status) BIN="$(bin_dir)" && running ;;
  stop) cmd_stop ;;
  *) die "usage: $0 install|start|url|status|stop" ;;
esac
