#!/usr/bin/env bash
# Builds (unless prebuilt binaries are given) and runs the CUDA backend's GPU tests and benchmark on a machine
# with an NVIDIA GPU. One command:
#
#   scripts/gpu_test.sh [--bench-args "--sizes 1b,4b,27b --quants bf16,int8,int4"] [--no-bench] [--no-tests]
#
# Tests: every tests/unit/test_cuda_*.c (test_cuda_matmul, test_cuda_attention, test_cuda_rows: kernels against CPU
# references; test_cuda_model: whole models against the fixtures' references).
# Environment: G3_GPU_PREBUILT=DIR  use DIR/{test_cuda_*,g3cuda_bench} (and DIR/lib/*.so on
#              LD_LIBRARY_PATH) instead of building (for machines without the Debian -dev packages);
#              G3_FIXTURES=DIR      fixture models (default ../shared/fixtures); OUT=DIR  where logs go (default
#              ./gpu-results); G3_TEST_TIMEOUT / G3_BENCH_TIMEOUT  seconds allowed per test / for the benchmark
#              (default 900 / 3600). Prints a summary last; exits non-zero if a test failed.
set -u -o pipefail
cd "$(dirname "$0")/.."
BENCH_ARGS="--sizes 1b,4b,27b --quants bf16,int8,int4"
RUN_BENCH=1 RUN_TESTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bench-args) BENCH_ARGS="$2"; shift 2 ;;
    --no-bench) RUN_BENCH=0; shift ;;
    --no-tests) RUN_TESTS=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$PWD/gpu-results}"
TESTS=""
for t in tests/unit/test_cuda_*.c; do TESTS="$TESTS $(basename "$t" .c)"; done
mkdir -p "$OUT"
export G3_FIXTURES="${G3_FIXTURES:-$PWD/../shared/fixtures}"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"

if [ -n "${G3_GPU_PREBUILT:-}" ]; then
  BIN="$G3_GPU_PREBUILT"
  export LD_LIBRARY_PATH="$BIN/lib:${LD_LIBRARY_PATH:-}"
else
  BIN="$PWD/build-gpu"
  cmake -S . -B "$BIN" -DCMAKE_BUILD_TYPE=Release -DG3_CUDA=ON >"$OUT/cmake.log" 2>&1 || { tail -20 "$OUT/cmake.log"; exit 1; }
  # shellcheck disable=SC2086
  cmake --build "$BIN" -j"$(nproc)" --target $TESTS g3cuda_bench >"$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
fi

status=0
summary=""
if [ "$RUN_TESTS" = 1 ]; then
  for t in $TESTS; do
    timeout "${G3_TEST_TIMEOUT:-900}" "$BIN/$t" >"$OUT/$t.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    summary="$summary$t: exit $rc\n"
    cat "$OUT/$t.log"
  done
fi
if [ "$RUN_BENCH" = 1 ]; then
  # shellcheck disable=SC2086
  timeout "${G3_BENCH_TIMEOUT:-3600}" "$BIN/g3cuda_bench" $BENCH_ARGS 2>&1 | tee "$OUT/bench.md"
  [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
fi
printf "%b" "$summary"
exit $status
