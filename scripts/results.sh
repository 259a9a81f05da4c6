#!/usr/bin/env bash
# Regenerate docs/RESULTS.md and its charts (docs/plots/*.svg): every lab scenario (virtual time,
# plus the real-time calibration cross-check), every sweep in scenarios/sweeps/ at its file's case
# count, then the criterion benchmarks with their allocation counts, then the HTTP benchmark
# (bench/http.sh, needs wrk), the object store (bench/store.sh), the floods (bench/floods.sh,
# about 3 min), a connection flood (bench/http-flood.sh, about 5 s) and the transport against plain
# quinn (bench/transport.sh, about 1 min).
# Cost on a 2-core machine (release build, after the build): scenarios and sweeps about 20 min
# (ic-gossip the longest; each sweep file states its own cost), benchmarks about 8 min.
# The benchmarks measure wall-clock speed: run them on an otherwise idle machine.
# `--benchmarks-only` keeps the page's lab part as it is and reruns the benchmarks after it;
# `--lab-only` reruns the lab part and keeps the page's benchmark sections as they are.
set -euo pipefail
cd "$(dirname "$0")/.."

marker='## wire::fanout (criterion)'
line=$(grep -nF "$marker" docs/RESULTS.md 2>/dev/null | head -1 | cut -d: -f1 || true)
case "${1:-}" in
  --benchmarks-only | --lab-only)
    if [ -z "$line" ]; then
      echo "docs/RESULTS.md has no '$marker' section: run without $1" >&2
      exit 1
    fi
    ;;
esac
if [ "${1:-}" = "--benchmarks-only" ]; then
  head -n "$((line - 1))" docs/RESULTS.md >docs/RESULTS.md.lab
  mv docs/RESULTS.md.lab docs/RESULTS.md
elif [ "${1:-}" = "--lab-only" ]; then
  tail -n "+$line" docs/RESULTS.md >docs/RESULTS.md.benchmarks
  cargo run --release --quiet --bin meshwire -- lab results --out docs/RESULTS.md
  cat docs/RESULTS.md.benchmarks >>docs/RESULTS.md
  rm docs/RESULTS.md.benchmarks
  exit 0
else
  cargo run --release --quiet --bin meshwire -- lab results --out docs/RESULTS.md
fi

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
print("\nAnchors (docs/lessons.md): Safe Network \"one WireMsg to 1,000 destinations\" 7.58 -> 265 MiB/s;")
print("node memory peak ~1,800 -> ~900 MB. Target: <= 100 ns and <= 1 allocation per destination for")
print("1 MiB, >= 100x faster than the naive baseline.")
PY
rm -f "$alloc_log"

# Runs one bench script (`$1` its title, `$2` the script, then its arguments) and appends its
# section: the formatter function named in `$formatter` reads the script's log ($log) and prints
# the section's text; a failed script gets a "Not run" section with its last lines.
bench_section() {
  local title=$1 script=$2 log
  shift 2
  log=$(mktemp)
  if bash "$script" "$@" >"$log" 2>&1; then
    printf '\n## %s (%s)\n\n' "$title" "$script" >>docs/RESULTS.md
    "$formatter" "$log" >>docs/RESULTS.md
  else
    printf '\n## %s (%s)\n\nNot run: %s failed:\n\n```\n%s\n```\n' \
      "$title" "$script" "$script" "$(tail -5 "$log")" >>docs/RESULTS.md
  fi
  rm -f "$log"
}

# The HTTP benchmark of `meshwire node` (bench/http.sh, needs wrk): key lines into the page.
http_section() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
runs = text.split("== ")[1:]
def field(run, pattern):
    m = re.search(pattern, run)
    return m[1] if m else "n/a"
print("`bash bench/http.sh 10`: a release `meshwire node` alone on loopback (replication 1, so a GET is")
print("a quorum read of one local replica), then a 3-node cluster on loopback (replication 3, write")
print("quorum 2, read quorum 2: a GET asks the replicas over QUIC; three runs of it), load from `wrk`")
print("on the same 2-core machine. Rows name what wrk counted as not 2xx, if any.\n")
print("| run | requests/s | latency p50 | latency p99 | node peak RSS (VmHWM) |")
print("|---|---|---|---|---|")
for run in runs:
    if "PUTs of 8 MiB" in run.splitlines()[0]:
        continue
    name = run.splitlines()[0].split(":")[0]
    rps = field(run, r"Requests/sec:\s*([\d.]+)")
    p50 = field(run, r"(?m)^\s*50%\s+(\S+)")
    p99 = field(run, r"(?m)^\s*99%\s+(\S+)")
    rss = field(run, r"VmHWM[^:]*:\s*(\d+ kB)")
    errors = field(run, r"Non-2xx or 3xx responses:\s*(\d+)")
    if errors != "n/a":
        name += f" ({errors} not 2xx)"
    print(f"| {name} | {rps} | {p50} | {p99} | {rss} |")
print("\nTargets (issues 7 and 18): 4 KiB GET >= 20,000 requests/s and p99 <= 2 ms, alone and as a")
print("3-node quorum read; 250 clients on a 5 MB")
print("object: node peak RSS <= 150 MB. Seed (docs/lessons.md, Zold, ApacheBench -c 10 over the internet,")
print("not loopback): 52 requests/s, p50 176 ms, p99 361 ms.")
large = [run for run in runs if "PUTs of 8 MiB" in run.splitlines()[0]]
if large:
    print("\nLarge writes on the 3-node cluster, 64 PUTs of 8 MiB through one node, 8 at a time, each")
    print("acknowledged by two replicas: unconditional, then conditional (`If-None-Match: *` on new")
    print("keys, prepared and committed on two replicas each). The front node's RSS before each run and")
    print("its peak during it (reset before each run):\n")
    print("```")
    for run in large:
        for line in run.splitlines()[1:]:
            if line.startswith(("large_puts", "conditional_puts", "front node", "PUT ", "(peak")):
                print(line)
    print("```")
    print("\nBefore commit b18e518 (content copied into each replica's message, busy replicas counted as")
    print("failed), the same step on this machine: peak 280 MB over 33 MB, 63 of 64 created.")
PY
}
formatter=http_section bench_section "HTTP API" bench/http.sh 10

# The object store's memory, disk use and crash restart (bench/store.sh): its result lines.
store_section() {
  printf '`bash bench/store.sh`: one release `meshwire node` with default settings on loopback;\n'
  printf '128 PUTs of 8 MiB, the first 64 keys rewritten; SIGTERM (a graceful stop compacts a redb\n'
  printf 'file occupying over 1.2x the content it holds + 32 MiB of disk) and a restart; then SIGKILL\n'
  printf 'during a PUT and a restart; then 128 slow readers (32 from each of four loopback addresses)\n'
  printf 'each GET a distinct 8 MiB object, read 64 KiB and stall. The store is the redb file and the\n'
  printf 'content files of objects of 64 KiB or more.\n\n'
  printf '```\n'
  grep -E '^(rss_|put_seconds|rewrote|content_mb|graceful_stop|compacted|after_graceful_stop|restart_|acknowledged_|read_back|slow_readers)' "$1"
  printf '```\n\nTargets (issue 19): RSS within the store budget (128 MiB) + 100 MB; store at most\n'
  printf '1.3x its content; restart after SIGKILL with a 1 GB store within 2 s. Before (issue 19,\n'
  printf 'debug build): RSS 1.1-1.26 GB after 100 PUTs of 8 MiB, a 1.7 GB file for 868 MB, restart 13 s.\n'
  printf 'With all content in redb (before content files), the file stayed at 1.50x after compaction.\n'
  printf 'Slow readers before GET streamed from content files (same machine, before commit fa23ba2):\n'
  printf '+596 MB RSS with 82 of the 128 served, each holding its object whole.\n'
}
formatter=store_section bench_section "Object store" bench/store.sh

# Floods from one hostile peer (bench/floods.sh, 1,000,000 messages): each flood's result lines.
floods_section() {
  printf '`bash bench/floods.sh`: one flooding peer against a bare node, an object daemon and a\n'
  printf 'session relay, 1,000,000 messages per flood (release build; about 3 min). Per flood: the\n'
  printf "victim's heap (counting allocator, the victim's threads only) before, at its peak and after,\n"
  printf 'beside its configured bound, and the process RSS.\n\n'
  printf '```\n'
  grep -E '^flood ' "$1"
  printf '```\n\nTargets (issues 17 and 19): the heap within its configured bound during every flood,\n'
  printf 'back within 10%% of its level before after it, and honest peers served throughout.\n'
}
formatter=floods_section bench_section "Floods" bench/floods.sh

# A connection flood against the HTTP API and /status timed meanwhile (bench/http-flood.sh).
http_flood_section() {
  printf '`bash bench/http-flood.sh`: a release `meshwire node` with default HTTP limits on loopback;\n'
  printf '300 idle connections from one address, then ten more addresses holding 32 each (past the\n'
  printf 'total of 256). Meanwhile 20 `GET /status` from another address per phase, timed from connect\n'
  printf "to the answer's end; then the node's refusal counters.\n\n"
  printf '```\n'
  grep -E '^(one address|11 addresses|meshwire_http_refused)' "$1"
  printf '```\n\nTarget (issue 19): a connection flood beyond the cap gets 503 and `/status` still answers\n'
  printf 'within 100 ms.\n'
}
formatter=http_flood_section bench_section "HTTP connection flood" bench/http-flood.sh

# meshwire's bulk transfer beside plain quinn on one loopback connection (bench/transport.sh).
transport_section() {
  printf '`bash bench/transport.sh`: one connection on 127.0.0.1, 7 alternating rounds of 1 GiB per\n'
  printf 'side: meshwire batches between two default nodes, and plain quinn as its `perf` tool uses it\n'
  printf '(default transport config, one unidirectional stream), both from one release build of\n'
  printf '`crates/meshwire/examples/transport.rs`. Gbit/s timed by the sender until every byte is\n'
  printf 'acknowledged; CPU is user + system time of the sending and receiving processes per GB moved.\n\n'
  printf '```\n'
  sed -n '/^round /,$p' "$1"
  printf '```\n\nTarget (issue 15): meshwire >= 0.9x plain quinn. Shared 2-core machine: read the medians.\n'
}
formatter=transport_section bench_section "Transport" bench/transport.sh
echo "wrote docs/RESULTS.md" >&2
