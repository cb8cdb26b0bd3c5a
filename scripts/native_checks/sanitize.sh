#!/usr/bin/env bash
# Builds the native core under a sanitizer and runs, against that build:
#   - the C++ unit tests (CTest), and
#   - the Python transfer and migration tests, with rlboost._C and rlboost._C_testing
#     from the instrumented build and the sanitizer's runtime preloaded into Python.
# Any report fails the run (ASan/UBSan abort on the first; TSan exits non-zero).
#
#   scripts/native_checks/sanitize.sh address   # AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/native_checks/sanitize.sh thread    # ThreadSanitizer
#   PYTEST_ARGS="tests/transfer/test_roundtrip.py" scripts/native_checks/sanitize.sh address
#
# Needs g++ (its libasan/libubsan/libtsan) and GoogleTest (Debian: libgtest-dev); run from
# an environment where `import rlboost` works (the README's test set-up).
set -euo pipefail
kind=${1:?address or thread}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${RLBOOST_SANITIZE_BUILD:-$root/build/sanitize-$kind}
python=${PYTHON:-python}
cmake -S "$root" -B "$build" -DRLBOOST_SANITIZE="$kind" -DRLBOOST_BUILD_TESTS=ON \
  -DRLBOOST_WITH_CUDA=OFF -DRLBOOST_WITH_UCX=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null
cmake --build "$build" -j "${RLBOOST_SANITIZE_JOBS:-2}" >/dev/null

if [ "$kind" = address ]; then
  runtime=$(g++ -print-file-name=libasan.so)
  # Python's own allocator hides heap errors from ASan; leaks at exit are Python's, not ours.
  export PYTHONMALLOC=malloc
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:halt_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
else
  runtime=$(g++ -print-file-name=libtsan.so)
  # pymalloc reuses freed memory without telling the sanitizer, which then relates accesses
  # to two different objects that shared an address: Python allocates with malloc here too.
  export PYTHONMALLOC=malloc
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:die_after_fork=0:suppressions=$root/scripts/native_checks/tsan.supp}
  # die_after_fork=0: the fork-guard tests' children start threads after a multi-threaded
  # fork, which ThreadSanitizer otherwise refuses outright.
  export OMP_NUM_THREADS=1  # torch's libgomp threads: see tsan.supp
fi

echo "== C++ unit tests under $kind"
# The C++ tests own their whole process, so a leak there is the core's: LeakSanitizer on.
cpp_asan=${ASAN_OPTIONS:-}
(cd "$build" && ASAN_OPTIONS=${cpp_asan/detect_leaks=0/detect_leaks=1} ctest --output-on-failure -j2)

echo "== Python transfer and migration tests under $kind"
# Python loads libstdc++ only with the first extension, after the sanitizer's start-up, which
# then cannot find the real __cxa_throw (its first C++ exception aborts): preload it as well.
runtime="$runtime $(g++ -print-file-name=libstdc++.so.6)"
# Reports go to files (pytest captures stderr, and an abort loses what it captured).
reports=$(mktemp -d)
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:log_path=$reports/report" UBSAN_OPTIONS="${UBSAN_OPTIONS:-}:log_path=$reports/report"
export TSAN_OPTIONS="${TSAN_OPTIONS:-}:log_path=$reports/report"
# The instrumented modules stand in for the built ones in a copy of the package and its
# tests, run from that copy (so its rlboost is the one imported).
shadow=$(mktemp -d)
trap 'rm -rf "$shadow" "$reports"' EXIT
cp -r "$root/rlboost" "$root/tests" "$root/pyproject.toml" "$shadow/"
rm -f "$shadow"/rlboost/_C*.so
cp "$build"/_C*.so "$shadow/rlboost/"
# An editable install puts a finder for its own source tree ahead of PYTHONPATH, so the copy
# would not be the one imported: run Python without site processing (no .pth finders), the
# copy first and the environment's packages after it, and check which modules load.
site_dirs=$("$python" -c 'import os, site; print(os.pathsep.join(site.getsitepackages()))')
run_python() { (cd "$shadow" && PYTHONPATH="$shadow:$site_dirs" "$python" -S "$@"); }
LD_PRELOAD="$runtime" run_python -c "
import sys, rlboost._C as c, rlboost._C_testing as t
for m in (c, t):
    if not m.__file__.startswith('$shadow/'):
        sys.exit(f'sanitize.sh: {m.__name__} came from {m.__file__}, not the instrumented build')
" || { echo "sanitize.sh: not running the instrumented build" >&2; exit 2; }
# shellcheck disable=SC2086
status=0
skip=()
if [ "$kind" = thread ]; then
  # ThreadSanitizer does not support a child that starts threads after a multi-threaded
  # fork (its own limitation: the child's reports are about TSan's state, not ours); the
  # fork guard is checked under AddressSanitizer and in the C++ unit tests instead.
  skip=(--deselect tests/transfer/test_fork.py)
fi
LD_PRELOAD="$runtime" run_python -m pytest -p no:cacheprovider -n 0 -q "${skip[@]}" \
  -m 'not gpu and not slow and not netns' ${PYTEST_ARGS:-tests/transfer tests/migration} || status=$?
if compgen -G "$reports/report*" >/dev/null; then
  cat "$reports"/report* >&2
  echo "$kind: $(ls "$reports" | wc -l) report(s)" >&2
  exit 1
fi
echo "$kind: 0 reports"
exit "$status"
