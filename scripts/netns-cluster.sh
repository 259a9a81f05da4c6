#!/usr/bin/env bash
# Run a real 5-node meshwire cluster on one machine: five network namespaces, one `meshwire node`
# process in each, started from the very files deploy/compose.yaml uses (deploy/config/meshwire.toml
# and deploy/config/nodeN/identity.pem), then a workload over real sockets and a crash.
#
# Topology (scripts/lib/netns.sh, shared with scripts/netns-lab.sh): one namespace holds a bridge;
# node N's namespace has eth0 at 10.78.0.1N/24, the address the config's peers and the compose
# network use; a sixth namespace, the client, at 10.78.0.100 runs every HTTP request. Each bridge
# port carries a `tc tbf` at NETNS_CLUSTER_MBIT (what a node receives is shaped). Nothing is
# attached to the root namespace: the traffic stays inside the namespaces created here.
#
# Workload, each step checked:
#   1. mesh up: every node's /status lists its 4 peers as connected;
#   2. quorum writes and reads through different nodes: PUT through node i, GET through node i+2,
#      the content compared byte for byte (small objects and one of 1 MiB);
#   3. a gossip topic: one event-stream subscriber per node (`GET /topics/default/events`, the
#      topic every node has without a [gossip] table), a message published through node 1
#      (`POST /topics/default`) arrives on all five streams;
#   4. a batch pipeline round the ring node1 -> node2 -> ... -> node5 -> node1 (the config's
#      [pipeline]): a 4 MiB batch POSTed to node 1 comes back intact, every node counts it;
#   5. kill node 3 with SIGKILL: the others see it gone, a PUT through node 1 still gets its write
#      quorum;
#   6. restart node 3 on its data directory: it rejoins (every node sees 4 peers again), it holds
#      at least the objects it held before, reads through it return every object, the one
#      written while it was down included, a message published through it reaches all five, and
#      a batch goes round the ring through it again.
#
# Needs root, `ip` and `tc` (iproute2), curl and python3; without them it prints "skipped: ..."
# and exits 0. Cost: 36 s measured on a 2-core machine after the release build of meshwire (reused
# when current); most of it is the 20 s QUIC idle timeout after which the others see the SIGKILL.
# Creates namespaces named mwc<pid>-*, and deletes them and its temporary directory on exit,
# also on failure or interruption. Exit status: 0 when every check passed, 1 otherwise.
#
# Environment: MESHWIRE=path to a meshwire binary (default: build target/release/meshwire),
# NETNS_CLUSTER_MBIT=rate of every link in Mbit/s (default 100; 0: no tbf).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/netns.sh
source scripts/lib/netns.sh

prefix="mwc$$"
netns_require netns-cluster "$prefix"
command -v curl >/dev/null 2>&1 || netns_skip "no 'curl' command"
command -v python3 >/dev/null 2>&1 || netns_skip "no 'python3' command"

nodes=5
config=deploy/config/meshwire.toml
mbit=${NETNS_CLUSTER_MBIT:-100}
netns_workdir mwc
netns_meshwire

started_all=$(date +%s%3N)
failures=0
fail() {
  echo "FAILED: $*"
  failures=$((failures + 1))
}
elapsed() { # since_ms
  awk -v b="$1" -v e="$(date +%s%3N)" 'BEGIN {printf "%.1f s", (e - b) / 1000}'
}
address() { echo "10.78.0.1$1"; }
namespace() { echo "${prefix}-n$1"; }

echo "== network: bridge namespace ${prefix}-br, $nodes node namespaces and a client, ${mbit} Mbit/s links"
bridge="${prefix}-br"
netns_bridge "$bridge" 1500
for ((n = 1; n <= nodes; n++)); do
  netns_add "$(namespace "$n")"
  netns_attach "$bridge" "$(namespace "$n")" "$n" "$(address "$n")/24" 1500
done
client="${prefix}-client"
netns_add "$client"
netns_attach "$bridge" "$client" 0 "10.78.0.100/24" 1500
if [ "$mbit" -gt 0 ]; then
  # A burst of a millisecond at the rate, a queue of 10 ms.
  rate=$((mbit * 1000000))
  for ((i = 0; i <= nodes; i++)); do
    netns_tbf "$bridge" "$i" "$rate" $((rate / 8 / 1000 > 3000 ? rate / 8 / 1000 : 3000)) $((rate / 8 / 100))
  done
fi

pids=()
start_node() { # n
  local n=$1 data="$work/node$1"
  mkdir -p "$data"
  if [ ! -e "$data/identity.pem" ]; then
    install -m 0600 "deploy/config/node$n/identity.pem" "$data/identity.pem"
  fi
  # Same config file as the compose cluster; only the data directory differs.
  ip netns exec "$(namespace "$n")" env RUST_LOG=info "$bin" node --config "$config" \
    --data-dir "$data" >>"$work/node$n.log" 2>&1 &
  pids[n]=$!
}
show_logs() {
  local n
  for ((n = 1; n <= nodes; n++)); do
    kill -0 "${pids[n]}" 2>/dev/null || echo "  node$n: its process has exited"
    echo "  node$n log (last lines):"
    tail -5 "$work/node$n.log" | sed 's/^/    /'
  done
}

# curl from the client namespace to node n's HTTP API, with its token.
http() { # n curl-arguments...
  local n=$1
  shift
  ip netns exec "$client" curl -sS --max-time 15 \
    -H "Authorization: Bearer $(cat "$work/node$n/http-token")" "$@"
}
connected_peers() { # n: how many peers node n's /status shows connected ("-" if it did not answer)
  http "$1" "http://$(address "$1"):7780/status" 2>/dev/null |
    python3 -c 'import json, sys; print(sum(1 for p in json.load(sys.stdin)["peers"] if p["connected"]))' 2>/dev/null ||
    echo "-"
}
stored_objects() { # n
  http "$1" "http://$(address "$1"):7780/status" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["store"]["objects"])'
}
wait_peers() { # want nodes... : wait (60 s at most) until each node shows `want` connected peers
  local want=$1 deadline n count all
  shift
  deadline=$(($(date +%s) + 60))
  while :; do
    all=1
    for n in "$@"; do
      count=$(connected_peers "$n")
      [ "$count" = "$want" ] || all=0
    done
    [ "$all" -eq 1 ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}
put() { # n key file: PUT through node n; prints the write's acks, or the failure
  local out
  out=$(http "$1" -X PUT --data-binary "@$3" -w '\n%{http_code}' "http://$(address "$1"):7780/objects/$2")
  if [ "$(tail -1 <<<"$out")" != 201 ]; then
    echo "status $(tail -1 <<<"$out"): $(head -1 <<<"$out")"
    return 1
  fi
  head -1 <<<"$out" | python3 -c 'import json, sys; print(json.load(sys.stdin)["acks"])'
}
ring_batch() { # label: POST a 4 MiB batch to node 1 and check it came back intact
  local out
  head -c $((4 << 20)) /dev/urandom >"$work/batch"
  out=$(http 1 -X POST --data-binary "@$work/batch" -w '\n%{http_code}' \
    "http://$(address 1):7780/pipeline/batches")
  if [ "$(tail -1 <<<"$out")" != 200 ]; then
    fail "$1: batch round the ring: status $(tail -1 <<<"$out"): $(head -1 <<<"$out")"
    # A relay that gave the batch up says why at warn.
    { grep -H -E "WARN|ERROR" "$work"/node*.log || true; } | tail -20 | sed 's/^/  /'
    return
  fi
  head -1 <<<"$out" | python3 -c '
import json, sys
a = json.load(sys.stdin)
batch, size, chunks, ms, intact = (a[k] for k in ("batch_id", "bytes", "chunks", "elapsed_ms", "intact"))
print(f"{sys.argv[1]}: batch {batch} of {size} bytes in {chunks} chunks went round the 5-node ring "
      f"in {ms:.0f} ms, intact: {intact}")
sys.exit(0 if a["intact"] else 1)' "$1" || fail "$1: the batch came back altered"
}
get_matches() { # n key file: GET through node n equals the file
  http "$1" -f "http://$(address "$1"):7780/objects/$2" -o "$work/got" && cmp -s "$work/got" "$3"
}
topic_subscribers() { # n: subscribers of topic `default` on node n ("-" if it did not answer)
  http "$1" "http://$(address "$1"):7780/topics" 2>/dev/null |
    python3 -c 'import json, sys; print(next(t["subscribers"] for t in json.load(sys.stdin) if t["name"] == "default"))' 2>/dev/null ||
    echo "-"
}
topic_round() { # publisher round: subscribe on every node, publish through `publisher`, check all five streams
  local publisher=$1 round=$2 n deadline text got pid begin_publish
  local -a streams=()
  for ((n = 1; n <= nodes; n++)); do
    : >"$work/events$n.$round"
    # The stream ends at --max-time at the latest; it is also killed below.
    ip netns exec "$client" curl -sS -N --max-time 60 \
      -H "Authorization: Bearer $(cat "$work/node$n/http-token")" \
      "http://$(address "$n"):7780/topics/default/events" >"$work/events$n.$round" 2>&1 &
    streams[n]=$!
  done
  deadline=$(($(date +%s) + 15))
  for ((n = 1; n <= nodes; n++)); do
    until [ "$(topic_subscribers "$n")" = 1 ]; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        fail "round $round: node$n's topic has $(topic_subscribers "$n") subscribers, not 1"
        break
      fi
      sleep 0.2
    done
  done
  text="topic round $round from node$publisher $$"
  begin_publish=$(date +%s%3N)
  local out
  out=$(http "$publisher" -X POST --data-binary "$text" -w '\n%{http_code}' \
    "http://$(address "$publisher"):7780/topics/default") || true
  if [ "$(tail -1 <<<"$out")" != 202 ]; then
    fail "round $round: POST /topics/default through node$publisher: status $(tail -1 <<<"$out"): $(head -1 <<<"$out")"
  fi
  got=0
  deadline=$(($(date +%s) + 15))
  for ((n = 1; n <= nodes; n++)); do
    until grep -qF "\"text\":\"$text\"" "$work/events$n.$round"; do
      if [ "$(date +%s)" -ge "$deadline" ]; then
        fail "round $round: node$n's subscriber did not get the message within 15 s"
        sed 's/^/    /' "$work/events$n.$round" | tail -3
        continue 2
      fi
      sleep 0.05
    done
    got=$((got + 1))
  done
  echo "published through node$publisher: $got/$nodes subscribers (one per node) got it ($(elapsed "$begin_publish") after the POST, polled every 50 ms)"
  for pid in "${streams[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}

echo "== 1. start $nodes nodes and wait for the mesh"
begin=$(date +%s%3N)
for ((n = 1; n <= nodes; n++)); do
  start_node "$n"
done
# The token file appears once the HTTP API is up.
for ((n = 1; n <= nodes; n++)); do
  for _ in $(seq 1 100); do
    [ -s "$work/node$n/http-token" ] && break
    kill -0 "${pids[n]}" 2>/dev/null || break
    sleep 0.1
  done
done
if wait_peers 4 $(seq 1 "$nodes"); then
  echo "mesh up: every node sees 4 connected peers ($(elapsed "$begin") from start)"
else
  for ((n = 1; n <= nodes; n++)); do
    echo "  node$n: $(connected_peers "$n") connected peers"
  done
  show_logs
  fail "the mesh did not come up within 60 s"
  exit 1
fi

echo "== 2. quorum writes and reads through different nodes"
begin=$(date +%s%3N)
keys=()
for ((k = 0; k < 20; k++)); do
  printf 'object %d written through node %d\n' "$k" $((k % nodes + 1)) >"$work/object$k"
  keys+=("object$k")
done
head -c 1048576 /dev/urandom >"$work/large"
keys+=(large)
written=0
for ((k = 0; k < ${#keys[@]}; k++)); do
  key=${keys[$k]}
  through=$((k % nodes + 1))
  if acks=$(put "$through" "$key" "$work/$key"); then
    if [ "$acks" -ge 2 ]; then written=$((written + 1)); else fail "PUT $key through node$through: $acks acks"; fi
  else
    fail "PUT $key through node$through: $acks"
  fi
done
read_ok=0
for ((k = 0; k < ${#keys[@]}; k++)); do
  key=${keys[$k]}
  through=$(((k + 2) % nodes + 1))
  if get_matches "$through" "$key" "$work/$key"; then
    read_ok=$((read_ok + 1))
  else
    fail "GET $key through node$through did not return what was written"
  fi
done
echo "$written/${#keys[@]} PUTs reached their write quorum, $read_ok/${#keys[@]} GETs through another node matched ($(elapsed "$begin"))"

echo "== 3. a gossip topic: publish through node 1, one subscriber per node"
topic_round 1 1

echo "== 4. a batch pipeline round the ring"
ring_batch "round 1"
completed=0
for ((n = 1; n <= nodes; n++)); do
  count=$(http "$n" "http://$(address "$n"):7780/pipeline" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["completed"])' 2>/dev/null || echo 0)
  [ "$count" -ge 1 ] && completed=$((completed + 1))
done
if [ "$completed" = "$nodes" ]; then
  echo "every node of the ring counts the batch as completed"
else
  fail "only $completed of $nodes nodes count the batch as completed"
fi

echo "== 5. SIGKILL node 3"
begin=$(date +%s%3N)
held_before=$(stored_objects 3 || echo 0)
kill -KILL "${pids[3]}"
wait "${pids[3]}" 2>/dev/null || true
if wait_peers 3 1 2 4 5; then
  echo "node3 killed (it held $held_before objects): the 4 others see 3 peers ($(elapsed "$begin"))"
else
  fail "the other nodes did not notice node3 was gone within 60 s"
fi
echo "written while node3 is down" >"$work/while-down"
if acks=$(put 1 while-down "$work/while-down"); then
  echo "PUT through node1 while node3 is down: $acks acks"
else
  fail "PUT through node1 while node3 is down: $acks"
fi

echo "== 6. restart node 3 on its data directory"
begin=$(date +%s%3N)
start_node 3
if wait_peers 4 $(seq 1 "$nodes"); then
  echo "node3 rejoined: every node sees 4 connected peers again ($(elapsed "$begin") after restart)"
else
  show_logs
  fail "node3 did not rejoin within 60 s"
fi
held_after=$(stored_objects 3 || echo 0)
if [ "$held_after" -ge "$held_before" ] && [ "$held_before" -gt 0 ]; then
  echo "node3's store survived the SIGKILL: $held_before objects before, $held_after after"
else
  fail "node3 held $held_before objects before the kill and $held_after after"
fi
read_ok=0
for key in "${keys[@]}" while-down; do
  if get_matches 3 "$key" "$work/$key"; then
    read_ok=$((read_ok + 1))
  else
    fail "GET $key through the restarted node3 did not return what was written"
  fi
done
echo "$read_ok/$((${#keys[@]} + 1)) GETs through the restarted node3 matched"
topic_round 3 2
ring_batch "after the restart"

if [ "$mbit" -gt 0 ]; then
  drops=0
  for ((i = 0; i <= nodes; i++)); do
    drops=$((drops + $(netns_tbf_drops "$bridge" "$i")))
  done
  echo "tbf dropped $drops packets on the ${mbit} Mbit/s links"
fi
status=0
[ "$failures" -eq 0 ] || status=1
echo
echo "netns-cluster: $(elapsed "$started_all"), $failures failed checks, exit status $status"
exit "$status"
