#!/usr/bin/env bash
# meshwire's bulk transfer beside plain quinn, one connection on 127.0.0.1, alternating in one run.
# Both sides are `crates/meshwire/examples/transport.rs`, one release build, so they share quinn
# (the version in Cargo.lock), rustls with ring, the profile and the allocator; each transfer is a
# receiver process and a sender process, both on a current-thread tokio runtime.
#  - meshwire: two nodes with default settings; the sender sends BYTES as batches (one stream each,
#    at most 1 GiB) in 1 MiB chunks, the receiver pulls every chunk (`InboundBatch::next_chunk`).
#  - quinn: what quinn's `perf` tool does, written in the example (perf itself is not fetched):
#    `quinn::Endpoint::server` / `client` with quinn's default transport config, a self-signed
#    rustls certificate (rcgen) the client trusts, one connection, one unidirectional stream
#    written in 1 MiB `write_chunk`s of one shared buffer and drained with `read_chunks`.
# Throughput is timed by the sender, from opening the stream (handshake done) until the receiver
# has acknowledged every byte. CPU is each process's user + system time (/usr/bin/time) over its
# whole life, per GB (1e9 bytes) moved. Rounds alternate which side goes first; the table shows
# every round and the medians, then the ratio of the medians. Target (issue 15): meshwire >= 0.9x
# plain quinn. The machine is shared, so single rounds are noisy (one run of 7 rounds here moved
# plain quinn between 6.7 and 8.7 Gbit/s and meshwire between 6.3 and 8.8): read the medians.
# Usage: bench/transport.sh [rounds] [bytes]    (defaults: 7 rounds of 1 GiB, about 1 min)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-7}
bytes=${2:-1073741824}

cargo build --release --locked --quiet -p meshwire --example transport
bin=${CARGO_TARGET_DIR:-target}/release/examples/transport
work=$(mktemp -d)
receiver=""
cleanup() {
  [ -n "$receiver" ] && kill "$receiver" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# One transfer of `bytes` on `side`; appends "round side seconds send_cpu recv_cpu" to results.
transfer() {
  local round=$1 side=$2 dir="$work/$1-$2"
  mkdir "$dir"
  RUST_LOG=warn timeout 120 /usr/bin/time -f '%U %S' -o "$dir/receive.time" \
    "$bin" receive "$side" "$dir" "$bytes" 2>"$dir/receive.log" &
  receiver=$!
  if ! RUST_LOG=warn timeout 120 /usr/bin/time -f '%U %S' -o "$dir/send.time" \
    "$bin" send "$side" "$dir" "$bytes" >"$dir/send.out" 2>"$dir/send.log"; then
    echo "round $round, $side: the sender failed:" >&2
    cat "$dir/send.log" "$dir/send.out" >&2
    exit 1
  fi
  if ! wait "$receiver"; then
    echo "round $round, $side: the receiver failed:" >&2
    cat "$dir/receive.log" >&2
    exit 1
  fi
  receiver=""
  local seconds
  seconds=$(sed -n 's/.* seconds=\([0-9.]*\).*/\1/p' "$dir/send.out")
  echo "$round $side $seconds $(awk '{print $1 + $2}' "$dir/send.time")" \
    "$(awk '{print $1 + $2}' "$dir/receive.time")" >>"$work/results"
}

echo "== $rounds rounds of $bytes bytes per side, one connection on 127.0.0.1 ($(nproc) cores)"
for round in $(seq "$rounds"); do
  if [ $((round % 2)) -eq 1 ]; then order="meshwire quinn"; else order="quinn meshwire"; fi
  for side in $order; do
    transfer "$round" "$side"
  done
done

python3 - "$bytes" "$work/results" <<'PY'
import statistics, sys
size = int(sys.argv[1])
gigabytes = size / 1e9
rows = [line.split() for line in open(sys.argv[2]) if line.strip()]
by_side = {"meshwire": [], "quinn": []}
header = f"{'round':<7} {'side':<9} {'Gbit/s':>7} {'send_cpu_s/GB':>14} {'recv_cpu_s/GB':>14} {'cpu_s/GB':>9}"
print(header)
def line(label, side, gbit, send, receive):
    print(f"{label:<7} {side:<9} {gbit:>7.2f} {send:>14.3f} {receive:>14.3f} {send + receive:>9.3f}")
for round_, side, seconds, send_cpu, receive_cpu in rows:
    gbit = size * 8 / float(seconds) / 1e9
    send, receive = float(send_cpu) / gigabytes, float(receive_cpu) / gigabytes
    by_side[side].append((gbit, send, receive))
    line(round_, side, gbit, send, receive)
medians = {}
for side, values in by_side.items():
    medians[side] = [statistics.median(column) for column in zip(*values)]
    line("median", side, *medians[side])
mesh, quinn = medians["meshwire"], medians["quinn"]
print(f"ratio meshwire/quinn: throughput {mesh[0] / quinn[0]:.2f}x (target >= 0.9x), "
      f"cpu per GB {(mesh[1] + mesh[2]) / (quinn[1] + quinn[2]):.2f}x "
      f"(send {mesh[1] / quinn[1]:.2f}x, receive {mesh[2] / quinn[2]:.2f}x)")
PY
