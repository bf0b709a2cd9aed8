#!/usr/bin/env bash
# Source checks that no compiler makes for us. Ends with "N passed, N failed".
# No function-like macro whose body is a bare `if` (C and CUDA): `if (x) M(a); else M(b);` binds the else to the
# macro's own if. gcc warns about that in C (-Wdangling-else) but not in .cu files, where such a macro once dropped
# two kernels from every CUDA forward. Such macros are written do { ... } while (0).
set -u
cd "$(dirname "$0")/../.."
passed=0; failed=0
check() { if [ -z "$2" ]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; echo "$2"; fi; }
# prints file:line of every function-like macro whose body (after the parameter list, possibly on the next
# continuation line) starts with `if (`
scan() {
  find "$@" \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z | xargs -0 -r awk '
    function first(s) { sub(/\\[ \t]*$/, "", s); gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    want { want = 0; if (first($0) ~ /^if[ \t]*\(/) print at; next }
    /^[ \t]*#[ \t]*define[ \t]+[A-Za-z_0-9]+\(/ {
      b = $0; sub(/^[ \t]*#[ \t]*define[ \t]+[A-Za-z_0-9]+\([^)]*\)/, "", b); at = FILENAME ":" FNR
      if (first(b) == "") want = ($0 ~ /\\[ \t]*$/); else if (first(b) ~ /^if[ \t]*\(/) print at
    }'
}
check "no function-like macro with a bare if body in src/, include/, tests/" "$(scan src include tests)"
t=$(mktemp -d)
printf '#define RUN(call)  \\\n    if ((e = (call)) != 0) return e\n#define CHECK(c, m) if (!(c)) return fail(m)\n' > "$t/a.cu"
printf '#define OK(call) \\\n    do {                \\\n        if (!(call)) return 1; \\\n    } while (0)\n' > "$t/b.c"
n=$(scan "$t" | wc -l); rm -rf "$t"
check "the scan finds both bare-if macros of a sample and not the do/while one" "$( [ "$n" -eq 2 ] || echo "found $n")"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
