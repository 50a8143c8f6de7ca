#!/usr/bin/env bash
# Two builds, alternated, on one case of run-all.sh: each round runs the
# case on build A, then on build B (run-all.sh starts a fresh server and
# store each time), and prints per run the main figure, the server's CPU per
# action and, on Postgres, the CPU per action of the rest of the machine
# (busy cores other than the server's and the load tool's: Postgres's own
# on a quiet machine, as in run-all.sh's peer table).
#
#   bench/ab-ingest.sh [--backend sqlite|postgres] [--case NAME]
#                      [--rounds N] DIR_A DIR_B
#
# DIR_A and DIR_B each hold a `tether` (release builds). Both are driven by
# one load tool, TETHER_LOAD_BIN (default: the release build), which reports
# the CPU figures. NAME is a run-all.sh case (default ingest-1). The
# environment is run-all.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

backend=sqlite
case_name=ingest-1
rounds=3
while [ $# -gt 2 ]; do
  case "$1" in
    --backend) backend="$2"; shift ;;
    --case) case_name="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ $# -eq 2 ] || { sed -n 2,16p "$0" >&2; exit 2; }
load="${TETHER_LOAD_BIN:-${CARGO_TARGET_DIR:-target}/release/tether-load}"
[ -x "$load" ] || { echo "no load tool at $load (cargo build --release -p tether-bench)" >&2; exit 2; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "$case_name on $backend, $rounds rounds, alternated"
for round in $(seq "$rounds"); do
  for dir in "$1" "$2"; do
    lines="$out/$round-$(basename "$dir").jsonl"
    TETHER_BIN="$dir/tether" TETHER_LOAD_BIN="$load" \
      bench/run-all.sh --backends "$backend" --only "$case_name" --out "$lines" >/dev/null
    python3 - "$dir" "$lines" <<'EOF'
import json, sys
dir, path = sys.argv[1:]
for line in open(path):
    result = json.loads(line)
    for phase in result["phases"]:
        figures = {f["name"]: f["value"] for f in phase["figures"]}
        figure = phase["figures"][0]
        text = f"{dir}: {figure['value']:,.0f} {figure['unit']}"
        if "server CPU per action" in figures:
            text += f", server {figures['server CPU per action']:.1f} us/action"
            if result["backend"] == "postgres":
                text += f", rest of the machine {figures['other CPU per action']:.1f} us/action"
        print(text)
EOF
  done
done
