#!/usr/bin/env bash
# Runs every test: the release build's tests, the same tests under AddressSanitizer + UndefinedBehaviorSanitizer,
# and the script suites (tests/*/run.sh). Ends with the line "N passed, N failed"; exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
./scripts/setup.sh >/dev/null || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

JOBS=$(nproc)
LOG=${TEST_LOG_DIR:-$ROOT/build-testlogs}
rm -rf "$LOG"; mkdir -p "$LOG"
passed=0; failed=0; failures=()

build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" "$@" >"$LOG/cmake-$(basename "$dir").log" 2>&1 &&
  cmake --build "$dir" -j"$JOBS" >"$LOG/build-$(basename "$dir").log" 2>&1
}

# Runs each cmocka test binary of a build; counts cmocka's per-case results.
run_suite() { # build dir, label
  local dir=$1 label=$2
  for t in "$dir"/test_*; do
    [ -x "$t" ] || continue
    local name; name=$(basename "$t")
    local out="$LOG/$label-$name.log"
    G3_SOURCE_DIR=$ROOT G3_BIN=$dir/gemma3 timeout 1500 "$t" >"$out" 2>&1
    local rc=$?
    local p f
    p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out" | grep -oE '[0-9]+$' | tail -1)
    f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$out" | grep -oE '[0-9]+' | tail -1)
    p=${p:-0}; f=${f:-0}
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi  # crashed or sanitizer abort
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" -gt 0 ]; then failures+=("$label/$name (see $out)"); echo "FAIL $label/$name"; tail -25 "$out"
    else echo "ok   $label/$name ($p)"; fi
  done
}

echo "== release build"
if build build -DCMAKE_BUILD_TYPE=Release; then run_suite build release
else echo "release build failed:"; tail -30 "$LOG/build-build.log"; failed=$((failed + 1)); failures+=("release build"); fi

echo "== sanitizer build (ASan + UBSan)"
if build build-asan -DCMAKE_BUILD_TYPE=Debug -DG3_SANITIZE=ON -DG3_CUDA=OFF; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS=suppressions=$ROOT/tests/lsan.supp run_suite build-asan asan
else echo "sanitizer build failed:"; tail -30 "$LOG/build-build-asan.log"; failed=$((failed + 1)); failures+=("asan build"); fi

echo "== script suites"
for s in tests/*/run.sh; do
  [ -f "$s" ] || continue
  out="$LOG/$(basename "$(dirname "$s")")-run.log"
  G3_SOURCE_DIR=$ROOT G3_BIN=$ROOT/build/gemma3 PYTHON=$ROOT/.venv/bin/python timeout 1800 bash "$s" >"$out" 2>&1
  rc=$?
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -1)
  p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}')
  p=${p:-0}; f=${f:-0}
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$f" -gt 0 ]; then failures+=("$s (see $out)"); echo "FAIL $s"; tail -25 "$out"; else echo "ok   $s ($p)"; fi
done

if [ ${#failures[@]} -gt 0 ]; then echo "failed:"; printf '  %s\n' "${failures[@]}"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
