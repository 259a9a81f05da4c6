# Network namespaces joined by veth pairs through a bridge, with `tc tbf` rate limits: the one
# helper scripts/netns-lab.sh and scripts/netns-cluster.sh share. Source it from a bash script
# running under `set -euo pipefail`.
#
# The bridge lives in a namespace of its own, so nothing is attached to the root namespace and
# traffic stays inside the namespaces created here. Host namespace i has `eth0`, whose peer is the
# bridge port `p<i>` in the bridge namespace; a tbf on `p<i>` shapes what host i receives.
#
#   netns_require SCRIPT PREFIX      exit 0 with "skipped: ..." unless root with ip, tc, netns
#   netns_add NAME                   create a namespace (loopback up), deleted by netns_cleanup
#   netns_bridge NS MTU              create namespace NS holding bridge br0
#   netns_attach BRIDGE_NS NS I ADDRESS/PREFIX MTU
#                                    veth from NS (eth0, ADDRESS) to bridge port p<I>
#   netns_tbf BRIDGE_NS I RATE_BITS BURST_BYTES LIMIT_BYTES
#                                    a fresh tbf on port p<I> (RATE_BITS 0: none)
#   netns_tbf_drops BRIDGE_NS I      packets that tbf dropped
#   netns_cleanup                    terminate every process in the namespaces, delete them

NETNS_NAMESPACES=()

netns_skip() {
  echo "skipped: $*"
  exit 0
}

netns_require() { # script prefix
  [ "$(id -u)" -eq 0 ] || netns_skip "$1 needs root (network namespaces, veth, tc)"
  command -v ip >/dev/null 2>&1 || netns_skip "no 'ip' command (install iproute2)"
  command -v tc >/dev/null 2>&1 || netns_skip "no 'tc' command (install iproute2)"
  local probe="$2-probe"
  ip netns add "$probe" 2>/dev/null || netns_skip "cannot create network namespaces here (ip netns add failed)"
  ip netns del "$probe"
}

netns_add() { # name
  ip netns add "$1"
  NETNS_NAMESPACES+=("$1")
  ip -n "$1" link set lo up
}

netns_bridge() { # namespace mtu
  netns_add "$1"
  ip -n "$1" link add br0 type bridge
  ip -n "$1" link set br0 mtu "$2" up
}

netns_attach() { # bridge_namespace namespace index address/prefix mtu
  local bridge=$1 ns=$2 i=$3 address=$4 mtu=$5
  ip -n "$bridge" link add "p$i" mtu "$mtu" type veth peer name eth0 netns "$ns" mtu "$mtu"
  ip -n "$bridge" link set "p$i" master br0 up
  ip -n "$ns" addr add "$address" dev eth0
  ip -n "$ns" link set eth0 up
}

netns_tbf() { # bridge_namespace index rate_bits burst_bytes limit_bytes
  local bridge=$1 i=$2 rate=$3 burst=$4 limit=$5
  # A fresh qdisc each time, so its drop counter counts from now.
  tc -n "$bridge" qdisc del dev "p$i" root 2>/dev/null || true
  [ "$rate" -gt 0 ] || return 0
  tc -n "$bridge" qdisc add dev "p$i" root tbf rate "${rate}bit" burst "$burst" limit "$limit"
}

netns_tbf_drops() { # bridge_namespace index
  local dropped
  dropped=$(tc -s -n "$1" qdisc show dev "p$2" | awk '/dropped/ {gsub(",", "", $7); print $7; exit}')
  echo "${dropped:-0}"
}

netns_cleanup() {
  local ns pid
  for ns in "${NETNS_NAMESPACES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill "$pid" 2>/dev/null || true
    done
  done
  for ns in "${NETNS_NAMESPACES[@]}"; do
    ip netns del "$ns" 2>/dev/null || true
  done
  NETNS_NAMESPACES=()
}

# Sets `work` to a fresh directory /tmp/TAG.XXXXXX; at exit, also on a signal, every namespace
# made so far and that directory are removed.
netns_workdir() { # tag
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  trap 'netns_cleanup; rm -rf "$work"' EXIT
  trap 'exit 130' INT TERM
}

# Sets `bin` to the meshwire binary: $MESHWIRE if given, else a release build of this checkout.
netns_meshwire() {
  if [ -n "${MESHWIRE:-}" ]; then
    bin=$MESHWIRE
  else
    echo "== building meshwire (release)"
    cargo build --release --locked --quiet -p meshwire-cli
    bin="${CARGO_TARGET_DIR:-target}/release/meshwire"
  fi
}
