#!/usr/bin/env bash
# How long retention holds the store's writes as the log grows (SQLite's
# writer; on Postgres, the host row every append locks): a store is
# seeded once (tether-load ingest on SESSIONS sessions for SECONDS, then
# DELETED of them disposed and backdated past a 30-day limit), and each
# build given runs retention on its own copy of it. Prints, per build and
# round, the time from setting the limit to the last deletion, and the log's
# rows.
#
#   bench/retention.sh [--backend sqlite|postgres] [--sessions N]
#                      [--seconds S] [--deleted K] [--rounds R] DIR...
#
# Each DIR holds a `tether` (release builds); the first one seeds. The load
# tool is TETHER_LOAD_BIN (default: the release build). Needs curl, python3
# and the sqlite3 command-line shell, or psql and TETHER_BENCH_POSTGRES_URL
# (default postgres://postgres@127.0.0.1:5432/postgres) for Postgres, where
# the seed and each run are databases of their own (dropped at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

sessions=100
seconds=15
deleted=20
rounds=2
backend=sqlite
while [ $# -gt 0 ]; do
  case "$1" in
    --sessions) sessions="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --deleted) deleted="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --backend) backend="$2"; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -ge 1 ] || { sed -n 2,17p "$0" >&2; exit 2; }
case "$backend" in sqlite|postgres) ;; *) echo "unknown backend $backend" >&2; exit 2 ;; esac
admin="${TETHER_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
pg_db() { # NAME: the URL of database NAME on the admin URL's server
  python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/"+sys.argv[2])))' "$admin" "$1"
}
export PGOPTIONS="-c client_min_messages=warning"
seed_db=tether_retention_seed
run_db=tether_retention_run
sql() { # DB SQL: runs SQL on the store DB ("seed" or "run")
  if [ "$backend" = sqlite ]; then
    sqlite3 "$work/$1.db" "$2"
  else
    psql -qAt "$(pg_db "tether_retention_$1")" -c "$2"
  fi
}
store_url() { # DB
  if [ "$backend" = sqlite ]; then echo "sqlite://$work/$1.db"; else pg_db "tether_retention_$1"; fi
}
drop_dbs() {
  if [ "$backend" = postgres ]; then
    psql -qAt "$admin" -c "DROP DATABASE IF EXISTS $run_db" -c "DROP DATABASE IF EXISTS $seed_db" >/dev/null
  fi
}
load="${TETHER_LOAD_BIN:-${CARGO_TARGET_DIR:-target}/release/tether-load}"
port="${TETHER_BENCH_PORT:-17992}"
base="http://127.0.0.1:$port"
work=$(mktemp -d)
server=""
stop() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  server=""
}
trap 'stop; drop_dbs; rm -rf "$work"' EXIT

start() { # BINARY DB [ARGS...]
  local bin="$1" db="$2"
  shift 2
  RUST_LOG=warn "$bin" serve --bind "127.0.0.1:$port" --database-url "$(store_url "$db")" "$@" \
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
drop_dbs
if [ "$backend" = postgres ]; then psql -qAt "$admin" -c "CREATE DATABASE $seed_db" >/dev/null; fi
start "$1/tether" seed
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
if [ "$backend" = sqlite ]; then
  sql seed "UPDATE sessions SET updated_ms = updated_ms - $ago, \
    idle_hour = (updated_ms - $ago) / 3600000 WHERE id IN (${listed%,});"
else # idle_hour is a generated column there
  sql seed "UPDATE sessions SET updated_ms = updated_ms - $ago WHERE id IN (${listed%,});"
fi
# The statistics autovacuum would have gathered on a log this size by now
# (a copy of a database keeps them).
[ "$backend" = sqlite ] || sql seed "ANALYZE"
rows=$(sql seed "SELECT count(*) FROM log")
echo "log rows: $rows; project $project"

for round in $(seq "$rounds"); do
  for dir in "$@"; do
    if [ "$backend" = sqlite ]; then
      cp "$work/seed.db" "$work/run.db"
      rm -f "$work/run.db-wal" "$work/run.db-shm"
    else
      psql -qAt "$admin" -c "DROP DATABASE IF EXISTS $run_db" \
        -c "CREATE DATABASE $run_db TEMPLATE $seed_db" >/dev/null
    fi
    start "$dir/tether" run --retention-interval-secs 1
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
    left=$(sql run "SELECT count(*) FROM log")
    stop
    python3 -c "print(f'round $round, $dir: {$ended - $began:.2f} s to delete $deleted sessions; log rows left: $left')"
  done
done
