#!/usr/bin/env python3
"""Webhook delivery latency: from an event's commit to the receiver's socket.

Starts a receiver (an HTTP server in this process), adds a webhook for
`turn.completed` events of project `hooks` to a running Tether server,
starts echo turns through REST at a steady rate, and reports, for each
event, the time from its commit (the body's `createdAt`, the commit time
the server wrote) to the moment the receiver had the whole request; also
checks every event arrived once with a valid signature. Run it on the
server's machine (one clock).

    bench/webhook-latency.py --http http://127.0.0.1:7878 --turns 500 --rate 50

Under ingest: run `tether-load ingest` against the same server meanwhile.
Standard library only.
"""

import argparse
import hashlib
import hmac
import json
import statistics
import threading
import time
import urllib.request
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

arrivals = {}
lock = threading.Lock()
secret = b""


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        arrived = time.time()
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
        event = json.loads(body)
        expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        with lock:
            arrivals.setdefault(event["id"], []).append(
                (arrived, event, self.headers["tether-signature"] == expected)
            )

    def log_message(self, *args):
        pass


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
        return json.loads(text) if text else None


def main():
    global secret
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", default="http://127.0.0.1:7878")
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--rate", type=float, default=50.0, help="turns per second")
    parser.add_argument("--sessions", type=int, default=10)
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    created = call(args.http, "POST", "/v1/projects/hooks/webhooks",
                   {"url": url, "events": ["turn.completed"]})
    secret = created["secret"].encode()
    run = int(time.time())
    sessions = [f"hook-{run}-{i}" for i in range(args.sessions)]
    for s in sessions:
        call(args.http, "POST", "/v1/sessions", {"id": s, "project": "hooks", "provider": "echo"})
    interval = 1.0 / args.rate
    start = time.time()
    for n in range(args.turns):
        due = start + n * interval
        now = time.time()
        if due > now:
            time.sleep(due - now)
        s = sessions[n % len(sessions)]
        call(args.http, "POST", f"/v1/sessions/{s}/actions", {
            "clientId": f"hook-bench-{run}", "clientSeq": n + 1,
            "channel": f"ahp-chat:/{s}.main",
            "action": {"type": "chat/turnStarted", "turnId": f"t{n}",
                       "startedAt": "2026-12-03T10:00:00.000Z",
                       "message": {"text": "hi", "origin": {"kind": "user"}}},
        })
    deadline = time.time() + 30
    while time.time() < deadline:
        with lock:
            if len(arrivals) >= args.turns:
                break
        time.sleep(0.1)
    call(args.http, "DELETE", f"/v1/projects/hooks/webhooks/{created['id']}")
    with lock:
        got = dict(arrivals)
    latencies = []
    for attempts in got.values():
        arrived, event, signed = attempts[0]
        committed = datetime.fromisoformat(event["createdAt"].replace("Z", "+00:00")).timestamp()
        latencies.append((arrived - committed) * 1000)
    latencies.sort()
    once = all(len(a) == 1 for a in got.values())
    signed = all(s for a in got.values() for (_, _, s) in a)

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))]

    print(json.dumps({
        "events": len(got), "expected": args.turns, "each once": once, "all signed": signed,
        "p50 ms": round(pct(50), 1), "p90 ms": round(pct(90), 1), "p99 ms": round(pct(99), 1),
        "max ms": round(latencies[-1], 1), "mean ms": round(statistics.mean(latencies), 1),
    }))


if __name__ == "__main__":
    main()
