#!/usr/bin/env bash
# The object store's memory, disk use and crash restart, on one `meshwire node` (release build,
# default settings: a cluster of one, `store_memory_bytes` 128 MiB) on loopback:
#  1. `objects` PUTs of 8 MiB (default 128, 1.07 GB of content) with distinct random content,
#     one at a time; RSS after 100 of them and the peak (VmHWM). Target (issue 19): RSS within
#     the store's budget + 100 MB.
#  2. The first half of the keys rewritten with new content; the store's length (its redb file and
#     content files) and the disk blocks it occupies over the content it holds; then SIGTERM (a
#     graceful stop compacts a redb file occupying over 1.2x the content it holds + 32 MiB of
#     disk), the stop's duration, length and blocks again, and a restart. Target (after
#     compaction): at most 1.3x.
#  3. SIGKILL while a PUT is in flight, restart, and the time from the restart until `/status`
#     answers; then every key read back and checked against the content last acknowledged.
#     Target: at most 2 s.
#  4. Slow readers: 128 connections (32 from each of four loopback addresses, the per-client cap)
#     each GET a distinct 8 MiB object and read 64 KiB of it, then stall for 3 s; the node's RSS
#     while they stall, over its RSS before. A response streamed from the store holds a chunk, not
#     the object.
# Usage: bench/store.sh [objects]
set -euo pipefail
cd "$(dirname "$0")/.."
objects=${1:-128}

cargo build --release --locked --quiet --bin meshwire
bin=target/release/meshwire
work=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
start() {
  RUST_LOG=warn,meshwire_objects::net::daemon=info "$bin" node --data-dir "$work/data" --listen "127.0.0.1:$port" \
    --http "127.0.0.1:$((port + 1))" 2>>"$work/node.log" &
  pid=$!
}
wait_up() {
  for _ in $(seq 2000); do
    curl -fs "http://127.0.0.1:$((port + 1))/status" >/dev/null 2>&1 && return 0
    sleep 0.005
  done
  echo "node did not answer /status; its log:" >&2
  cat "$work/node.log" >&2
  return 1
}
# The store's disk use over $content: the redb file and the content files beside it (objects of
# 64 KiB or more), by length and by allocated blocks; prefixed by $1 if given.
file_sizes() {
  python3 - "${1:-}" "$content" "$file" "${file%.redb}.content" <<'PY'
import os, sys
label = sys.argv[1] + " " if sys.argv[1] else ""
content = int(sys.argv[2])
paths = [sys.argv[3]] + [e.path for e in os.scandir(sys.argv[4])] if os.path.isdir(sys.argv[4]) else [sys.argv[3]]
stats = [os.stat(p) for p in paths]
length = sum(s.st_size for s in stats)
blocks = sum(s.st_blocks * 512 for s in stats)
redb = stats[0]
print(f"{label}content_mb {content / 1e6:.0f}  store_length_mb {length / 1e6:.0f} ({length / content:.3f}x)"
      f"  store_blocks_mb {blocks / 1e6:.0f} ({blocks / content:.3f}x)  (target <= 1.3x)"
      f"  of which redb_file_length_mb {redb.st_size / 1e6:.1f}, {len(paths) - 1} content files")
PY
}
rss_mb() { awk '$1 == "'"$1"':" { printf "%.0f", $2 / 1024 }' "/proc/$pid/status"; }

start
wait_up
echo "== $objects PUTs of 8 MiB, one at a time"
python3 - "$objects" "$((port + 1))" "$pid" "$work/sums" <<'PY'
import hashlib, http.client, random, sys, time
objects, port, pid, sums = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
def rss_mb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
def put(key, body):
    conn.request("PUT", f"/objects/{key}", body=body)
    response = conn.getresponse(); response.read()
    if response.status != 201:
        sys.exit(f"PUT {key}: {response.status}")
digests = {}
start = time.monotonic()
for i in range(objects):
    body = random.Random(i).randbytes(8 << 20)
    put(f"obj-{i:04d}", body)
    digests[f"obj-{i:04d}"] = hashlib.sha256(body).hexdigest()
    if i + 1 == min(100, objects):
        print(f"rss_after_{i + 1}_puts_mb {rss_mb():.0f}")
elapsed = time.monotonic() - start
print(f"put_seconds {elapsed:.1f}  ({objects * 8 / elapsed:.0f} MiB/s)")
print(f"rss_after_puts_mb {rss_mb():.0f}")
half = objects // 2
for i in range(half):
    body = random.Random(10_000 + i).randbytes(8 << 20)
    put(f"obj-{i:04d}", body)
    digests[f"obj-{i:04d}"] = hashlib.sha256(body).hexdigest()
print(f"rewrote {half} keys")
with open(sums, "w") as f:
    for key, digest in sorted(digests.items()):
        f.write(f"{key} {digest}\n")
PY
echo "rss_peak_mb $(rss_mb VmHWM)  (budget 128 MiB; target <= budget + 100 MB)"
content=$(curl -fs "http://127.0.0.1:$((port + 1))/status" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["store"]["content_bytes"])')
file="$work/data/objects.redb"
file_sizes

echo "== SIGTERM (graceful stop compacts the store), restart"
t0=$(date +%s.%N)
kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
t1=$(date +%s.%N)
python3 -c "print(f'graceful_stop_seconds {$t1 - $t0:.2f}')"
grep -o 'compacted the object store.*' "$work/node.log" | tail -1 || true
file_sizes after_graceful_stop
t0=$(date +%s.%N)
start
wait_up
t1=$(date +%s.%N)
python3 -c "print(f'restart_after_graceful_stop_seconds {$t1 - $t0:.2f}')"

echo "== SIGKILL during a PUT, restart"
python3 - "$((port + 1))" <<'PY' &
import http.client, random, sys
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
try:
    conn.request("PUT", "/objects/in-flight", body=random.Random(7).randbytes(8 << 20))
    conn.getresponse().read()
except OSError:
    pass
PY
writer=$!
sleep 0.05
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
wait "$writer" 2>/dev/null || true
t0=$(date +%s.%N)
start
wait_up
t1=$(date +%s.%N)
python3 -c "print(f'restart_to_status_seconds {$t1 - $t0:.2f}  (target <= 2 s)')"
echo "rss_after_restart_mb $(rss_mb VmRSS)"
python3 - "$((port + 1))" "$work/sums" <<'PY'
import hashlib, http.client, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
bad = 0
lines = open(sys.argv[2]).read().split("\n")
start = time.monotonic()
for line in filter(None, lines):
    key, digest = line.split()
    conn.request("GET", f"/objects/{key}")
    response = conn.getresponse(); body = response.read()
    if response.status != 200 or hashlib.sha256(body).hexdigest() != digest:
        bad += 1
elapsed = time.monotonic() - start
checked = len(list(filter(None, lines)))
print(f"acknowledged_objects_checked {checked}  wrong_or_missing {bad}")
print(f"read_back_seconds {elapsed:.1f}  ({checked * 8 / elapsed:.0f} MiB/s, one GET at a time,"
      f" the client's SHA-256 included)")
sys.exit(1 if bad else 0)
PY

echo "== slow readers"
rss_before=$(rss_mb VmRSS)
python3 - "$((port + 1))" "$objects" "$pid" "$rss_before" <<'PY'
import socket, sys, time
port, objects, pid, before = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
def rss_mb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
readers = []
for i in range(min(128, objects)):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    s.bind((f"127.0.0.{2 + i // 32}", 0))
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /objects/obj-{i:04d} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    readers.append(s)
got, statuses = 0, {}
for s in readers:
    want, first = 64 << 10, b""
    while want > 0:
        chunk = s.recv(want)
        if not chunk:
            break
        first = (first + chunk)[:16]
        want -= len(chunk)
        got += len(chunk)
    status = first.split(b" ")[1].decode() if first.count(b" ") else "none"
    statuses[status] = statuses.get(status, 0) + 1
time.sleep(3)
during = rss_mb()
print(f"slow_readers {len(readers)}  statuses {statuses}  read_mb {got / 1e6:.1f}"
      f"  rss_before_mb {before:.0f}  rss_while_stalled_mb {during:.0f}  (+{during - before:.0f} MB;"
      f" the 200s' objects whole would be +{statuses.get('200', 0) * 8 * 1.048576:.0f} MB)")
PY

