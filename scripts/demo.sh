#!/usr/bin/env bash
# The main job: serve the shipped demo model (models/gemma3-pydoc) with the OpenAI-compatible server, ask it one
# question through curl with a streamed answer, print the answer, then keep serving until Ctrl-C.
#   scripts/demo.sh [QUESTION]        (PORT=8006 MODEL=models/gemma3-pydoc by default)
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-8006}
MODEL=${MODEL:-models/gemma3-pydoc}
Q=${1:-What does sorted() do?}
BIN=${BIN:-build/gemma3}
[ -x "$BIN" ] || ./scripts/setup.sh
"$BIN" serve -m "$MODEL" --port "$PORT" &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "demo: the server did not start" >&2; exit 1; }
  sleep 0.1
done
body=$(printf '{"messages":[{"role":"user","content":%s}],"max_tokens":128,"temperature":0,"stream":true}' \
       "$(printf '%s' "$Q" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')")
echo "\$ curl -sN http://127.0.0.1:$PORT/v1/chat/completions -d '$body'"
echo "> $Q"
curl -sN "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" |
  python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    for ch in json.loads(line[6:]).get("choices", []):
        sys.stdout.write(ch.get("delta", {}).get("content") or ""); sys.stdout.flush()
print()'
if [ -t 0 ] && [ -z "${DEMO_NO_WAIT:-}" ]; then
  echo "serving $MODEL at http://127.0.0.1:$PORT/v1 (OpenAI-compatible); Ctrl-C to stop"
  wait $SERVER
fi
