#!/usr/bin/env bash
# Issue 51 item 3, the 8K check of the candidate from run_kmeta_4k.sh (tuning split, seed 0;
# RULER's essay haystack; Qwen2.5-Coder-0.5B; protocols end, after and multi at 0.2): INT2 keys
# and values with one-byte key scales and zeros (--kv-key-meta 8) at q 0.9, beside FullKV and the
# default, in run_protocols_8k_candidate.sh's folder so it pairs with that grid's cells (INT2 at
# q 0.9 with f16 metadata, Layer-DefensiveKV). A default changes only if `end` holds within a
# point here (paired) and the test split then reports it. SAMPLES=N rounds (default 2);
# resumable; QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
grid_rounds "${SAMPLES:-2}" --lengths 8192 --seed 0 --haystack essay --protocol end,after,multi \
  --tasks "$RULER13" --variants "full,$QEVICT_DEFAULT,$QEVICT_INT2:kmeta=8:q=0.9" \
  --budgets 0.2 --out results/eval/protocols-8k
