#!/usr/bin/env bash
# Issue 51 on the tuning split (seed 0, RULER's essay haystack, 4K, budget 0.2, Qwen2.5-Coder-0.5B):
# --kv-turn-pool on the coverage tier (INT2, one-byte key scales, q 0.95; what --kv-adapt takes
# when no question is in view). Its F tier holds a few windows a layer, and pooling ±2 at the
# question's routing gives most of them to one attention peak's neighbours; turn_pool=0 / 1
# rank that event's windows by their own score (or ±1). FullKV and the coverage tier itself in
# the same run for the pairing; `after` and `multi` only (a single prompt has no later turn,
# so `end` is the coverage tier's by construction: tests/kvcache/two_turn_test.cpp).
# The flag existed from 00dfb12 to its revert (3d3d562, after this run found no output changed):
# run it with a binary built at 678e1db, QEVICT_BIN=PATH (the committed lines: that binary).
# Resumable (rerun the same command).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
source tools/eval/grid_common.sh
C=$QEVICT_INT2:kmeta=8:q=0.95
grid_rounds "${SAMPLES:-2}" --lengths 4096 --seed 0 --haystack essay --protocol after,multi \
  --tasks "${TASKS:-$RULER13}" --variants "full,$C,$C:turn_pool=0,$C:turn_pool=1" --budgets 0.2 \
  --out "${OUT:-results/eval/turnpool-4k}"
