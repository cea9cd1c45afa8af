#!/usr/bin/env bash
# Sets everything up (tools/setup.sh), then runs every test: the Release build's tests
# (unit + end-to-end on the real model against committed llama.cpp golden data), then the
# unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$(date +%s)

phase() { echo "[test.sh] $1 at $(( $(date +%s) - start )) s"; }
model=$(tools/setup.sh | tail -n1)
phase "setup done (packages, Release build, models)"
export QEVICT_TEST_MODEL="$model"
# The second model family (qwen2), fetched by setup.sh: its golden e2e tests.
QEVICT_TEST_MODEL_QWEN=$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)
export QEVICT_TEST_MODEL_QWEN
jobs=$(nproc 2>/dev/null || echo 2)

if command -v clang-format >/dev/null 2>&1; then
  echo "== clang-format (.clang-format, Google base) =="
  bad=$(git ls-files '*.cpp' '*.h' 2>/dev/null | grep -v 'unicode_data.cpp' |
        while read -r f; do clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
  if [ -n "$bad" ]; then
    echo "clang-format would change: $bad" >&2
    exit 1
  fi
fi

echo "== tests (Release) =="
ctest --test-dir build --output-on-failure -j"$jobs"
phase "Release tests done"

echo "== unit tests under ASan + UBSan =="
# The end-to-end model tests (label e2e) are slow under ASan; they run in the Release pass
# above, so this build has only the unit tests, at -Og -g1 (line numbers in the reports):
# -Og compiles this build in about half the CPU time of -O1 (matmul.cpp: 48 s vs ~100 s,
# a test file 11 s vs 17 s) and the tests run about as fast. Unit tests that read the real
# model's metadata (tokenizer, GGUF) do run here.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" \
  -DQEVICT_SANITIZE=ON -DQEVICT_BUILD_E2E=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target qevict_unit_tests >/dev/null
phase "sanitizer build done"
# The randomized cache tests run fewer sequences (and a shorter long run) under the
# sanitizers (25x slower there); the Release pass above runs the full 10,000 per policy and
# 20,000 positions. TieredBytesHeld (16K positions through the tiered cache, 72 s here) and
# StagedRoute's long prompt (46 s here) run in the Release pass only: the random-ops,
# long-run and short staged tests cover the same code under ASan.
QEVICT_RANDOM_SEQUENCES=100 QEVICT_LONG_RUN_POSITIONS=3000 \
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE e2e -E '^(TieredBytesHeld\.|StagedRoute\.LongPrompt)'

echo "== fuzzing: each libFuzzer target 5 s under ASan+UBSan (long runs: ROBUSTNESS.md) =="
bash tools/fuzz.sh 5
phase "fuzzing done"

echo "tests finished in $(( $(date +%s) - start )) s"
