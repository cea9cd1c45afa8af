#!/usr/bin/env bash
# Issue 51 item 3, the check before a default changes: at 8K (tuning split, seed 0; RULER's
# essay haystack; Qwen2.5-Coder-0.5B), protocols end, after and multi at 0.2: FullKV, the
# default (K4V2, q 0.7), the candidate from the 4K sweep (INT2, q 0.9: more of the text at 2
# bits; EVALUATION.md "Item 3, first step") and Layer-DefensiveKV (the best eviction baseline
# under `after` at 4K). The candidate becomes the default only if it holds `end` within a point
# here (paired) and gains under `after`/`multi`; then the test split reports it.
# Estimate: ~2 h a round of 13 tasks on 2 cores (an 8K text's prefill ~2 min per protocol);
# SAMPLES=N rounds (default 5). Resumable; QEVICT_BIN=PATH runs a copy of the binary.
# VARIANTS=LIST runs other columns on the same prompts and folder (run_kmeta_8k.sh does).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
grid_rounds "${SAMPLES:-5}" --lengths 8192 --seed 0 --haystack essay --protocol end,after,multi \
  --tasks "$RULER13" \
  --variants "${VARIANTS:-full,$QEVICT_DEFAULT,$QEVICT_INT2:q=0.9,layer-defensivekv}" \
  --budgets 0.2 --out results/eval/protocols-8k
