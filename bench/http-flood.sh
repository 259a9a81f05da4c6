#!/usr/bin/env bash
# A connection flood against `meshwire node` (release build, default HTTP limits) on loopback,
# and how fast /status answers others meanwhile (issue 19: "/status still answers within 100 ms").
#   1. One client address (127.0.0.1) opens 300 connections and sends nothing: the first 32 (the
#      per-client cap) are held, the rest get 503 busy. Meanwhile 20 GET /status from 127.0.0.2,
#      one after the other: each should be 200.
#   2. Ten more addresses (127.0.0.3-12) hold 32 connections each, past the total cap (256):
#      20 GET /status from 127.0.0.13 should each get 503 busy with Retry-After, at once.
# Prints, per phase, the answers' statuses and latency (connect to last byte) min / median / max,
# and the node's refusal counters from /metrics (status 0: reset before any answer). Loopback only. Takes about 15 s.
# Usage: bench/http-flood.sh   (MESHWIRE_BIN=path: run that meshwire binary instead)
set -euo pipefail
cd "$(dirname "$0")/.."
# The flood holds about 650 sockets in this process and the node: raise the soft descriptor limit.
ulimit -n 4096 2>/dev/null || true
# MESHWIRE_BIN runs another build of meshwire (an A/B comparison) instead of this tree's.
. bench/node-setup.sh
RUST_LOG=error "$bin" node --data-dir "$work/data" \
  --listen "127.0.0.1:$port_udp" --http "127.0.0.1:$port_http" >"$work/node.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port_http/status" >/dev/null 2>&1 && break; sleep 0.1; done

python3 - "$port_http" <<'PY'
import socket, statistics, sys, time

port = int(sys.argv[1])


def connect(source):
    s = socket.socket()
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def status(source):
    """GET /status from `source`: (HTTP status, seconds from connect to the answer's end)."""
    start = time.perf_counter()
    s = connect(source)
    data = b""
    try:
        s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        # Over the cap the node answers 503 at once and closes: a request written after that
        # close can reset the connection, but the answer already arrived.
        pass
    s.close()
    code = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return code, time.perf_counter() - start


def probe(phase, source):
    answers = [status(source) for _ in range(20)]
    codes = sorted({code for code, _ in answers})
    ms = sorted(seconds * 1000 for _, seconds in answers)
    print(f"{phase}: statuses {codes}  latency ms min {ms[0]:.2f}  median "
          f"{statistics.median(ms):.2f}  max {ms[-1]:.2f}")


held = []
for _ in range(300):
    held.append(connect("127.0.0.1"))
time.sleep(0.5)
probe("one address holds 300 connections, /status from another", "127.0.0.2")
for host in range(3, 13):
    for _ in range(32):
        held.append(connect(f"127.0.0.{host}"))
time.sleep(0.5)
probe("11 addresses past the total cap, /status from a new one", "127.0.0.13")
for s in held:
    s.close()
PY
sleep 0.5
curl -fs "http://127.0.0.1:$port_http/metrics" | grep -E '^meshwire_http_refused' || true
