#!/usr/bin/env bash
# Cross-check the lab on the real kernel: every host of a scenario case runs as its own process
# (`meshwire lab host`) in its own network namespace, and the metrics come out next to the same
# scenario in virtual time, with their ratio; they must agree within 10% (a few real-time tails
# and pipelined rates within 25%).
#
# Topology: one namespace holds a bridge; each host's namespace has a veth (eth0, 10.77.0.N/24,
# MTU 1600 for the lab's 1501-byte packets) whose peer is a bridge port. The port's egress towards
# a host carries a `tc tbf` at the case link's bit rate with the case's queue as its limit: the
# kernel serializes and drop-tail queues (per receiving host, which is per link here: every host
# receives its bulk data from one peer). Delay, jitter and loss stay in user space on the
# receiving side (this kernel has no netem): the lab socket's own emulation, told by
# `--kernel-rate` to leave bit rates to the kernel. Packet-rate and unlimited links are paced by
# the sockets. The processes meet over Unix sockets in a temporary directory (never over the
# emulated links) to share what one host records and another reads, and to start together.
#
# Runs scenarios/calibration.toml and scenarios/xx-team.toml (the meshwire policies; the gRPC
# baselines run on turmoil's TCP and are skipped with a message). xx-team's compute-bound case
# under `meshwire` (one batch at a time: about 150 s of modelled compute) is skipped by default to
# keep the cost down; NETNS_LAB_SKIP="" runs it too.
#
# A few metrics are shown but not judged, and a few judged within 25%, for the reasons given where
# `not_judged` and `tolerance_for` are set below.
#
# Cost: under 3 minutes: 152-162 s measured on a 2-core machine (shared with other builds), after
# the release build of meshwire (reused when current; several minutes from scratch). Needs root,
# `ip` and `tc` (iproute2); without them it prints "skipped: ..." and exits 0.
# Creates namespaces named mwl<pid>-*, uses only 10.77.0.0/24 inside them, and deletes them on exit.
# Exit status: 0 when every run finished and every judged metric agreed, 1 otherwise.
#
# Environment: MESHWIRE=path to a meshwire binary (default: build target/release/meshwire),
# NETNS_LAB_SKIP=space-separated scenario/case/policy triples not to run in namespaces,
# NETNS_LAB_ONLY=space-separated scenario/case/policy triples to run alone (default: all),
# NETNS_LAB_TOLERANCE=largest accepted |netns / virtual - 1| (default 0.1).
set -euo pipefail
cd "$(dirname "$0")/.."
# `lab compare` fails by returning an error; its message is the summary, not a backtrace.
export RUST_LIB_BACKTRACE=0
# shellcheck source=scripts/lib/netns.sh
source scripts/lib/netns.sh

prefix="mwl$$"
netns_require netns-lab "$prefix"

netns_workdir mwl
netns_meshwire
skip_list=${NETNS_LAB_SKIP-"xx-team/compute-bound/meshwire"}
only_list=${NETNS_LAB_ONLY:-}
tolerance=${NETNS_LAB_TOLERANCE:-0.1}
scenarios=(scenarios/calibration.toml scenarios/xx-team.toml)
# Shown but not judged, each for a reason that is not the emulation's error (measured on a 2-core
# machine; see docs/scenarios.md):
not_judged=(
  # The user-space queue it counts is not used: the kernel's tbf queues (its drops print below).
  "sender_queue_drops"
  # The repair is met by one of quinn's backed-off probes, so the metric multiplies any
  # difference in the probe timeout: real-time round trips vary by about a millisecond (virtual
  # ones do not), which lengthens the timeout. With CUBIC: 160-185 ms against 130, also on
  # loopback (`lab run --realtime`); with the default controller 65 against 60.
  "partition/reconnect_ms"
  # Pacing-bound: with the standard window a batch goes out at quinn's pacing rate (1.25 x
  # window / RTT), whose timer waits end on tokio's millisecond ticks and later in real time
  # than in virtual time, and the window the first batches meet depends on when the warm-up's
  # ACKs came back. CUBIC: p50 135-140 ms against 115, also on loopback. The default controller:
  # p50 62-70 ms against 61, p99 (the first batch after the warm-up) 147-150 against 114. The
  # batches' rates agree within 10%.
  "transfer-bound-standard-window/hop_transfer_ms_p50"
  "transfer-bound-standard-window/hop_transfer_ms_p99"
  "transfer-bound-standard-window/hop_p50_over_floor"
  "transfer-bound-standard-window/hop_p99_over_floor"
  # BBR overflowing a one-BDP queue (a case with no theory target): its goodput depends on how
  # many packets the overflow costs, which moves with each millisecond of real-time pacing. tbf
  # dropped 633-1161 packets per run and goodput was 724.6-809.0 Mbit/s against 793.6 virtual
  # (0.913-1.019) over 7 runs on the idle 2-core machine, and fell more than 10% short on CI's.
  # The same case under the default controller stays judged: it checks the queue's emulation.
  "bulk-bdp-shallow-queue-bbr/goodput_mbit_per_s"
)
# Judged within 25%, each for a reason that is real time's, not the emulation's error. A hop in
# virtual time costs no CPU and its timers fire on the exact tick; in real time five host
# processes share the machine's cores, every hop pays for its packets' crypto and copies, and each
# timer wait ends on a later millisecond tick.
tolerance_for=(
  # The tail of about 100 hop times is their slowest, whichever waited longest for a core: hop p99
  # 1.096-1.111 x the virtual one on the idle 2-core machine, 1.121-1.186 on CI's machine, whose
  # p50 stayed within 10% (1.071-1.099). A wrong link rate or delay moves p50 as well.
  "hop_transfer_ms_p99=0.25"
  "hop_p99_over_floor=0.25"
  # 20 pipelined batches take about 1 s, and every one crosses five hops, so a few milliseconds per
  # hop move the rate by several percent: transfer-bound 18.30-18.63 against 20.41 (0.897-0.913),
  # 16.33 on CI's machine (0.800); with the standard window 10.50-10.94 against 11.99
  # (0.875-0.913).
  "transfer-bound/meshwire-pipelined/batches_per_s=0.25"
  "transfer-bound-standard-window/meshwire-pipelined/batches_per_s=0.25"
  # CUBIC at a shallow queue (the default controller): which of the overflow's losses it reads as
  # congestion moves with each millisecond of real-time pacing. Two runs on the idle 2-core
  # machine, with no transport change between them: 868.2 and 687.0 Mbit/s against 883.5 virtual
  # (0.983, 0.778; tbf dropped 496 packets in the second).
  "bulk-bdp-shallow-queue/meshwire/goodput_mbit_per_s=0.25"
)

# The most hosts any case needs.
max_hosts=0
for file in "${scenarios[@]}"; do
  while IFS=$'\t' read -r _ _ hosts _; do
    [ "$hosts" = "-" ] && continue
    count=$(awk -F, '{print NF}' <<<"$hosts")
    [ "$count" -gt "$max_hosts" ] && max_hosts=$count
  done < <("$bin" lab plan "$file")
done

echo "== network: bridge namespace ${prefix}-br, $max_hosts host namespaces"
bridge="${prefix}-br"
netns_bridge "$bridge" 1600
for ((i = 0; i < max_hosts; i++)); do
  ns="${prefix}-h$i"
  netns_add "$ns"
  netns_attach "$bridge" "$ns" "$i" "10.77.0.$((i + 1))/24" 1600
done

# A full lab datagram is quinn's 1472-byte payload (what link rates count) plus the ECN byte, UDP
# (8), IP (20) and Ethernet (14) headers: tbf, which counts frames, runs 1515/1472 faster.
frame=1515
payload=1472
set_rate() { # rate_bits_per_s queue_bytes hosts
  local rate=$1 queue=$2 hosts=$3 i tbf_rate limit burst
  for ((i = 0; i < hosts; i++)); do
    # A fresh qdisc per case (netns_tbf), so its drop counter counts this case alone.
    if [ "$rate" -le 0 ]; then
      netns_tbf "$bridge" "$i" 0 0 0
      continue
    fi
    tbf_rate=$((rate * frame / payload))
    limit=$((queue * frame / payload))
    # A burst of a quarter millisecond at the rate, at least two frames.
    burst=$((tbf_rate / 8 / 4000))
    [ "$burst" -ge $((2 * frame)) ] || burst=$((2 * frame))
    netns_tbf "$bridge" "$i" "$tbf_rate" "$burst" "$limit"
  done
}
tbf_drops() { # hosts
  local total=0 i
  for ((i = 0; i < $1; i++)); do
    total=$((total + $(netns_tbf_drops "$bridge" "$i")))
  done
  echo "$total"
}

status=0
started_all=$(date +%s)
for file in "${scenarios[@]}"; do
  name=$(basename "$file" .toml)
  echo
  echo "== $file in virtual time"
  "$bin" lab run --json "$file" >"$work/$name.virtual.json"
  : >"$work/$name.netns.jsonl"
  while IFS=$'\t' read -r case policy hosts rate queue duration; do
    label="$name/$case/$policy"
    if [ "$hosts" = "-" ]; then
      echo "skipped in netns: $label needs virtual time (it runs on turmoil's TCP)"
      continue
    fi
    if [ -n "$only_list" ] && [[ " $only_list " != *" $label "* ]]; then
      continue
    fi
    if [[ " $skip_list " == *" $label "* ]]; then
      echo "skipped in netns: $label (NETNS_LAB_SKIP)"
      continue
    fi
    IFS=, read -r -a names <<<"$hosts"
    count=${#names[@]}
    map=""
    for ((i = 0; i < count; i++)); do
      map+="${map:+,}${names[$i]}=10.77.0.$((i + 1))"
    done
    set_rate "$rate" "$queue" "$count"
    control="$work/$name.$case.$policy"
    mkdir -p "$control"
    limit=$(awk -v d="$duration" 'BEGIN {printf "%d", d + 30}')
    begin=$(date +%s%3N)
    start=$((begin + 1500))
    pids=()
    for ((i = 0; i < count; i++)); do
      timeout --kill-after=5 "$limit" ip netns exec "${prefix}-h$i" "$bin" lab host "$file" \
        --case "$case" --policy "$policy" --host "${names[$i]}" --hosts "$map" \
        --control "$control" --start-unix-ms "$start" --kernel-rate \
        >"$control/${names[$i]}.out" 2>"$control/${names[$i]}.err" &
      pids+=($!)
    done
    failed=0
    for ((i = 0; i < count; i++)); do
      wait "${pids[$i]}" || failed=1
    done
    result=$(cat "$control"/*.out)
    seconds=$(awk -v b="$begin" -v e="$(date +%s%3N)" 'BEGIN {printf "%.1f", (e - b) / 1000}')
    if [ "$failed" -ne 0 ] || [ -z "$result" ]; then
      echo "FAILED in netns: $label (${seconds} s)"
      for ((i = 0; i < count; i++)); do
        sed "s/^/  ${names[$i]}: /" "$control/${names[$i]}.err" | tail -5
      done
      status=1
      continue
    fi
    echo "$result" >>"$work/$name.netns.jsonl"
    echo "ran in netns: $label in ${seconds} s; tbf dropped $(tbf_drops "$count") packets"
  done < <("$bin" lab plan "$file")
  seed=$(sed -n 's/.*"seed":\([0-9]*\).*/\1/p' "$work/$name.virtual.json")
  {
    printf '{"scenario":"%s","seed":%s,"results":[' "$name" "$seed"
    paste -sd, "$work/$name.netns.jsonl"
    printf '],"anchors":{}}\n'
  } >"$work/$name.netns.json"
  echo
  echo "== $file: virtual time against network namespaces"
  ignore=()
  for entry in "${not_judged[@]}"; do
    ignore+=(--ignore "$entry")
  done
  for entry in "${tolerance_for[@]}"; do
    ignore+=(--tolerance-for "$entry")
  done
  "$bin" lab compare "$work/$name.virtual.json" "$work/$name.netns.json" --names virtual,netns \
    --tolerance "$tolerance" "${ignore[@]}" || status=1
done
echo
echo "netns-lab: $(($(date +%s) - started_all)) s, exit status $status"
exit "$status"
