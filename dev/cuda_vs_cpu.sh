#!/usr/bin/env bash
# Compares `gemma3 logits` of the CUDA backend with the CPU backend on a model for prompt lengths 1..N, last position
# and all positions, under the environment given (e.g. G3_CUDA_GEMVPF=1). Prints the largest relative error per case.
# The CPU backend keeps a float32 K/V cache; the CUDA default is bf16 where the kernels take the model (~1e-3 relative
# on the logits): G3_CUDA_KV=f32 for the tight comparison.
#   dev/cuda_vs_cpu.sh MODEL [lengths...]      ($G3 = gemma3 binary)
set -u
M="$1"; shift; L="${*:-1 2 3 4 5 6 7 8 9 16 17 40}"; T=$(mktemp -d)
for n in $L; do
  ids=$(seq -s, 2 $((n + 1)))
  for all in "" --all-positions; do
    "$G3" logits -m "$M" --prompt-ids "$ids" $all --backend cpu -t 1 -o "$T/c" 2>/dev/null || echo "cpu failed"
    "$G3" logits -m "$M" --prompt-ids "$ids" $all --backend cuda -o "$T/g" 2>"$T/err" || { echo "n=$n $all cuda failed: $(tail -1 $T/err)"; continue; }
    python3 - "$T/c" "$T/g" "$n" "$all" <<'PY'
import sys, numpy as np
c = np.fromfile(sys.argv[1], np.float32); g = np.fromfile(sys.argv[2], np.float32)
if c.size != g.size: print("n=%s %s size %d vs %d" % (sys.argv[3], sys.argv[4], c.size, g.size)); sys.exit()
n = int(sys.argv[3]); rows = c.reshape(-1, c.size // (n if sys.argv[4] else 1))
gr = g.reshape(rows.shape)
e = [float(np.abs(a - b).max() / max(1, np.abs(a).max())) for a, b in zip(rows, gr)]
print("n=%-3s %-15s worst %.3g  per row %s" % (sys.argv[3], sys.argv[4] or "last", max(e), " ".join("%.0e" % x for x in e[:12])))
PY
  done
done
rm -rf "$T"
