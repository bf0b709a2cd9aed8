#!/usr/bin/env bash
# Command-line contracts, run as a user would: `run --print-ids` and `logits` against the reference outputs,
# --help and bad flags on every subcommand, `info`, `quantize` round trips, and `chat` in a real terminal (tmux).
# Prints one line per check and ends with "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."
BIN=${G3_BIN:-build/gemma3}
PY=${PYTHON:-python3}
pass=0; fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"; tmux kill-session -t g3chat 2>/dev/null; tmux kill-session -t g3chat2 2>/dev/null' EXIT

fixture() { for d in tests/data/$1 ../shared/fixtures/$1; do [ -d "$d" ] && { echo "$d"; return; }; done; }
MODEL=$(fixture t-gqa); [ -n "$MODEL" ] || MODEL=$(fixture tiny-gqa)
if [ -z "$MODEL" ]; then echo "no test model found"; echo "0 passed, 1 failed"; exit 1; fi

# --- run --print-ids: greedy ids equal to the reference up to the first small margin -------------------------
ref_ids() { "$PY" - "$MODEL/reference.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); p = r["prompts"][int(sys.argv[2])]
n = 0
for m in p["margins"]:
    n += 1
    if m < 0.01: break
print(",".join(map(str, p["ids"])), ",".join(map(str, p["generated_ids"][:n])), n)
PY
}
for i in 0 1 2 3; do
  read -r prompt want n < <(ref_ids $i)
  got=$("$BIN" run -m "$MODEL" --prompt-ids "$prompt" -n "$n" --temp 0 --ignore-eos --print-ids 2>"$TMP/err")
  check "run --print-ids prompt $i ($n tokens)" [ "$got" = "$want" ]
done
out=$("$BIN" run -m "$MODEL" --prompt-ids 2,17,33 -n 5 --temp 0 --print-ids 2>/dev/null)
check "run --print-ids prints one line of ids only" bash -c "[[ '$out' =~ ^[0-9]+(,[0-9]+)*$ ]]"

# --- logits: size and values --------------------------------------------------------------------------------
read -r prompt _ _ < <(ref_ids 1)
"$BIN" logits -m "$MODEL" --prompt-ids "$prompt" --out "$TMP/l.bin" 2>"$TMP/err"
"$BIN" logits -m "$MODEL" --prompt-ids "$prompt" --out "$TMP/la.bin" --all-positions 2>>"$TMP/err"
check "logits last + all positions match the reference" "$PY" - "$MODEL/reference.json" "$TMP/l.bin" "$TMP/la.bin" <<'PY'
import json, struct, sys
r = json.load(open(sys.argv[1])); p = r["prompts"][1]; V = r["config"]["vocab_size"]
def read(path):
    b = open(path, "rb").read(); return struct.unpack("<%df" % (len(b) // 4), b)
last, allp = read(sys.argv[2]), read(sys.argv[3])
assert len(last) == V, len(last)
assert len(allp) == V * p["n_prompt"], len(allp)
ref_last = p["last_prompt_logits"]; tol = 1e-3 * max(1, max(abs(x) for x in ref_last))
assert max(abs(a - b) for a, b in zip(last, ref_last)) < tol
for pos, row in enumerate(p["all_prompt_logits"]):
    tol = 1e-3 * max(1, max(abs(x) for x in row))
    assert max(abs(a - b) for a, b in zip(allp[pos * V:(pos + 1) * V], row)) < tol, pos
PY

# --- help and bad input ------------------------------------------------------------------------------------
for c in run chat serve bench info logits tokenize detokenize quantize; do
  "$BIN" $c --help >"$TMP/help" 2>&1; rc=$?
  check "$c --help shows options with defaults" bash -c "[ $rc -eq 0 ] && grep -q -- '--help' '$TMP/help' && grep -q 'default' '$TMP/help'"
  "$BIN" $c --no-such-flag >/dev/null 2>"$TMP/err"; rc=$?
  check "$c rejects an unknown flag with a message" bash -c "[ $rc -eq 2 ] && grep -q 'no-such-flag' '$TMP/err'"
done
"$BIN" run -m "$MODEL" --prompt-ids 2,17 -n abc >/dev/null 2>"$TMP/err"; rc=$?
check "run -n abc is refused" bash -c "[ $rc -eq 2 ] && grep -q 'integer' '$TMP/err'"
"$BIN" run -m "$MODEL" --prompt-ids 2,999999 -n 2 --print-ids >/dev/null 2>"$TMP/err"; rc=$?
check "run with an out-of-vocabulary id names it" bash -c "[ $rc -ne 0 ] && grep -q '999999' '$TMP/err'"
"$BIN" run -m /nonexistent --prompt-ids 2 >/dev/null 2>"$TMP/err"; rc=$?
check "run with a missing model names the path" bash -c "[ $rc -ne 0 ] && grep -q '/nonexistent' '$TMP/err'"
for c in run serve bench; do
  "$BIN" $c -m "$MODEL" --gemm sloppy $([ $c = run ] && echo --prompt-ids 2) >/dev/null 2>"$TMP/err" </dev/null; rc=$?
  check "$c --gemm sloppy is refused with the allowed values" bash -c "[ $rc -ne 0 ] && grep -q 'exact or fast' '$TMP/err'"
  "$BIN" $c -m "$MODEL" --kv-cache f16 $([ $c = run ] && echo --prompt-ids 2) >/dev/null 2>"$TMP/err" </dev/null; rc=$?
  check "$c --kv-cache f16 is refused with the allowed values" bash -c "[ $rc -ne 0 ] && grep -q 'auto, bf16 or f32' '$TMP/err'"
done
"$BIN" serve -m "$MODEL" --backend cpu --quant int4 >/dev/null 2>"$TMP/err"; rc=$?
check "serve --quant on the CPU backend is refused with a message" bash -c "[ $rc -eq 2 ] && grep -q 'quantize' '$TMP/err'"
head -c 3000 "$(ls "$MODEL"/*.gguf ../shared/fixtures/tiny-gqa/model-bf16.gguf 2>/dev/null | head -1)" >"$TMP/trunc.gguf"
"$BIN" info "$TMP/trunc.gguf" >/dev/null 2>"$TMP/err"; rc=$?
check "info on a truncated GGUF fails with a message" bash -c "[ $rc -ne 0 ] && [ -s '$TMP/err' ]"

# --- info ------------------------------------------------------------------------------------------------------
"$BIN" info "$MODEL" >"$TMP/info" 2>&1
check "info prints config, types, parameters, memory" bash -c "grep -q 'layers' '$TMP/info' && grep -q 'parameters:' '$TMP/info' && grep -q 'KV cache' '$TMP/info' && grep -q 'BF16' '$TMP/info'"

# --- bench: the KV pool sized for the sequences it runs (not max_b full contexts), every sequence held at once -----
"$BIN" bench -m "$MODEL" --backend cpu -p 24 -n 6 -b 1,6 -r 1 >"$TMP/bench" 2>&1
check "bench sizes its KV pool for its sequences and runs 6 together without preemption" bash -c \
  "grep -q '^kv cache: [0-9]* blocks of 16 tokens' '$TMP/bench' && grep -q '^decode   batch   6:' '$TMP/bench' && \
   ! grep -q 'preempted' '$TMP/bench'"

# --- bench --profile: time per dispatch of a decode step on a GPU backend (lavapipe here), a note on the CPU -----
"$BIN" bench -m "$MODEL" --backend cpu -p 8 -n 2 --profile >"$TMP/prof" 2>&1
check "bench --profile on the CPU backend prints a note" grep -q "^profile | cpu | --profile times" "$TMP/prof"
if "$BIN" info --devices 2>/dev/null | grep -q "^vulkan device 0"; then
  "$BIN" bench -m "$MODEL" --backend vulkan -p 8 -n 2 -b 1,2 --profile >"$TMP/prof" 2>&1
  check "bench --profile on vulkan prints attention and wall lines at batch 1 and 2" bash -c \
    "grep -q '^profile | vulkan | decode 1 | attn | ' '$TMP/prof' && grep -q '^profile | vulkan | decode 2 | wall | ' '$TMP/prof'"
fi

# --- quantize: f32 GGUF gives the same greedy ids; q8_0 loads and runs ----------------------------------------
read -r prompt want n < <(ref_ids 3)
if "$BIN" quantize -m "$MODEL" -o "$TMP/m32.gguf" --type f32 2>"$TMP/err"; then
  got=$("$BIN" run -m "$TMP/m32.gguf" --prompt-ids "$prompt" -n "$n" --temp 0 --ignore-eos --print-ids 2>>"$TMP/err")
  check "quantize --type f32 round trip keeps greedy ids" [ "$got" = "$want" ]
  "$BIN" tokenize -m "$TMP/m32.gguf" --text "Hello world" >"$TMP/t1" 2>>"$TMP/err"
  "$BIN" tokenize -m "$MODEL" --text "Hello world" >"$TMP/t2" 2>>"$TMP/err"
  check "quantized GGUF carries the tokenizer" cmp -s "$TMP/t1" "$TMP/t2"
else bad "quantize --type f32"; cat "$TMP/err"; fi
for t in q8_0 q4_0; do
  "$BIN" quantize -m "$MODEL" -o "$TMP/m-$t.gguf" --type $t >/dev/null 2>&1 &&
    got=$("$BIN" run -m "$TMP/m-$t.gguf" --prompt-ids 2,17,33 -n 4 --temp 0 --ignore-eos --print-ids 2>/dev/null)
  check "quantize --type $t loads and generates" bash -c "[[ '${got:-}' =~ ^[0-9]+(,[0-9]+){3}$ ]]"
done

# --- GGUF block types against gguf-py (llama.cpp's Python package, an independent encoder/decoder) ---------------
# Our quantizer writes the demo model in each type; gguf-py's dequantization of every tensor must equal ours (the
# file converted back by `quantize --type f32`) bit for bit, and the types must be the ones llama.cpp would write
# (the 320-wide rows do not fit 256-value blocks: q4_k -> Q5_0 there, q5_k -> Q5_1). Then gguf-py quantizes the
# float file itself (its own encoder's bytes) and our loader must decode those exactly too.
if [ -d models/gemma3-pydoc ] && "$PY" -c "import gguf" 2>/dev/null; then
  XC=tests/cli/gguf_crosscheck.py
  for tt in q4_1:Q4_1 q5_0:Q5_0 q5_1:Q5_1 q5_k:Q5_K,Q5_1 q4_k:Q4_K,Q5_0 q6_k:Q6_K,Q8_0; do
    t=${tt%%:*}; want=${tt#*:}
    "$BIN" quantize -m models/gemma3-pydoc -o "$TMP/p-$t.gguf" --type $t >/dev/null 2>&1 &&
      "$BIN" quantize -m "$TMP/p-$t.gguf" -o "$TMP/p-$t-f32.gguf" --type f32 >/dev/null 2>&1
    check "quantize --type $t: gguf-py decodes every tensor as we do ($want)" \
      "$PY" $XC compare "$TMP/p-$t.gguf" "$TMP/p-$t-f32.gguf" "$want"
  done
  "$BIN" quantize -m models/gemma3-pydoc -o "$TMP/p-f32.gguf" --type f32 >/dev/null 2>&1
  for t in q4_1 q5_0 q5_1; do
    "$PY" $XC requant "$TMP/p-f32.gguf" "$TMP/g-$t.gguf" $t >/dev/null 2>&1 &&
      "$BIN" quantize -m "$TMP/g-$t.gguf" -o "$TMP/g-$t-f32.gguf" --type f32 >/dev/null 2>&1
    check "a $t file written by gguf-py loads and decodes as gguf-py decodes it" \
      "$PY" $XC compare "$TMP/g-$t.gguf" "$TMP/g-$t-f32.gguf" "${t^^}"
    got=$("$BIN" run -m "$TMP/g-$t.gguf" --prompt-ids 2,17,33 -n 4 --temp 0 --ignore-eos --print-ids 2>/dev/null)
    check "a $t file written by gguf-py generates" bash -c "[[ '${got:-}' =~ ^[0-9]+(,[0-9]+){3}$ ]]"
  done
else
  bad "gguf-py cross-check: models/gemma3-pydoc or the gguf package (scripts/setup.sh installs it) is missing"
fi

# --- Vulkan: Q5_0 (llama.cpp's Q4_K fallback) is kept as Q8_0 on the device, exactly: same greedy ids as the CPU;
# --- Q4_1 / Q5_1 / Q5_K on their own kernels, the same -----------------------------------------------------------
if [ -d models/gemma3-pydoc ] && "$BIN" info --devices 2>/dev/null | grep -q "^vulkan device 0"; then
  "$BIN" quantize -m models/gemma3-pydoc -o "$TMP/vq.gguf" --type q4_k >/dev/null 2>&1
  a=$("$BIN" run -m "$TMP/vq.gguf" --backend cpu --prompt-ids 2,17,33,400,500 -n 12 --temp 0 --ignore-eos --print-ids 2>/dev/null)
  b=$("$BIN" run -m "$TMP/vq.gguf" --backend vulkan --prompt-ids 2,17,33,400,500 -n 12 --temp 0 --ignore-eos --print-ids 2>/dev/null)
  check "vulkan runs a Q4_K + Q5_0 file with the CPU's greedy ids" bash -c "[[ -n '$a' && '$a' == '$b' ]]"
  # Q4_1 / Q5_1 / Q5_K (Q5_K_M files; Q5_1 its fallback in the 320-wide rows) on their own Vulkan kernels
  for t in q4_1 q5_1 q5_k; do
    "$BIN" quantize -m models/gemma3-pydoc -o "$TMP/v-$t.gguf" --type $t >/dev/null 2>&1
    a=$("$BIN" run -m "$TMP/v-$t.gguf" --backend cpu --prompt-ids 2,17,33,400,500 -n 12 --temp 0 --ignore-eos --print-ids 2>/dev/null)
    b=$("$BIN" run -m "$TMP/v-$t.gguf" --backend vulkan --prompt-ids 2,17,33,400,500 -n 12 --temp 0 --ignore-eos --print-ids 2>/dev/null)
    check "vulkan runs a $t file with the CPU's greedy ids" bash -c "[[ -n '$a' && '$a' == '$b' ]]"
  done
fi

# --- the README's main job: the demo model served, one streamed question ------------------------------------
if [ -d models/gemma3-pydoc ]; then
  ans=$(DEMO_NO_WAIT=1 BIN="$BIN" PORT=$((20000 + RANDOM % 20000)) ./scripts/demo.sh "What does sorted() do?" 2>/dev/null | tail -1)
  echo "     demo answer: $ans"
  check "demo: the served model answers in words, no markup" bash -c "[[ \"\$1\" == *sorted* && \"\$1\" != *'<'* ]]" _ "$ans"
fi

# --- run -p with stop strings: the text ends right before the first match --------------------------------------
if [ -d models/gemma3-pydoc ]; then
  full=$("$BIN" run -m models/gemma3-pydoc --temp 0 -p "The json module" -n 40 --ignore-eos 2>/dev/null)
  cut=$("$BIN" run -m models/gemma3-pydoc --temp 0 -p "The json module" -n 40 --ignore-eos --stop "module|zzzz" 2>"$TMP/err")
  check "run --stop cuts the text before the stop string" bash -c '[[ -n "$2" && "$1" == "$2"module* && "$2" != *module* ]]' _ "$full" "${cut%$'\n'}"
  check "run --stop reports the stop in its summary" grep -q "stop string" "$TMP/err"
fi

# --- chat in a terminal ----------------------------------------------------------------------------------------
if command -v tmux >/dev/null; then
  tmux kill-session -t g3chat 2>/dev/null
  tmux new-session -d -s g3chat -x 200 -y 50 "$BIN chat -m $MODEL --temp 0 -n 12 -c 512; echo CHAT-EXITED; sleep 30"
  wait_for() { for _ in $(seq 1 100); do tmux capture-pane -p -t g3chat 2>/dev/null | grep -q -- "$1" && return 0; sleep 0.2; done; return 1; }
  count() { tmux capture-pane -p -t g3chat -S -200 2>/dev/null | grep -c -- "$1"; }
  check "chat shows its banner and prompt" wait_for "^>"
  tmux send-keys -t g3chat "Hello there" Enter
  answered() { for _ in $(seq 1 150); do [ "$(count '^>')" -ge 2 ] && return 0; sleep 0.2; done; return 1; }
  check "chat answers and returns to the prompt" answered
  tmux send-keys -t g3chat "/reset" Enter
  check "chat /reset clears the conversation" wait_for "conversation cleared"
  tmux send-keys -t g3chat "/quit" Enter
  check "chat /quit exits" wait_for "CHAT-EXITED"
  tmux kill-session -t g3chat 2>/dev/null
  # Ctrl-C stops a long reply and the session goes on (its own tmux session). On the demo model (~2k tokens/s on
  # two cores, against ~34k for t-gqa, which could fill its 1024-token context before the Ctrl-C below arrives on a
  # loaded machine), so the reply is still streaming when the key is sent.
  S=g3chat2
  LONG=models/gemma3-pydoc; [ -d "$LONG" ] || LONG=$MODEL
  tmux new-session -d -s $S -x 200 -y 50 "$BIN chat -m $LONG --temp 0 -n 100000 -c 1024 --ignore-eos; echo CHAT-EXITED; sleep 30"
  wait_s() { for _ in $(seq 1 100); do tmux capture-pane -p -t $S 2>/dev/null | grep -q -- "$1" && return 0; sleep 0.2; done; return 1; }
  answered_s() { for _ in $(seq 1 150); do [ "$(tmux capture-pane -p -t $S -S -200 2>/dev/null | grep -c '^>')" -ge 2 ] && return 0; sleep 0.2; done; return 1; }
  check "chat (long replies) shows its prompt" wait_s "^>"
  tmux send-keys -t $S "Tell me everything" Enter
  # Ctrl-C once the reply is streaming (well before it can fill the 1024-token context)
  for _ in $(seq 1 200); do
    tmux capture-pane -p -t $S 2>/dev/null | awk '/Tell me everything/ {f = 1; next} f && NF {found = 1} END {exit !found}' && break
    sleep 0.05
  done
  tmux send-keys -t $S C-c
  check "Ctrl-C stops the reply" wait_s "\\[stopped\\]"
  check "and the chat goes on at its prompt" answered_s
  tmux send-keys -t $S "/quit" Enter
  check "chat /quit after a stopped reply exits" wait_s "CHAT-EXITED"
  tmux kill-session -t $S 2>/dev/null
else
  bad "tmux is not installed (scripts/setup.sh installs it)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
