#!/usr/bin/env bash
# How long retention holds SQLite's writer as the log grows: a store is
# seeded once (tether-load ingest on SESSIONS sessions for SECONDS, then
# DELETED of them disposed and backdated past a 30-day limit), and each
# build given runs retention on its own copy of it. Prints, per build and
# round, the time from setting the limit to the last deletion, and the log's
# rows.
#
#   bench/retention.sh [--sessions N] [--seconds S] [--deleted K]
#                      [--rounds R] DIR...
#
# Each DIR holds a `tether` (release builds); the first one seeds. The load
# tool is TETHER_LOAD_BIN (default: the release build). Needs curl, python3
# and the sqlite3 command-line shell.
set -euo pipefail
cd "$(dirname "$0")/.."

sessions=100
seconds=15
deleted=20
rounds=2
while [ $# -gt 0 ]; do
  case "$1" in
    --sessions) sessions="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --deleted) deleted="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -ge 1 ] || { sed -n 2,14p "$0" >&2; exit 2; }
load="${TETHER_LOAD_BIN:-${CARGO_TARGET_DIR:-target}/release/tether-load}"
port="${TETHER_BENCH_PORT:-17992}"
base="http://127.0.0.1:$port"
work=$(mktemp -d)
server=""
stop() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  server=""
}
trap 'stop; rm -rf "$work"' EXIT

start() { # BINARY DB [ARGS...]
  local bin="$1" db="$2"
  shift 2
  RUST_LOG=warn "$bin" serve --bind "127.0.0.1:$port" --database-url "sqlite://$db" "$@" \
    >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    curl -sf "$base/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "the server did not start:" >&2
  cat "$work/server.log" >&2
  exit 1
}

echo "seeding: $sessions sessions, ${seconds}s of ingest, $deleted disposed"
start "$1/tether" "$work/seed.db"
"$load" --url "ws://127.0.0.1:$port/ahp" ingest --sessions "$sessions" --in-flight 16 \
  --duration "$seconds" >/dev/null
ids=$(curl -sf "$base/v1/sessions?limit=$deleted" |
  python3 -c 'import json,sys; print("\n".join(s["id"] for s in json.load(sys.stdin)["items"]))')
project=$(curl -sf "$base/v1/sessions?limit=1" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["items"][0]["project"])')
for id in $ids; do
  curl -sf -X DELETE "$base/v1/sessions/$id" >/dev/null
done
stop
ago=$((31 * 86400000))
listed=$(printf "'%s'," $ids)
sqlite3 "$work/seed.db" "UPDATE sessions SET updated_ms = updated_ms - $ago, \
  idle_hour = (updated_ms - $ago) / 3600000 WHERE id IN (${listed%,});"
rows=$(sqlite3 "$work/seed.db" "SELECT count(*) FROM log")
echo "log rows: $rows; project $project"

for round in $(seq "$rounds"); do
  for dir in "$@"; do
    cp "$work/seed.db" "$work/run.db"
    rm -f "$work/run.db-wal" "$work/run.db-shm"
    start "$dir/tether" "$work/run.db" --retention-interval-secs 1
    began=$(date +%s.%N)
    curl -sf -X PUT -H 'content-type: application/json' -d '{"days": 30}' \
      "$base/v1/projects/$project/retention" >/dev/null
    while :; do
      done_count=$(curl -sf "$base/metrics" |
        awk '/^tether_retention_deleted_sessions_total/ {print $2}')
      [ "${done_count:-0}" -ge "$deleted" ] && break
      sleep 0.05
    done
    ended=$(date +%s.%N)
    left=$(sqlite3 "$work/run.db" "SELECT count(*) FROM log")
    stop
    python3 -c "print(f'round $round, $dir: {$ended - $began:.2f} s to delete $deleted sessions; log rows left: $left')"
  done
done
