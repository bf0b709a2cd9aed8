#!/usr/bin/env bash
# CPU benchmark of issue 2: memory read bandwidth, then the Gemma 3 1B shape (random weights) in BF16, Q8_0 and
# Q4_0 with 1 and 2 threads: prefill of 128 and 512 tokens, decode of 64 tokens, decode as a share of the measured
# read bandwidth. Prints a markdown table. Usage: [TYPES="q5_0 q4_k_m ..."] [THREADS="2"] bench/cpu_bench.sh [build dir]
# [shape] (TYPES: any --type of `gemma3 bench`, mixes included; default "bf16 q8_0 q4_0", threads "1 2")
set -euo pipefail
B=${1:-build}
SHAPE=${2:-1b}
cmake --build "$B" -j"$(nproc)" --target gemma3 bench_membw >/dev/null
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; commit $(git rev-parse --short HEAD)"
echo
echo "| shape | type | threads | read GB/s | prefill 128 tok/s | prefill 512 tok/s | decode tok/s | decode weight GB/s | % of read bandwidth |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in ${THREADS:-1 2}; do
  bw=$("$B/bench_membw" -t "$t" | grep -oE '[0-9]+(\.[0-9]+)? GB/s' | tail -1 | awk '{print $1}')
  for ty in ${TYPES:-bf16 q8_0 q4_0}; do
    out128=$("$B/gemma3" bench --random-weights "$SHAPE" --type "$ty" -t "$t" --n-prompt 128 --n-gen 64 --bw "$bw" --backend cpu)
    out512=$("$B/gemma3" bench --random-weights "$SHAPE" --type "$ty" -t "$t" --n-prompt 512 --n-gen 8 --backend cpu)
    p128=$(echo "$out128" | sed -n 's/^prefill .*: *\([0-9.]*\) tok\/s.*/\1/p')
    p512=$(echo "$out512" | sed -n 's/^prefill .*: *\([0-9.]*\) tok\/s.*/\1/p')
    dec=$(echo "$out128" | sed -n 's/^decode .*: *\([0-9.]*\) tok\/s.*/\1/p')
    gbs=$(echo "$out128" | sed -n 's/.*weights \([0-9.]*\) GB\/s.*/\1/p')
    pct=$(echo "$out128" | sed -n 's/.* = \([0-9]*\)% of.*/\1/p')
    echo "| $SHAPE | $ty | $t | $bw | $p128 | $p512 | $dec | $gbs | $pct% |"
  done
done
