#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (build dir build-fuzz, only the text
# layers they need) and runs each for SECONDS (default 10) from its committed seed corpus under
# ASan+UBSan, one after the other. Exits non-zero on any crash, sanitizer report, leak, timeout
# (> 1 s per input) or out-of-memory (> 2 GiB), and prints each target's execution count.
# New inputs go to a scratch directory (QEVICT_FUZZ_WORK, default a temp dir), never into the
# committed corpus; crashing inputs are written there as crash-*/timeout-*/leak-*/oom-*. A temp
# dir of its own is removed when every target passes, kept when one fails.
# Usage: bash tools/fuzz.sh [SECONDS] [TARGET...]
# QEVICT_FUZZ_OPT: the targets' optimisation (default -O0, which clang compiles in half the
# time of -O1: CI's 5-second runs need the build more than the speed; long runs may pass -O1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
secs=${1:-10}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf_fuzz tokenizer_fuzz chat_template_fuzz openai_request_fuzz session_file_fuzz
  kv_options_fuzz)
jobs=$(nproc 2>/dev/null || echo 2)
build=${QEVICT_FUZZ_BUILD:-build-fuzz}

t0=$(date +%s)
# clang and its libFuzzer runtime (Debian 12: clang-14; a no-op when installed).
tools/apt_install.sh fuzz clang libclang-rt-14-dev
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="${QEVICT_FUZZ_OPT:--O0} -gline-tables-only" -DQEVICT_FUZZ=ON \
  -DQEVICT_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target "${targets[@]}" >/dev/null
echo "[fuzz.sh] build done in $(( $(date +%s) - t0 )) s"

work=${QEVICT_FUZZ_WORK:-$(mktemp -d -t qevict-fuzz.XXXXXX)}
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  log="$work/$t.log"
  rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/" "$work/$t" "tests/fuzz/corpus/$t" \
    >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "[fuzz.sh] $t: FAILED (exit $rc) after ${execs:-?} executions; log $log:" >&2
    grep -E "^(==[0-9]+==|SUMMARY|.*runtime error|.*fuzz: )" "$log" | head -n 20 >&2 || true
    ls "$work" | grep -E '^(crash|timeout|leak|oom|slow-unit)-' | sed 's/^/  input: /' >&2 || true
  else
    echo "[fuzz.sh] $t: ok, ${execs:-?} executions in ${secs} s (${rate:-?}/s)"
  fi
done
if [ "$failed" -eq 0 ] && [ -z "${QEVICT_FUZZ_WORK:-}" ]; then
  rm -rf "$work"  # a temp dir of our own and nothing found: nothing to keep
  echo "[fuzz.sh] total $(( $(date +%s) - t0 )) s"
else
  echo "[fuzz.sh] total $(( $(date +%s) - t0 )) s; scratch dir $work (kept)"
fi
exit "$failed"
