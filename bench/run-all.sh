#!/usr/bin/env bash
# Runs every load scenario of BENCHMARKS.md against a fresh server per
# scenario and backend, and prints the figures.
#
#   cargo build --release -p tether-server -p tether-bench
#   bench/run-all.sh                 # every scenario, SQLite and Postgres
#   bench/run-all.sh --quick         # small scale: proves the tools work
#   bench/run-all.sh --backends sqlite --only "ingest-16 catchup"
#
# Options:
#   --quick              small scale (seconds, not minutes)
#   --backends "LIST"    sqlite and/or postgres (default: both)
#   --only "LIST"        case names to run (see CASES below; default: all)
#   --out FILE           JSON result lines (default:
#                        <target dir>/bench-results-<time>.jsonl)
#
# Environment:
#   TETHER_BIN, TETHER_LOAD_BIN   the binaries (default: the release build in
#                                 $CARGO_TARGET_DIR or ./target)
#   TETHER_BENCH_POSTGRES_URL     a Postgres server whose user may create
#                                 databases (default
#                                 postgres://postgres@127.0.0.1:5432/postgres);
#                                 each case gets a fresh database, dropped after
#   TETHER_BENCH_PORT             the port the servers listen on (default 17979)
#
# The server and the load tool run on this machine and share its cores; every
# figure comes with the CPU share of each. The open-file limit is raised to the
# hard limit for both (10,000 connections need about 10,100 on each side).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
backends="sqlite postgres"
only=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --backends) backends="$2"; shift ;;
    --only) only="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

target="${CARGO_TARGET_DIR:-target}"
out="${out:-$target/bench-results-$(date +%Y%m%d-%H%M%S).jsonl}"
tether="${TETHER_BIN:-$target/release/tether}"
load="${TETHER_LOAD_BIN:-$target/release/tether-load}"
pg_admin="${TETHER_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
port="${TETHER_BENCH_PORT:-17979}"
for bin in "$tether" "$load"; do
  if [ ! -x "$bin" ]; then
    echo "$bin is missing: cargo build --release -p tether-server -p tether-bench" >&2
    exit 2
  fi
done

# name | extra server flags | load tool arguments
if [ "$quick" = 1 ]; then
  CASES=(
    "ingest-16||ingest --sessions 10 --in-flight 16 --duration 3 --warmup 1"
    "ingest-1||ingest --sessions 10 --in-flight 1 --duration 3 --warmup 1"
    "fanout-1000x200||fanout --subscribers 50 --rate 200 --duration 3"
    "fanout-1000x50||fanout --subscribers 50 --rate 50 --duration 3"
    "fanout-100x200||fanout --subscribers 20 --rate 200 --duration 3"
    "connections||connections --connections 500 --hold 2"
    "catchup|--max-replay 200000 --max-replay-bytes 268435456|catchup --envelopes 5000"
    "list||list --sessions 2000 --envelopes 5000 --requests 300"
  )
else
  CASES=(
    "ingest-16||ingest --sessions 100 --in-flight 16 --duration 10"
    "ingest-1||ingest --sessions 100 --in-flight 1 --duration 10"
    "fanout-1000x200||fanout --subscribers 1000 --rate 200 --duration 10"
    "fanout-1000x50||fanout --subscribers 1000 --rate 50 --duration 10"
    "fanout-100x200||fanout --subscribers 100 --rate 200 --duration 10"
    "connections||connections --connections 10000"
    "catchup|--max-replay 200000 --max-replay-bytes 268435456|catchup --envelopes 100000"
    "list||list --sessions 100000 --envelopes 100000"
  )
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
work=$(mktemp -d)
server=""
pg_db=""
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if [ -n "$pg_db" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== machine"
echo "cores: $(nproc); memory: $(free -h | awk '/^Mem:/ {print $2}'); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "open files: $(ulimit -n); load average now: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews the figures)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); results: $out"

start_server() { # backend, case name, extra flags
  local backend=$1 name=$2 extra=$3 url
  case "$backend" in
    sqlite)
      mkdir -p "$work/$name"
      url="sqlite:$work/$name/tether.db"
      ;;
    postgres)
      pg_db="tether_bench_${name//-/_}_$$"
      psql "$pg_admin" -qc "CREATE DATABASE $pg_db" >/dev/null
      url="${pg_admin%/*}/$pg_db"
      ;;
  esac
  # shellcheck disable=SC2086 # $extra holds several flags
  RUST_LOG=warn "$tether" serve --bind "127.0.0.1:$port" --database-url "$url" $extra \
    >"$work/server-$backend-$name.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
    if ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "the server did not become ready; its log:" >&2
  tail -20 "$work/server-$backend-$name.log" >&2
  return 1
}

stop_server() {
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  server=""
  if [ -n "$pg_db" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
    pg_db=""
  fi
  rm -rf "${work:?}"/*/
}

failed=()
for backend in $backends; do
  if [ "$backend" = postgres ] && ! psql "$pg_admin" -qc "SELECT 1" >/dev/null 2>&1; then
    echo "== postgres: SKIPPED, cannot reach $pg_admin (set TETHER_BENCH_POSTGRES_URL)"
    failed+=("postgres:unreachable")
    continue
  fi
  for case in "${CASES[@]}"; do
    IFS='|' read -r name extra args <<<"$case"
    if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then
      continue
    fi
    echo
    echo "== $backend $name: tether-load $args${extra:+   (server: $extra)}"
    start_server "$backend" "$name" "$extra" || { failed+=("$backend:$name"); stop_server; continue; }
    # shellcheck disable=SC2086 # $args holds the scenario and its flags
    if ! "$load" --url "ws://127.0.0.1:$port/ahp" --server-pid "$server" --json-file "$out" $args; then
      failed+=("$backend:$name")
      echo "-- server log (last lines):"
      tail -5 "$work/server-$backend-$name.log"
    fi
    stop_server
  done
done

echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "every case ran and every check held; JSON lines in $out"
else
  echo "failed: ${failed[*]}; JSON lines of the others in $out"
  exit 1
fi
