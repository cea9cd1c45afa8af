#!/usr/bin/env bash
# Issue 51 item 3, tuning split (seed 0): does giving the low-bit tier more of the budget (--kv-q,
# the share of the history bytes for Q; 0.70 by default) hold the question-after protocols
# without losing the question-at-the-end one? At 4K on Qwen2.5-Coder-0.5B with RULER's essay
# haystack, protocols end, after and multi, at 0.2: FullKV, the default (K4V2, q 0.7), K4V2 at
# q 0.9 and 1, INT2 keys and values at q 0.9 and 1 (more windows in Q, at 2 bits). All share
# the text's prefill. Samples in rounds (SAMPLES=N, default 3). Resumable: rerun the same
# command. QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
D=$QEVICT_DEFAULT
grid_rounds "${SAMPLES:-3}" --lengths 4096 --seed 0 --haystack essay --protocol end,after,multi \
  --tasks "$RULER13" --variants "full,$D,$D:q=0.9,$D:q=1,$QEVICT_INT2:q=0.9,$QEVICT_INT2:q=1" \
  --budgets "${BUDGETS:-0.2}" --out results/eval/qshare-4k
