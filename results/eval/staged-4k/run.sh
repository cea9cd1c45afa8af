#!/usr/bin/env bash
# Issue 52 item 1: --prefill-route staged against end at 4K (tuning split, seed 0), RULER's
# essay haystack, the 13 RULER tasks, budgets 0.2 / 0.1, Qwen2.5-Coder-0.5B. Samples in rounds
# (every task has k before any has k + 1), resumable; the run is paused (SIGSTOP) while
# /work/measure/QUIET exists. QEVICT_BIN: a copy of the binary. Usage: run.sh MAX_SAMPLES
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
source tools/eval/grid_common.sh
S=qevict:route=staged:prefill_window=32:pool=2:bits=4:vbits=2
grid_rounds "${1:-3}" --lengths 4096 --seed 0 --haystack essay --tasks "$RULER13" \
  --variants "full,$QEVICT_DEFAULT,$S" --budgets 0.2,0.1 --out results/eval/staged-4k
