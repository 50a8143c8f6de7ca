#!/usr/bin/env bash
# Instructions per durable action through the real socket: the release
# server runs under callgrind (which counts the same whatever else the
# machine does) while tether-load's ingest drives it twice, a short run and
# a long one; the difference of the two runs' instructions over the
# difference of their committed actions cancels start-up and session
# creation. Prints the per-action total and the inclusive cost of the
# functions that matter most, per action.
#
#   cargo build --release -p tether-server -p tether-bench
#   bench/callgrind-socket.sh                 # SQLite, 10 sessions x 16
#   bench/callgrind-socket.sh --short 10 --long 30 --top 40
#   bench/callgrind-socket.sh --keep DIR      # keeps both callgrind files
#   bench/callgrind-socket.sh --in-flight 1   # one dispatch in flight a session
#   bench/callgrind-socket.sh --sessions 100  # as many sessions as ingest-16 has
#   bench/callgrind-socket.sh --fanout 200 --short 5 --long 15
#       # per delivery instead: one session, 200 subscribers, 10 dispatches/s
#   bench/callgrind-socket.sh --database-url postgres://…/fresh_db
#       # the server's own instructions on Postgres (not Postgres's)
#
# Environment: TETHER_BIN, TETHER_LOAD_BIN (default: the release build),
# TETHER_BENCH_PORT (default 17989).
set -euo pipefail
cd "$(dirname "$0")/.."

short=10
long=30
top=30
keep=""
in_flight=16
sessions=10
fanout=""
database=""
while [ $# -gt 0 ]; do
  case "$1" in
    --short) short="$2"; shift ;;
    --long) long="$2"; shift ;;
    --top) top="$2"; shift ;;
    --keep) keep="$2"; shift ;;
    --in-flight) in_flight="$2"; shift ;;
    --sessions) sessions="$2"; shift ;;
    --fanout) fanout="$2"; shift ;;
    --database-url) database="$2"; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for tool in valgrind callgrind_control callgrind_annotate; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install valgrind)" >&2; exit 2; }
done
target="${CARGO_TARGET_DIR:-target}"
tether="${TETHER_BIN:-$target/release/tether}"
load="${TETHER_LOAD_BIN:-$target/release/tether-load}"
port="${TETHER_BENCH_PORT:-17989}"
work=$(mktemp -d)
server=""
cleanup() {
  if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
database="${database:-sqlite:$work/tether.db}"

RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  "$tether" serve --bind "127.0.0.1:$port" --database-url "$database" \
  >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { tail -20 "$work/server.log"; exit 1; }

# One measured run: zero the counters, drive, dump; prints "actions file"
# (with --fanout, deliveries instead of actions).
run() { # seconds, name
  callgrind_control -z "$server" >/dev/null
  local actions
  if [ -n "$fanout" ]; then
    "$load" --url "ws://127.0.0.1:$port/ahp" fanout --subscribers "$fanout" --rate 10 \
      --duration "$1" >"$work/$2.txt"
    actions=$(grep -o '([0-9]* of [0-9]* delivered' "$work/$2.txt" | grep -o '[0-9]*' | head -1)
  else
    "$load" --url "ws://127.0.0.1:$port/ahp" ingest --sessions "$sessions" --in-flight "$in_flight" \
      --duration "$1" --warmup 0 >"$work/$2.txt"
    actions=$(grep -o 'serverSeq advanced by [0-9]*' "$work/$2.txt" | grep -o '[0-9]*$')
  fi
  callgrind_control -d "$2" "$server" >/dev/null
  local file
  file=$(ls -t "$work"/cg.out.* | head -1)
  echo "$actions $file"
}
read -r short_actions short_file < <(run "$short" short)
read -r long_actions long_file < <(run "$long" long)
if [ -n "$keep" ]; then mkdir -p "$keep" && cp "$short_file" "$keep/short.cg" && cp "$long_file" "$keep/long.cg"; fi
callgrind_annotate --inclusive=yes "$short_file" >"$work/short.txt" 2>/dev/null
callgrind_annotate --inclusive=yes "$long_file" >"$work/long.txt" 2>/dev/null

python3 - "$work/short.txt" "$work/long.txt" "$short_actions" "$long_actions" "$top" "$fanout" <<'EOF'
import re, sys
short_path, long_path, a, b, top, fanout = sys.argv[1:]
a, b, top = int(a), int(b), int(top)
def read(path):
    total, costs = 0, {}
    for line in open(path, errors="replace"):
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+PROGRAM TOTALS", line) or re.match(r"\s*([\d,]+)\s+PROGRAM TOTALS", line)
        if m:
            total = int(m.group(1).replace(",", ""))
            continue
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?\*?\s*(\S.*)$", line)
        if m and ":" in m.group(2):
            name = m.group(2).split(":", 1)[1].strip()
            name = re.sub(r" \[[^\]]*\]$", "", name)
            costs[name] = costs.get(name, 0) + int(m.group(1).replace(",", ""))
    return total, costs
ta, ca = read(short_path)
tb, cb = read(long_path)
n = b - a
print(f"actions: {a} and {b}; instructions: {ta:,} and {tb:,}")
unit = "delivery" if fanout else "durable action"
print(f"instructions per {unit}: {(tb - ta) / n:,.0f}")
rows = sorted(((cb.get(k, 0) - ca.get(k, 0)) / n, k) for k in set(ca) | set(cb))
rows.reverse()
print(f"\ninclusive instructions per {unit.split()[-1]}, top {top}:")
for cost, name in rows[:top]:
    print(f"{cost:12,.0f}  {name[:150]}")
EOF
