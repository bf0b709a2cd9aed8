#!/usr/bin/env bash
# Installs what gemma3 needs on a fresh Debian machine (packages via apt-get, Python test helpers via pip into
# .venv/) and builds it into build/. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config libcjson-dev libcmocka-dev libmicrohttpd-dev
      sentencepiece python3-sentencepiece python3-venv python3-numpy curl tmux
      libvulkan-dev glslc mesa-vulkan-drivers)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python helpers for the tests (the official openai client for the server tests; gguf, llama.cpp's GGUF package, for
# the block-format cross-checks).
if [ ! -x .venv/bin/python ]; then
  python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import openai, gguf" >/dev/null 2>&1; then
  .venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
fi

BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target gemma3
echo "setup: built $BUILD/gemma3"
