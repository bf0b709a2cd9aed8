#!/usr/bin/env bash
# Server tests against a live `gemma3 serve` on 127.0.0.1 (random port) with the small-a fixture (or, where it is
# absent, the demo model models/gemma3-pydoc; the first line names the model), through the official openai client,
# curl and raw sockets. Env: G3_BIN (the gemma3 binary), PYTHON (with `openai`; default
# .venv/bin/python), G3_FIXTURES. Prints one line per test and "N passed, N failed"; exit 0 = all passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export G3_SOURCE_DIR=${G3_SOURCE_DIR:-$ROOT}
export G3_BIN=${G3_BIN:-$ROOT/build/gemma3}
PY=${PYTHON:-$ROOT/.venv/bin/python}
if ! "$PY" -c "import openai" 2>/dev/null; then
  echo "FAIL setup: $PY cannot import openai (run scripts/setup.sh)"
  echo "0 passed, 1 failed"
  exit 1
fi
exec "$PY" tests/server/test_server.py "$@"
