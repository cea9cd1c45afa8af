#!/usr/bin/env bash
# Issue 52 item 1 at 8K: --prefill-route staged against end, paired, on the 8K grid's prompts
# (tuning split: the grid's default seed, the Jargon File haystack, `--profile full`, the 11
# RULER tasks of results/eval/bits4-8k), budget 0.2, Qwen2.5-Coder-0.5B. Both routes run in the
# same binary so the pairing does not cross builds; bits4-8k's K4V2 column holds the same
# prompts from an older binary (tools/eval/compare.py checks that the seeds agree). Each text
# prefills twice (end's prefill is shared with nothing else here; staged reads every chunk
# against its low-bit copies), ~15 min a round of 11 tasks on 2 cores. Samples in rounds,
# resumable, paused while /work/measure/QUIET exists. QEVICT_BIN: a copy of the binary.
# Usage: run.sh [MAX_SAMPLES, default 10]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
source tools/eval/grid_common.sh
S=qevict:route=staged:prefill_window=32:pool=2:bits=4:vbits=2
grid_rounds "${1:-10}" --profile full --lengths 8192 --tasks "$RULER11" \
  --variants "$QEVICT_DEFAULT,$S" --budgets 0.2 --out results/eval/staged-8k
