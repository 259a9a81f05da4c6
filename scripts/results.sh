#!/usr/bin/env bash
# Regenerate docs/RESULTS.md: every lab scenario (virtual time, plus the real-time calibration
# cross-check), then the criterion benchmarks with their allocation counts.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo run --release --quiet --bin meshwire -- lab results --out docs/RESULTS.md

alloc_log=$(mktemp)
cargo bench --quiet -p meshwire-proto --bench fanout 2>"$alloc_log" >/dev/null
python3 - "$alloc_log" >>docs/RESULTS.md <<'PY'
import json, pathlib, re, sys
allocs = {}
for line in open(sys.argv[1]):
    m = re.match(r"wire::fanout/dsts=(\d+)/payload_bytes=(\d+): meshwire ([\d.]+) allocations and ([\d.]+) bytes per destination; naive ([\d.]+) allocations and ([\d.]+) bytes", line)
    if m:
        allocs[(m[1], m[2])] = m.groups()[2:]
def mean_ns(policy, param):
    path = pathlib.Path("target/criterion/wire__fanout") / policy / param.replace("/", "_") / "new/estimates.json"
    return json.loads(path.read_text())["mean"]["point_estimate"]
print("## wire::fanout (criterion)\n")
print("One message encoded for 1000 destinations: meshwire's encode-once against a naive encoder")
print("that serialises the whole frame per destination (the Safe Network's \"before\"). Command:")
print("`cargo bench -p meshwire-proto --bench fanout`; allocations counted by the counting allocator.\n")
print("| dsts | payload_bytes | policy | ns per destination | allocations per destination | bytes allocated per destination | speed-up vs naive |")
print("|---|---|---|---|---|---|---|")
for (dsts, size), (a_ours, b_ours, a_naive, b_naive) in sorted(allocs.items(), key=lambda kv: -int(kv[0][1])):
    param = f"dsts={dsts}/payload_bytes={size}"
    ours = mean_ns("meshwire", param) / int(dsts)
    naive = mean_ns("naive", param) / int(dsts)
    print(f"| {dsts} | {size} | meshwire | {ours:.1f} | {a_ours} | {b_ours} | {naive / ours:.0f}x |")
    print(f"| {dsts} | {size} | naive | {naive:.1f} | {a_naive} | {b_naive} | 1x |")
print("\nAnchors (seeds/004): Safe Network \"one WireMsg to 1,000 destinations\" 7.58 -> 265 MiB/s;")
print("node memory peak ~1,800 -> ~900 MB. Target: <= 100 ns and <= 1 allocation per destination for")
print("1 MiB, >= 100x faster than the naive baseline.")
PY
rm -f "$alloc_log"
echo "wrote docs/RESULTS.md" >&2
