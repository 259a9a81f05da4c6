#!/usr/bin/env bash
# Anti-entropy convergence of `meshwire node` (release build) on loopback: a 3-node cluster
# (replication 3, write quorum 2, read quorum 2) in which one replica is SIGKILLed, misses
# `writes` PUTs of 4 KiB (default 10,000) made through the two others, and is restarted. Reports
# the time from its restart until its own store holds every key (polled with `/status`, no reads),
# the bytes anti-entropy moved (meshwire_object_anti_entropy_{sent,received}_bytes_total summed
# over the nodes: every exchange's digests, listings, pulls and pushes, counted once by the node
# that started it) and the node-level frame bytes sent, beside the floor: the content it missed
# (writes x 4 KiB). Target (issue 18): within 10 s.
# Usage: bench/anti-entropy.sh [writes] [anti_entropy_interval_ms]   (interval default: the
# node's default, 5000)
set -euo pipefail
cd "$(dirname "$0")/.."
writes=${1:-10000}
interval_ms=${2:-}

cargo build --release --locked --quiet --bin meshwire
bin=target/release/meshwire
work=$(mktemp -d)
pids=("" "" "")
cleanup() {
  for pid in "${pids[@]}"; do [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

base_port=$((20000 + RANDOM % 20000))
{
  echo "[objects]"
  echo "replication = 3"
  echo "write_quorum = 2"
  echo "read_quorum = 2"
  [ -n "$interval_ms" ] && echo "anti_entropy_interval_ms = $interval_ms"
  echo "[http]"
  echo "max_connections_per_client = 512"
  echo "max_concurrent_requests = 512"
} > "$work/node.toml"

ids=()
for i in 0 1 2; do ids+=("$("$bin" id --data-dir "$work/n$i")"); done
udp() { echo $((base_port + 2 * $1)); }
web() { echo $((base_port + 2 * $1 + 1)); }
start() {
  local i=$1 args=()
  for j in 0 1 2; do
    [ "$j" = "$i" ] && continue
    args+=(--peer "${ids[$j]}@127.0.0.1:$(udp "$j")" --member "${ids[$j]}")
  done
  RUST_LOG=warn "$bin" node --config "$work/node.toml" --data-dir "$work/n$i" \
    --listen "127.0.0.1:$(udp "$i")" --http "127.0.0.1:$(web "$i")" "${args[@]}" \
    2>>"$work/n$i.log" &
  pids[$i]=$!
}
status() { curl -fs "http://127.0.0.1:$(web "$1")/status"; }
connected() {
  status "$1" 2>/dev/null | python3 -c 'import json,sys; print(sum(p["connected"] for p in json.load(sys.stdin)["peers"]))' 2>/dev/null || echo 0
}
objects() { status "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["store"]["objects"])'; }
metric() {
  curl -fs "http://127.0.0.1:$(web "$1")/metrics" | awk -v m="$2" '$1 == m { print $2; f=1 } END { if (!f) print 0 }'
}

for i in 0 1 2; do start "$i"; done
for i in 0 1 2; do
  for _ in $(seq 200); do [ "$(connected "$i")" = 2 ] && break; sleep 0.05; done
done

echo "== node 2 SIGKILLed; $writes PUTs of 4 KiB through nodes 0 and 1"
kill -9 "${pids[2]}"; wait "${pids[2]}" 2>/dev/null || true; pids[2]=""
python3 - "$writes" "$(web 0)" "$(web 1)" <<'PY'
import http.client, os, sys, threading, time
writes, ports = int(sys.argv[1]), sys.argv[2:]
failed = []
def writer(part, parts):
    conn = http.client.HTTPConnection("127.0.0.1", int(ports[part % len(ports)]), timeout=30)
    for i in range(part, writes, parts):
        conn.request("PUT", f"/objects/key-{i:06d}", body=os.urandom(4096))
        response = conn.getresponse(); response.read()
        if response.status != 201:
            failed.append((i, response.status))
started = time.time()
threads = [threading.Thread(target=writer, args=(p, 8)) for p in range(8)]
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.time() - started
print(f"{writes} PUTs in {elapsed:.1f} s ({writes / elapsed:.0f}/s), {len(failed)} not 201")
if failed: sys.exit(f"writes failed: {failed[:5]}")
PY
for i in 0 1; do echo "node $i holds $(objects "$i") objects"; done

declare -A sent_before received_before
for i in 0 1; do
  sent_before[$i]=$(metric "$i" meshwire_object_anti_entropy_sent_bytes_total)
  received_before[$i]=$(metric "$i" meshwire_object_anti_entropy_received_bytes_total)
done
wire_before=$(( $(metric 0 meshwire_sent_bytes_total) + $(metric 1 meshwire_sent_bytes_total) ))

echo "== node 2 restarted; waiting until its store holds all $writes + keys (no reads)"
t0=$(date +%s.%N)
start 2
t_connected=""
while :; do
  now=$(date +%s.%N)
  [ -z "$t_connected" ] && [ "$(connected 2)" = 2 ] && t_connected=$now
  held=$(objects 2 2>/dev/null || echo 0)
  [ "$held" -ge "$writes" ] && break
  if python3 -c "import sys; sys.exit(0 if $now - $t0 > 120 else 1)"; then
    echo "node 2 holds only $held of $writes after 120 s" >&2; exit 1
  fi
  sleep 0.05
done
t1=$(date +%s.%N)

sent=0; received=0
for i in 0 1; do
  sent=$(( sent + $(metric "$i" meshwire_object_anti_entropy_sent_bytes_total) - sent_before[$i] ))
  received=$(( received + $(metric "$i" meshwire_object_anti_entropy_received_bytes_total) - received_before[$i] ))
done
sent2=$(metric 2 meshwire_object_anti_entropy_sent_bytes_total)
received2=$(metric 2 meshwire_object_anti_entropy_received_bytes_total)
wire=$(( $(metric 0 meshwire_sent_bytes_total) + $(metric 1 meshwire_sent_bytes_total) - wire_before + $(metric 2 meshwire_sent_bytes_total) ))
pulled=$(metric 2 'meshwire_object_anti_entropy_repaired_keys_total{direction="pulled"}')
pushed=$(( $(metric 0 'meshwire_object_anti_entropy_repaired_keys_total{direction="pushed"}') + $(metric 1 'meshwire_object_anti_entropy_repaired_keys_total{direction="pushed"}') ))
repairs=$(metric 2 meshwire_object_read_repairs_total)
floor=$(( writes * 4096 ))
# The digest scans of node 0, which holds every key: their mean time (sum / count) in seconds.
scan_sum=$(metric 0 meshwire_object_anti_entropy_scan_seconds_sum)
scan_count=$(metric 0 meshwire_object_anti_entropy_scan_seconds_count)
# A sample of the converged copies, byte for byte against node 0's.
for key in key-000000 "key-$(printf %06d $((writes / 2)))" "key-$(printf %06d $((writes - 1)))"; do
  cmp <(curl -fs "http://127.0.0.1:$(web 0)/objects/$key?local=true") \
      <(curl -fs "http://127.0.0.1:$(web 2)/objects/$key?local=true")
done

python3 - "$t0" "$t_connected" "$t1" "$scan_sum" "$scan_count" "$floor" "$sent" "$received" "$sent2" "$received2" "$wire" "$pulled" "$pushed" "$repairs" "$writes" <<'PY'
import sys
t0, tc, t1 = (float(x) if x else None for x in sys.argv[1:4])
scan_sum, scan_count = float(sys.argv[4]), int(sys.argv[5])
floor, sent, received, sent2, received2, wire, pulled, pushed, repairs, writes = map(int, sys.argv[6:])
moved = sent + sent2 + received + received2
print(f"anti_entropy::converge/writes={writes}/size=4096")
print(f"  time from restart to all keys held   {t1 - t0:7.2f} s   (target <= 10 s)")
if tc: print(f"  time from connected to all keys held {t1 - tc:7.2f} s")
print(f"  keys pulled by node 2 {pulled}, pushed to it {pushed}, read repairs {repairs}")
print(f"  anti-entropy payload bytes           {moved:>12,}   floor {floor:,} (content missed), ratio {moved / floor:.3f}")
print(f"    of which node 2 sent {sent2:,} and received {received2:,}; nodes 0 and 1 sent {sent:,} and received {received:,}")
print(f"  node frame bytes sent (3 nodes)      {wire:>12,}   ratio {wire / floor:.3f}")
if scan_count:
    print(f"  digest scan of node 0's {writes} keys: mean {1000 * scan_sum / scan_count:.1f} ms over {scan_count} scans")
PY
