#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang and runs each for a bounded time
# on its corpus, tests/fuzz/corpus/<name>/, which it grows; new inputs are merged back in
# minimised (-merge=1), so the corpus stays small. Exit status: non-zero on a crash (the
# crashing input is left in tests/fuzz/crashes/).
#
#   scripts/native_checks/fuzz.sh [SECONDS_EACH] [HARNESS...]   # default 30 s, all four
#
# Needs clang and its libFuzzer runtime (Debian: clang-14 libclang-rt-14-dev).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-30}
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(frame manifest delta state)
cxx=${CXX:-$(command -v clang++ || command -v clang++-14)}
build=${RLBOOST_FUZZ_BUILD:-$root/build/fuzz}
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DRLBOOST_FUZZ=ON \
  -DRLBOOST_BUILD_PYTHON=OFF -DRLBOOST_WITH_CUDA=OFF -DRLBOOST_WITH_UCX=OFF >/dev/null
targets=()
for h in "${harnesses[@]}"; do targets+=("fuzz_$h"); done
cmake --build "$build" --target "${targets[@]}" -j "${RLBOOST_FUZZ_JOBS:-2}" >/dev/null
mkdir -p "$root/tests/fuzz/crashes"
for h in "${harnesses[@]}"; do
  corpus="$root/tests/fuzz/corpus/$h"
  found=$(mktemp -d)
  mkdir -p "$corpus"
  echo "fuzz_$h: ${seconds}s from $(ls "$corpus" | wc -l) corpus inputs"
  # A fresh folder collects what this run finds; the kept corpus is only read, then the
  # new inputs that add coverage are merged into it.
  status=0
  "$build/tests/fuzz/fuzz_$h" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$root/tests/fuzz/crashes/$h-" -print_final_stats=1 "$found" "$corpus" \
    >"$found.log" 2>&1 || status=$?
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|==[0-9]+==ERROR|SUMMARY)" "$found.log" || true
  [ "$status" -eq 0 ] || tail -n 40 "$found.log" >&2
  rm -f "$found.log"
  "$build/tests/fuzz/fuzz_$h" -merge=1 "$corpus" "$found" >/dev/null 2>&1
  rm -rf "$found"
  if [ "$status" -ne 0 ]; then
    echo "fuzz_$h: crashed (exit $status); inputs in tests/fuzz/crashes/" >&2
    exit "$status"
  fi
done
