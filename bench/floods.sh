#!/usr/bin/env bash
# Floods from one hostile peer against a meshwire node, in release, with 1,000,000 messages (or
# the count given): messages to a protocol nobody reads, messages to a subscriber that never
# reads, 10,000 streams opened and never finished, and requests to every reserved protocol on a
# node that serves none. Prints, per flood, the victim's heap (counting allocator, the victim's
# threads only) before, at its peak and after, beside its bound, and the process RSS. The same
# code runs with 20,000 messages in `cargo test` (crates/meshwire/tests/floods.rs).
# Usage: bench/floods.sh [messages]
set -euo pipefail
cd "$(dirname "$0")/.."
MESHWIRE_FLOOD_MESSAGES=${1:-1000000} cargo test --release --locked --quiet -p meshwire \
  --test floods -- --nocapture --test-threads=1 2>&1 |
  grep -E 'flood |test result' | sed 's/^.*\(flood \)/\1/'
