#!/usr/bin/env bash
# Several Tether hosts on one Postgres database: ingest and fan-out with 1,
# 2 and 3 hosts (BENCHMARKS.md, "Several hosts"). Every case gets a fresh
# database and fresh hosts; the load tool spreads its connections over the
# hosts round-robin and reports each host's CPU.
#
#   cargo build --release -p tether-server -p tether-bench
#   bench/cluster.sh                  # 1, 2 and 3 hosts
#   bench/cluster.sh --hosts "1 2" --quick
#
# Environment: TETHER_BIN, TETHER_LOAD_BIN, TETHER_BENCH_POSTGRES_URL and
# TETHER_BENCH_PORT (first host's port; the others follow) as for
# bench/run-all.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
counts="1 2 3"
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --hosts) counts="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

target="${CARGO_TARGET_DIR:-target}"
out="${out:-$target/bench-cluster-$(date +%Y%m%d-%H%M%S).jsonl}"
tether="${TETHER_BIN:-$target/release/tether}"
load="${TETHER_LOAD_BIN:-$target/release/tether-load}"
pg_admin="${TETHER_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
port="${TETHER_BENCH_PORT:-17979}"
for bin in "$tether" "$load"; do
  [ -x "$bin" ] || { echo "$bin is missing: cargo build --release -p tether-server -p tether-bench" >&2; exit 2; }
done

if [ "$quick" = 1 ]; then
  CASES=(
    "ingest-16|ingest --sessions 12 --in-flight 16 --duration 3 --warmup 1"
    "fanout-1000x200|fanout --subscribers 60 --rate 200 --duration 3"
  )
else
  CASES=(
    "ingest-16|ingest --sessions 99 --in-flight 16 --duration 10"
    "ingest-1|ingest --sessions 99 --in-flight 1 --duration 10"
    "fanout-1000x200|fanout --subscribers 999 --rate 200 --duration 10"
    "fanout-12x50|fanout --subscribers 12 --rate 50 --duration 10"
  )
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
work=$(mktemp -d)
pids=()
pg_db=""
stop_hosts() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  if [ -n "$pg_db" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
    pg_db=""
  fi
}
trap 'stop_hosts; rm -rf "$work"' EXIT

echo "== machine"
echo "cores: $(nproc); load average now: $(cut -d' ' -f1-3 /proc/loadavg); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

failed=()
for n in $counts; do
  for case in "${CASES[@]}"; do
    IFS='|' read -r name args <<<"$case"
    pg_db="tether_cluster_${name//-/_}_${n}_$$"
    psql "$pg_admin" -qc "CREATE DATABASE $pg_db" >/dev/null
    url="${pg_admin%/*}/$pg_db"
    urls=()
    for i in $(seq 0 $((n - 1))); do
      p=$((port + i))
      RUST_LOG=warn "$tether" serve --bind "127.0.0.1:$p" --database-url "$url" \
        >"$work/host-$i.log" 2>&1 &
      pids+=($!)
      urls+=("ws://127.0.0.1:$p/ahp")
      for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$p/readyz" >/dev/null 2>&1 && break
        sleep 0.1
      done
    done
    echo
    echo "== $n host(s), $name: tether-load $args"
    url_list=$(IFS=,; echo "${urls[*]}")
    pid_list=$(IFS=,; echo "${pids[*]}")
    # shellcheck disable=SC2086 # $args holds the scenario and its flags
    if ! "$load" --url "$url_list" --server-pid "$pid_list" --json-file "$out" $args; then
      failed+=("$n:$name")
      tail -5 "$work"/host-*.log
    fi
    stop_hosts
  done
done
echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "every case ran and every check held; JSON lines in $out"
else
  echo "failed: ${failed[*]}; JSON lines of the others in $out"
  exit 1
fi
