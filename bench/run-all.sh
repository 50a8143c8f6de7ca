#!/usr/bin/env bash
# Runs every load scenario of BENCHMARKS.md against a fresh server per
# scenario and backend, and prints the figures.
#
#   cargo build --release -p tether-server -p tether-bench
#   bench/run-all.sh                 # every scenario, SQLite and Postgres
#   bench/run-all.sh --quick         # small scale: proves the tools work
#   bench/run-all.sh --backends sqlite --only "ingest-16 catchup"
#   bench/run-all.sh --with-peer     # also the reference peer, case by case
#
# Options:
#   --quick              small scale (seconds, not minutes)
#   --backends "LIST"    sqlite and/or postgres (default: both)
#   --only "LIST"        case names to run (see CASES below; default: all)
#   --out FILE           JSON result lines (default:
#                        <target dir>/bench-results-<time>.jsonl)
#   --with-peer          run case by case instead of backend by backend: each
#                        case the reference peer can run (ingest and fanout)
#                        first on the peer (a fresh node process, a fresh
#                        database), then on the storage-free floor
#                        (tether-floor: in memory, on the peer's wire), then on
#                        Tether on each backend; the other cases on Tether
#                        only; at the end, a table of the main figures with
#                        each Tether figure's ratio to the peer's and the
#                        floor's.
#                        Needs node and npm: the peer's node_modules are
#                        installed once per run (npm ci) into a temporary
#                        directory, never into the repository
#
# Environment:
#   TETHER_BIN, TETHER_LOAD_BIN,  the binaries (default: the release build in
#   TETHER_FLOOR_BIN              $CARGO_TARGET_DIR or ./target)
#   TETHER_BENCH_POSTGRES_URL     a Postgres server whose user may create
#                                 databases (default
#                                 postgres://postgres@127.0.0.1:5432/postgres);
#                                 each case gets a fresh database, dropped after
#   TETHER_BENCH_PORT             the port the servers listen on (default 17979)
#   TETHER_BENCH_PEER_DIR         the reference peer's sources (server.js,
#                                 package.json, package-lock.json; default
#                                 ../shared/reference/peer beside the repository;
#                                 a relative path is from the repository root)
#
# The server and the load tool run on this machine and share its cores; every
# figure comes with the CPU share of each. The open-file limit is raised to the
# hard limit for both (10,000 connections need about 10,100 on each side).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
with_peer=0
backends="sqlite postgres"
only=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --backends) backends="$2"; shift ;;
    --only) only="$2"; shift ;;
    --out) out="$2"; shift ;;
    --with-peer) with_peer=1 ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

target="${CARGO_TARGET_DIR:-target}"
out="${out:-$target/bench-results-$(date +%Y%m%d-%H%M%S).jsonl}"
tether="${TETHER_BIN:-$target/release/tether}"
load="${TETHER_LOAD_BIN:-$target/release/tether-load}"
floor="${TETHER_FLOOR_BIN:-$target/release/tether-floor}"
pg_admin="${TETHER_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
port="${TETHER_BENCH_PORT:-17979}"
peer_src="${TETHER_BENCH_PEER_DIR:-../shared/reference/peer}"
for bin in "$tether" "$load"; do
  if [ ! -x "$bin" ]; then
    echo "$bin is missing: cargo build --release -p tether-server -p tether-bench" >&2
    exit 2
  fi
done
if [ "$with_peer" = 1 ]; then
  if [ ! -x "$floor" ]; then
    echo "$floor is missing: cargo build --release -p tether-bench" >&2
    exit 2
  fi
  for tool in node npm python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "--with-peer needs $tool (the reference peer runs on Node.js 20 with npm; python3 makes the table); install it or leave --with-peer out" >&2
      exit 2
    fi
  done
  for file in server.js package.json package-lock.json; do
    if [ ! -f "$peer_src/$file" ]; then
      echo "--with-peer: no $file in $peer_src; set TETHER_BENCH_PEER_DIR to the reference peer's directory" >&2
      exit 2
    fi
  done
fi

# name | extra server flags | load tool arguments
if [ "$quick" = 1 ]; then
  CASES=(
    "ingest-16||ingest --sessions 10 --in-flight 16 --duration 3 --warmup 1"
    "ingest-16-noindex|--no-search-index|ingest --sessions 10 --in-flight 16 --duration 3 --warmup 1"
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
    "ingest-16-noindex|--no-search-index|ingest --sessions 100 --in-flight 16 --duration 10"
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
peer_dir=""
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  if [ -n "$pg_db" ]; then
    psql "$pg_admin" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
  if [ -n "$peer_dir" ]; then rm -rf "$peer_dir"; fi
}
trap cleanup EXIT

echo "== machine"
echo "cores: $(nproc); memory: $(free -h | awk '/^Mem:/ {print $2}'); cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "open files: $(ulimit -n); load average now: $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews the figures)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); results: $out"

if [ "$with_peer" = 1 ]; then
  # A copy outside the repository: npm ci writes node_modules beside it.
  peer_dir=$(mktemp -d)
  cp -r "$peer_src/." "$peer_dir/"
  chmod -R u+w "$peer_dir"
  echo "== peer: npm ci into a temporary directory (once per run; builds better-sqlite3)"
  if ! (cd "$peer_dir" && npm ci --no-audit --no-fund && npm rebuild better-sqlite3) \
    >"$peer_dir/npm.log" 2>&1; then
    echo "--with-peer: installing the peer's packages failed; the end of npm's log:" >&2
    tail -20 "$peer_dir/npm.log" >&2
    exit 2
  fi
  echo "node $(node --version); peer sources: $peer_src"
fi

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
  await_ready /readyz "the server did not become ready" "$work/server-$backend-$name.log"
}

await_ready() { # path, what to say if it never answers, log file
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port$1" >/dev/null 2>&1 && return 0
    if ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "$2; its log:" >&2
  tail -20 "$3" >&2
  return 1
}

start_peer() { # case name
  local name=$1
  mkdir -p "$work/peer-$name"
  DB="$work/peer-$name/peer.db" PORT="$port" node "$peer_dir/server.js" \
    >"$work/server-peer-$name.log" 2>&1 &
  server=$!
  await_ready /healthz "the peer did not start" "$work/server-peer-$name.log"
}

start_floor() { # case name
  "$floor" --bind "127.0.0.1:$port" >"$work/server-floor-$1.log" 2>&1 &
  server=$!
  await_ready /healthz "the floor did not start" "$work/server-floor-$1.log"
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

# Which line of $out each run wrote, for the table: "case who line".
sitting="$work/sitting"
: >"$sitting"
lines_out() { if [ -f "$out" ]; then wc -l <"$out"; else echo 0; fi; }

run_case() { # who (a backend, peer or floor), case name, extra server flags, load arguments
  local who=$1 name=$2 extra=$3 args=$4 before
  echo
  if [ "$who" = peer ] || [ "$who" = floor ]; then
    echo "== $who $name: tether-load --target peer $args"
    "start_$who" "$name" || { failed+=("$who:$name"); stop_server; return 0; }
    set -- --target peer --url "ws://127.0.0.1:$port/ws"
  else
    echo "== $who $name: tether-load $args${extra:+   (server: $extra)}"
    start_server "$who" "$name" "$extra" || { failed+=("$who:$name"); stop_server; return 0; }
    set -- --url "ws://127.0.0.1:$port/ahp"
  fi
  before=$(lines_out)
  # shellcheck disable=SC2086 # $args holds the scenario and its flags
  if ! "$load" "$@" --server-pid "$server" --json-file "$out" $args; then
    failed+=("$who:$name")
    echo "-- server log (last lines):"
    tail -5 "$work/server-$who-$name.log"
  fi
  if [ "$(lines_out)" -gt "$before" ]; then
    echo "$name $who $(lines_out)" >>"$sitting"
  fi
  stop_server
}

reachable() { # backend
  if [ "$1" = postgres ] && ! psql "$pg_admin" -qc "SELECT 1" >/dev/null 2>&1; then
    echo "== postgres: SKIPPED, cannot reach $pg_admin (set TETHER_BENCH_POSTGRES_URL)"
    failed+=("postgres:unreachable")
    return 1
  fi
}

failed=()
if [ "$with_peer" = 0 ]; then
  for backend in $backends; do
    reachable "$backend" || continue
    for case in "${CASES[@]}"; do
      IFS='|' read -r name extra args <<<"$case"
      if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then
        continue
      fi
      run_case "$backend" "$name" "$extra" "$args"
    done
  done
else
  # Case by case, so the peer and Tether run each case minutes apart.
  usable=()
  for backend in $backends; do
    if reachable "$backend"; then usable+=("$backend"); fi
  done
  peer_cases=()
  for case in "${CASES[@]}"; do
    IFS='|' read -r name extra args <<<"$case"
    if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then
      continue
    fi
    case "${args%% *}" in
      ingest|fanout)
        peer_cases+=("$name")
        run_case peer "$name" "" "$args"
        run_case floor "$name" "" "$args"
        ;;
    esac
    for backend in "${usable[@]}"; do
      run_case "$backend" "$name" "$extra" "$args"
    done
  done
  if [ ${#peer_cases[@]} -gt 0 ] && [ -s "$sitting" ]; then
    echo
    echo "== Tether against the reference peer and the floor (ratios: Tether's figure / the peer's; / the floor's)"
    python3 - "$out" "$sitting" "${usable[*]}" "${peer_cases[@]}" <<'PY'
import json
import sys

out, sitting, backends, cases = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
lines = open(out).read().splitlines()
runs = {}
for row in open(sitting):
    name, who, line = row.split()
    runs[(name, who)] = json.loads(lines[int(line) - 1])

# The main figures of each scenario: (label, figure name or latency name,
# kind): a figure, a latency's p99, or the server's CPU per action (the
# load tool's figure, in µs; on Postgres the database's own comes beside
# it, as the load tool's CPU per action of everything else on the machine).
MAIN = {
    "ingest": [("durable actions/s", "durable actions/s", "figure"),
               ("ack p99 ms", "ack latency (dispatch -> echo)", "p99"),
               ("server CPU µs per action", "server CPU per action", "cpu")],
    "fanout": [("delivery p99 ms", "dispatch -> delivery, every subscriber", "p99"),
               ("deliveries/s", "deliveries/s", "figure")],
}

def value(report, name, kind):
    phase = report["phases"][0]
    if kind == "p99":
        return next(l["p99Ms"] for l in phase["latencies"] if l["name"] == name)
    return next((f["value"] for f in phase["figures"] if f["name"] == name), 0)

def show(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"

def cell(report, name, kind, peer=None, floor=None):
    if report is None:
        return "-"
    v = value(report, name, kind)
    text = show(v) + ("" if all(c["ok"] for c in report["checks"]) else " !")
    # Both ratios, in the header's order, "-" where a base run is missing.
    if peer is not None or floor is not None:
        ratios = [f"{v / base:.2f}x" if base else "-" for base in (peer, floor)]
        text += f" ({'; '.join(ratios)})"
    if kind == "cpu" and report.get("backend") == "postgres":
        text += f" + {value(report, 'other CPU per action', kind):.3g} else"
    return text

print("| case | figure | peer | floor | " + " | ".join(f"tether {b}" for b in backends) + " |")
print("|---|---|---|---|" + "---|" * len(backends))
for name in cases:
    peer = runs.get((name, "peer"))
    floor = runs.get((name, "floor"))
    scenario = next((r["scenario"] for (n, _), r in runs.items() if n == name), None)
    for label, figure, kind in MAIN.get(scenario, []):
        bases = [value(r, figure, kind) if r else None for r in (peer, floor)]
        row = [name, label, cell(peer, figure, kind), cell(floor, figure, kind)]
        row += [cell(runs.get((name, b)), figure, kind, *bases) for b in backends]
        print("| " + " | ".join(row) + " |")
    if scenario is None:
        print(f"| {name} | every run failed | - | - |" + " - |" * len(backends))
print("(! = a check failed in that run; - = no result)")
PY
  fi
fi
echo
if [ ${#failed[@]} -eq 0 ]; then
  echo "every case ran and every check held; JSON lines in $out"
else
  echo "failed: ${failed[*]}; JSON lines of the others in $out"
  exit 1
fi
