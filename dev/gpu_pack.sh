#!/usr/bin/env bash
# Packs the binaries a GPU-machine run needs (the device image lacks the Debian -dev packages, so the binaries are
# built here and carried): builds the CUDA/Vulkan test, benchmark and CLI targets in BUILD (default build-gpu),
# strips them, adds the shared libraries they need that the device may lack, and writes .gpu/bins.tar.xz.
# On the device:  mkdir -p .gpu/bin && tar xJf .gpu/bins.tar.xz -C .gpu/bin && export LD_LIBRARY_PATH=$PWD/.gpu/bin/lib
# PACK_VULKAN=0: CUDA only (a build folder configured with -DG3_VULKAN=OFF; no Vulkan tests). PACK_EXTRA: below.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build-gpu}"
VK=ON; [ "${PACK_VULKAN:-1}" = 0 ] && VK=OFF
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DG3_CUDA=ON -DG3_VULKAN=$VK >/dev/null
T="gemma3 g3cuda_bench g3wg_bench g3qgemv_bench g3chain_bench g3q4mma_bench"
for t in tests/unit/test_cuda_*.c; do T="$T $(basename "$t" .c)"; done
if [ $VK = ON ]; then for t in tests/unit/test_vulkan_*.c; do T="$T $(basename "$t" .c)"; done; fi
nice cmake --build "$BUILD" -j2 --target $T >/dev/null
rm -rf .gpu/stage && mkdir -p .gpu/stage/lib
for t in $T; do strip -o ".gpu/stage/$t" "$BUILD/$t"; done
# CUPTI kernel profiler (dev/cuda/kprof.cc) and the CUPTI library it needs, when the toolkit has them
if nice cmake --build "$BUILD" -j2 --target g3kprof >/dev/null 2>&1; then
  strip -o .gpu/stage/libg3kprof.so "$BUILD/libg3kprof.so"
  cp -L "$(ldd "$BUILD/libg3kprof.so" | awk '/libcupti/ {print $3}')" .gpu/stage/lib/
fi
for lib in $(ldd "$BUILD"/gemma3 "$BUILD"/test_cuda_model | awk '/cjson|cmocka|microhttpd/ {print $3}' | sort -u); do
  cp -L "$lib" .gpu/stage/lib/
done
# PACK_EXTRA="FILE:NAME ...": more binaries for A/B runs (e.g. a benchmark built from another commit) as NAME
for e in ${PACK_EXTRA:-}; do cp "${e%%:*}" ".gpu/stage/${e##*:}"; done
# the commit the binaries were built from (the device's copy of .git may be older): printed by dev/gpu_run.sh
git describe --always --dirty > .gpu/stage/COMMIT
# one big dictionary: the binaries share the same CUDA fat binary, which then compresses once
tar cf - -C .gpu/stage . | xz -T1 --lzma2=preset=6,dict=192MiB > .gpu/bins.tar.xz
ls -la .gpu/bins.tar.xz
