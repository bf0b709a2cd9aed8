#!/usr/bin/env bash
# Runs a plan of commands on the GPU machine with the binaries packed by dev/gpu_pack.sh: unpacks .gpu/bins.tar.xz
# (and .gpu/fx.tar.xz fixtures, .gl/*.deb Vulkan loader when carried), then each line of PLAN (a file; "#" comments)
# under `timeout`, all output appended to $OUT/run.log (one file: the device tool returns only a few files), and prints
# a summary (also in $OUT/summary.txt). $BIN in the plan is the unpacked binary folder.
#   dev/gpu_run.sh PLAN [seconds per command, default 300]   ($DEADLINE: seconds for the whole plan, default 540)
set -u
cd "$(dirname "$0")/.."
PLAN="$1"; LIM="${2:-300}"; DEADLINE="${DEADLINE:-540}"
OUT="${OUT:-$PWD/gpu-results}"; mkdir -p "$OUT"
export BIN="$PWD/.gpu/bin"
mkdir -p "$BIN" && tar xJf .gpu/bins.tar.xz -C "$BIN"
export LD_LIBRARY_PATH="$BIN/lib:${LD_LIBRARY_PATH:-}"
if [ -f .gpu/fx.tar.xz ]; then mkdir -p .gpu/fx && tar xJf .gpu/fx.tar.xz -C .gpu/fx && export G3_FIXTURES="$PWD/.gpu/fx"; fi
if ls .gl/*.deb >/dev/null 2>&1 && ! ldconfig -p | grep -q libvulkan.so.1; then
  for d in .gl/*.deb; do dpkg -x "$d" / ; done; ldconfig
fi
[ -e /usr/share/vulkan/icd.d/nvidia_icd.json ] || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
cp "$BIN/COMMIT" "$OUT/commit.txt" 2>/dev/null || echo "unknown (binaries packed without COMMIT)" > "$OUT/commit.txt"
echo "binaries of commit $(cat "$OUT/commit.txt")" | tee -a "$OUT/summary.txt"
n=0; t0=$(date +%s)
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  n=$((n+1)); log="$OUT/run.log"
  printf '\n===== [%d] $ %s\n' "$n" "$line" >> "$log"
  s=$(date +%s); left=$(( DEADLINE - (s - t0) ))
  if [ "$left" -lt 10 ]; then echo "[$n] skipped (deadline): $line" | tee -a "$OUT/summary.txt"; continue; fi
  timeout "$(( left < LIM ? left : LIM ))" bash -c "$line" >> "$log" 2>&1 < /dev/null; rc=$?
  echo "[$n] rc=$rc $(( $(date +%s) - s ))s: $line" | tee -a "$OUT/summary.txt"
done < "$PLAN"
echo "total $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
