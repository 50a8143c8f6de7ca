#!/usr/bin/env bash
# Two builds, alternated, on one ingest case: for each round and each build,
# a fresh server and store, a short warm-up, then a measured run. Prints the
# rate, the server's CPU per action and, on Postgres, Postgres's own CPU per
# action (every process of the `postgres` user, so run nothing else on it).
#
#   bench/ab-ingest.sh [--backend sqlite|postgres] [--in-flight N]
#                      [--rounds N] [--duration S] DIR_A DIR_B
#
# DIR_A and DIR_B each hold a `tether` and a `tether-load` (release builds).
# Postgres: TETHER_BENCH_POSTGRES_URL (default
# postgres://postgres@127.0.0.1:5432/postgres) is where a database
# `tether_ab` is created and dropped for each run.
set -euo pipefail

backend=sqlite
in_flight=1
rounds=3
duration=10
while [ $# -gt 2 ]; do
  case "$1" in
    --backend) backend="$2"; shift ;;
    --in-flight) in_flight="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --duration) duration="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ $# -eq 2 ] || { sed -n 2,14p "$0" >&2; exit 2; }

port="${TETHER_BENCH_PORT:-17991}"
pg_admin="${TETHER_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
pg_db=tether_ab
dir=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  [ "$backend" = postgres ] && psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1
  rm -rf "$dir"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
postgres_ticks() {
  local total=0 pid t
  for pid in $(ps -u postgres -o pid=); do
    t=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    total=$((total + t))
  done
  echo "$total"
}

run() {
  local bin="$1" url
  rm -rf "${dir:?}"/*
  if [ "$backend" = postgres ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
    psql "$pg_admin" -qc "CREATE DATABASE $pg_db" >/dev/null
    url="${pg_admin%/*}/$pg_db"
  else
    url="sqlite:$dir/tether.db"
  fi
  "$bin/tether" serve --bind "127.0.0.1:$port" --database-url "$url" >"$dir/server.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do
    curl -fs "127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  local load=("$bin/tether-load" --url "ws://127.0.0.1:$port/ahp" --server-pid "$server"
    ingest --sessions 100 --in-flight "$in_flight")
  "${load[@]}" --duration 3 --warmup 1 >/dev/null
  local s0 p0 s1 p1 rate
  s0=$(ticks "$server"); p0=$(postgres_ticks)
  rate=$("${load[@]}" --duration "$duration" --warmup 0 |
    awk '/durable actions\/s/ {print $3}')
  s1=$(ticks "$server"); p1=$(postgres_ticks)
  kill "$server"; wait "$server" 2>/dev/null || true
  server=""
  local hz
  hz=$(getconf CLK_TCK)
  python3 - "$bin" "$rate" "$((s1 - s0))" "$((p1 - p0))" "$duration" "$hz" "$backend" <<'EOF'
import sys
bin, rate, server, pg, duration, hz, backend = sys.argv[1:]
rate, duration, hz = float(rate), float(duration), float(hz)
per = lambda ticks: int(ticks) / hz / (rate * duration) * 1e6
line = f"{bin}: {rate:,.0f} actions/s, server {per(server):.1f} us/action"
if backend == "postgres":
    line += f", postgres {per(pg):.1f} us/action"
print(line)
EOF
}

echo "ingest --sessions 100 --in-flight $in_flight on $backend, $rounds rounds of $duration s"
for _ in $(seq "$rounds"); do
  run "$1"
  run "$2"
done
