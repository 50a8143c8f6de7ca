#!/usr/bin/env bash
# What a streamed answer costs the server, with the search index and
# without: each build given serves a fresh store, the test suite's fake ACP
# agent streams one answer of DELTAS deltas (`stream N`: "chunkI " every
# 5 ms, each delta its own commit or nearly), and the server's CPU time
# (user + system, from /proc) from the turn's start to its end is printed,
# with the longest search document written. On Postgres the database's
# CPU is printed beside it (every `postgres` process's, sampled before and
# after: the machine should be otherwise quiet).
#
#   bench/stream-index.sh [--backend sqlite|postgres] [--deltas N]
#                         [--history T] DIR...
#
# With --history, T turns come first (each an answer of 1,000 deltas sent
# as fast as the agent can, `flood 1000`, about 4 KB), so the chat holds a
# history the measured answer streams after.
#
# Each DIR holds a `tether` (release builds); each runs with the index and
# with `--no-search-index`. The agent is TETHER_FAKE_AGENT (default: the
# debug build's `fake-acp-agent`: `cargo build -p tether-tests --bin
# fake-acp-agent`). Needs curl and python3, and for Postgres psql and
# TETHER_BENCH_POSTGRES_URL (default
# postgres://postgres@127.0.0.1:5432/postgres), where each run gets a
# database of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

deltas=4000
history=0
backend=sqlite
while [ $# -gt 0 ]; do
  case "$1" in
    --deltas) deltas="$2"; shift ;;
    --history) history="$2"; shift ;;
    --backend) backend="$2"; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -ge 1 ] || { sed -n 2,24p "$0" >&2; exit 2; }
case "$backend" in sqlite|postgres) ;; *) echo "unknown backend $backend" >&2; exit 2 ;; esac
agent="${TETHER_FAKE_AGENT:-$PWD/target/debug/fake-acp-agent}"
[ -x "$agent" ] || { echo "no fake agent at $agent" >&2; exit 2; }
admin="${TETHER_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export PGOPTIONS="-c client_min_messages=warning"
db_name=tether_stream_index
port="${TETHER_BENCH_PORT:-17991}"
base="http://127.0.0.1:$port"
work=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null || true
  if [ "$backend" = postgres ]; then
    psql -qAt "$admin" -c "DROP DATABASE IF EXISTS $db_name" >/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

ticks() { # PID...: their user + system CPU ticks
  local total=0 pid
  for pid in "$@"; do
    if [ -r "/proc/$pid/stat" ]; then
      total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    fi
  done
  echo "$total"
}
postgres_ticks() { ticks $(pgrep -x postgres || true); }
seconds() { python3 -c "import sys; print(f'{int(sys.argv[1]) / $(getconf CLK_TCK):.2f}')" "$1"; }

ask() { # TURN TEXT: starts the turn and waits for its end
  curl -sf -XPOST "$base/v1/sessions/s1/actions" -H 'content-type: application/json' \
    -d "{\"clientId\":\"bench\",\"clientSeq\":$((++asked)),\"channel\":\"ahp-chat:/s1.main\",\"action\":{\"type\":\"chat/turnStarted\",\"turnId\":\"$1\",\"startedAt\":\"2026-12-06T10:00:00.000Z\",\"message\":{\"text\":\"$2\",\"origin\":{\"kind\":\"user\"}}}}" >/dev/null
  until curl -sf "$base/v1/sessions/s1" | python3 -c "import sys,json; sys.exit(json.load(sys.stdin)['projection'].get('openTurnId') is not None)"; do
    sleep 0.1
  done
}
asked=0

run() { # BIN LABEL [serve args...]
  local bin=$1 label=$2 url
  shift 2
  if [ "$backend" = sqlite ]; then
    rm -f "$work"/db*
    url="sqlite://$work/db"
  else
    psql -qAt "$admin" -c "DROP DATABASE IF EXISTS $db_name" -c "CREATE DATABASE $db_name" >/dev/null
    url=$(python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/'"$db_name"'")))' "$admin")
  fi
  "$bin" serve --bind "127.0.0.1:$port" --database-url "$url" \
    --agent "fake=$agent" --agent-confinement off "$@" >"$work/log" 2>&1 &
  server=$!
  for _ in $(seq 100); do curl -sf "$base/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -sf -XPOST "$base/v1/sessions" -H 'content-type: application/json' \
    -d '{"id":"s1","project":"p","provider":"fake"}' >/dev/null
  local turn
  for turn in $(seq "$history"); do
    ask "h$turn" "flood 1000"
  done
  local cpu0 pg0 t0 cpu1 pg1 t1
  cpu0=$(ticks "$server"); pg0=$(postgres_ticks); t0=$(date +%s.%N)
  ask t0 "stream $deltas"
  cpu1=$(ticks "$server"); pg1=$(postgres_ticks); t1=$(date +%s.%N)
  local longest
  if [ "$backend" = sqlite ]; then
    longest=$(python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('SELECT coalesce(max(length(body)), 0) FROM search_docs').fetchone()[0])" "$work/db")
  else
    longest=$(psql -qAt "$url" -c "SELECT coalesce(max(length(body)), 0) FROM search_docs")
  fi
  local line="$label: server CPU $(seconds $((cpu1 - cpu0))) s"
  [ "$backend" = postgres ] && line="$line, Postgres CPU $(seconds $((pg1 - pg0))) s"
  echo "$line; wall $(python3 -c "print(f'{$t1 - $t0:.1f}')") s; longest search document $longest bytes"
  kill "$server"; wait "$server" 2>/dev/null || true
  server=""
}

echo "backend $backend, one answer of $deltas deltas after $history turns"
for dir in "$@"; do
  run "$dir/tether" "$dir, indexed"
  run "$dir/tether" "$dir, --no-search-index" --no-search-index
done
