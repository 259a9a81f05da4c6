#!/usr/bin/env bash
# Run every cargo-fuzz target in fuzz/ for SECONDS each (default 60), one at a time, and print a
# table: target, wall seconds, executions, exec/s, corpus size, crashes. Exit status 1 if any
# target crashed (a panic, a timeout of one input over 10 s, or running out of memory), 0 if none.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# The targets are built with cargo alone, with the instrumentation flags cargo-fuzz 0.13.2 passes
# for `--sanitizer none` (so this needs no cargo-fuzz install, only a C++ compiler for libFuzzer):
# optimized, with debug assertions and overflow checks. No sanitizer: the fuzzed crates have no
# `unsafe` code, so AddressSanitizer would find nothing safe Rust does not already check, at about
# half the speed (docs/fuzzing.md). Executions and exec/s are libFuzzer's own final stats
# (-print_final_stats=1), never estimated.
#
# Each target reads its committed corpus, fuzz/corpus/<target>/ (left untouched), and writes what
# it finds to fuzz/target/fuzz-runs/<target>/corpus/ (emptied at the start of each run), crash
# inputs to fuzz/target/fuzz-runs/<target>/artifacts/ and libFuzzer's log to .../log.
#
# CARGO_TARGET_DIR is ignored: the fuzz crate has its own workspace and builds into fuzz/target.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...] (SECONDS: a whole number >= 1)" >&2
  exit 2
fi
shift $(($# > 0 ? 1 : 0))

mapfile -t all_targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^meshwire-fuzz$')
if [ $# -gt 0 ]; then
  targets=("$@")
  for target in "${targets[@]}"; do
    if [[ " ${all_targets[*]} " != *" $target "* ]]; then
      echo "no fuzz target '$target'; the targets are: ${all_targets[*]}" >&2
      exit 2
    fi
  done
else
  targets=("${all_targets[@]}")
fi

if ! command -v c++ >/dev/null 2>&1; then
  echo "fuzz.sh needs a C++ compiler (c++) to build libFuzzer: apt-get install g++" >&2
  exit 1
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
# cargo-fuzz 0.13.2's flags for `cargo fuzz build --sanitizer none` (see `cargo fuzz build -v`).
# With --target, RUSTFLAGS reach only the target's code, not build scripts or proc macros.
flags=(
  -Cpasses=sancov-module
  -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
  -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares
  --cfg fuzzing
  -Cllvm-args=-simplifycfg-branch-fold-threshold=0
  -Cllvm-args=-sanitizer-coverage-stack-depth
  -Cdebug-assertions
  -Ccodegen-units=1
)
unset CARGO_TARGET_DIR
build_start=$(date +%s)
bins=()
for target in "${targets[@]}"; do bins+=(--bin "$target"); done
# scripts/fuzz-rustc.sh leaves one third-party codec uninstrumented (see its header).
RUSTC_WRAPPER="$PWD/scripts/fuzz-rustc.sh" RUSTFLAGS="${flags[*]}" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  cargo build --locked --quiet --release --manifest-path fuzz/Cargo.toml --target "$triple" "${bins[@]}"
echo "built ${#targets[@]} fuzz targets in $(($(date +%s) - build_start)) s"

runs=fuzz/target/fuzz-runs
rows=()
crashed=0
total_start=$(date +%s)
for target in "${targets[@]}"; do
  work="$runs/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts" "fuzz/corpus/$target"
  echo "== $target: ${seconds} s (log: $work/log)"
  start=$(date +%s.%N)
  status=0
  "fuzz/target/$triple/release/$target" "$work/corpus" "fuzz/corpus/$target" \
    -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -max_len=4096 \
    -artifact_prefix="$work/artifacts/" >"$work/log" 2>&1 || status=$?
  wall=$(awk -v start="$start" -v end="$(date +%s.%N)" 'BEGIN { print end - start }')
  stat() { sed -n "s/^stat::$1: *//p" "$work/log" | tail -n 1; }
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  # libFuzzer's status lines end with "corp: UNITS/SIZE"; the last one is the corpus it ended with.
  corpus=$(grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$work/log" | tail -n 1 | cut -d' ' -f2 || true)
  crashes=$(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \
    -o -name 'leak-*' \) | wc -l)
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    crashes=1 # libFuzzer failed without writing an input (e.g. it could not start): count it.
  fi
  if [ "$crashes" -ne 0 ]; then
    crashed=1
    echo "$target CRASHED (exit $status): see $work/log and $work/artifacts/" >&2
    grep -E "panicked at|ERROR: libFuzzer|SUMMARY" "$work/log" | head -n 5 >&2 || true
  fi
  rows+=("$(printf '| %-20s | %7.1f | %12s | %8s | %-18s | %7s |' "$target" "$wall" "${execs:--}" \
    "${rate:--}" "${corpus:--}" "$crashes")")
done

echo
echo "fuzzed ${#targets[@]} targets for ${seconds} s each in $(($(date +%s) - total_start)) s (sanitizer: none; $(rustc -V))"
printf '| %-20s | %7s | %12s | %8s | %-18s | %7s |\n' target "wall s" executions "exec/s" "corpus units/size" crashes
printf '|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..22})" "--------:" "-------------:" \
  "---------:" "$(printf -- '-%.0s' {1..20})" "--------:"
printf '%s\n' "${rows[@]}"
exit "$crashed"
