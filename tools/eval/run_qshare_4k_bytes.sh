#!/usr/bin/env bash
# Issue 51 item 3, tuning split (seed 0), the companion of run_qshare_4k.sh: at KIVI-2's own
# bytes (0.25-0.27 of FullKV's here), is the question-after gap coverage (windows evicted) or
# precision (windows at low bits)? At 4K on Qwen2.5-Coder-0.5B with RULER's essay haystack,
# protocols end, after and multi: FullKV, KIVI-2 (evicts nothing), and at 0.27 the default
# (K4V2, q 0.7) and INT2 at q 1 (every window's 2-bit copy fits: 544 of 2,048 B a window-head).
# Samples in rounds (SAMPLES=N, default 2). Resumable; QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
grid_rounds "${SAMPLES:-2}" --lengths 4096 --seed 0 --haystack essay --protocol end,after,multi \
  --tasks "$RULER13" --variants "full,kivi,$QEVICT_DEFAULT,$QEVICT_INT2:q=1" --budgets 0.27 \
  --out results/eval/qshare-4k
