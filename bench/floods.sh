#!/usr/bin/env bash
# Floods from one hostile peer, in release, with 1,000,000 messages (or the count given).
# Against a bare meshwire node (crates/meshwire/tests/floods.rs): messages to a protocol nobody
# reads, messages to a subscriber that never reads, 10,000 streams opened and never finished, and
# requests to every reserved protocol on a node that serves none. Against a running object daemon
# (crates/objects/tests/floods.rs): a non-member's FETCH/STORE/CAS/OBJECT_STAMPS/OBJECT_SYNC
# requests, a member's fetches of missing keys then one malformed request of each kind (each
# closes its connection), and oversized stores (1 per 100 messages, at most 2,000: each is
# megabytes). Against a session relay (crates/session/tests/relay_flood.rs): relay requests from
# one peer, then a malformed one (it closes the connection). Prints, per flood, the victim's heap
# (counting allocator, the victim's threads only) before, at its peak and after, beside its bound,
# and the process RSS.
# The same code runs with 20,000 messages in `cargo test`.
# Usage: bench/floods.sh [messages]
set -euo pipefail
cd "$(dirname "$0")/.."
messages=${1:-1000000}
for target in "meshwire floods" "meshwire-objects floods" "meshwire-session relay_flood"; do
  set -- $target
  MESHWIRE_FLOOD_MESSAGES=$messages cargo test --release --locked --quiet -p "$1" \
    --test "$2" -- --nocapture --test-threads=1 2>&1 |
    grep -E 'flood |test result' | sed 's/^.*\(flood \)/\1/'
done
