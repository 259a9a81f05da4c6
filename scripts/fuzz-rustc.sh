#!/usr/bin/env bash
# rustc wrapper for scripts/fuzz.sh (RUSTC_WRAPPER): compiles the crates listed below without
# libFuzzer's coverage instrumentation, every other crate as given.
#
# reed-solomon-simd is a maintained third-party erasure code that `decode_repair` calls on every
# rebuilt hole. Instrumented, its arithmetic loops reported every 16-bit comparison to libFuzzer:
# 74% of that target's time went to the comparison callbacks (perf, 30 s on the corpus), guiding
# mutations into the codec's field arithmetic rather than into meshwire's decoders. Its code
# still runs on every input and is still checked by the target's invariants; only its coverage
# is not fed back.
set -euo pipefail
rustc=$1
shift
uninstrumented=" reed_solomon_simd "
crate=""
previous=""
for arg in "$@"; do
  if [ "$previous" = "--crate-name" ]; then crate=$arg; fi
  previous=$arg
done
if [ -n "$crate" ] && [[ $uninstrumented == *" $crate "* ]]; then
  args=()
  for arg in "$@"; do
    case $arg in
      -Cpasses=sancov-module | -Cllvm-args=-sanitizer-coverage-*) ;;
      *) args+=("$arg") ;;
    esac
  done
  exec "$rustc" "${args[@]}"
fi
exec "$rustc" "$@"
