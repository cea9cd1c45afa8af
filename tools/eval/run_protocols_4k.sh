#!/usr/bin/env bash
# Issue 51, tuning split (seed 0, the seed the defaults were chosen on; the test split draws
# fresh seeds): the question after the compression. At 4K on Qwen2.5-Coder-0.5B with RULER's
# essay haystack, protocols `after` (the text one turn, ended and compressed; the question a
# second turn) and `multi` (4 keys asked one per turn), every variant that shares the text's
# prefill: FullKV, the default, the paper's configuration (Eq. 1, INT2, no pooling), the
# default with --kv-score age, INT4 keys and values, SnapKV, AdaKV, CriticalKV,
# Layer-DefensiveKV and KIVI-2 (its own byte point), at 0.2 / 0.1 / 0.05. The chunk-route
# baselines (H2O, StreamingLLM, KVQuant-3) each prefill on their own: PHASE=2 runs them.
# Samples in rounds, so every task has k samples before any has k + 1 (SAMPLES=N, default 5;
# BUDGETS=0.2 runs one budget first). Resumable: rerun the same command.
# QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
D=$QEVICT_DEFAULT
variants="full,$D,$QEVICT_PAPER,$D:score=age"
variants+=",qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=4,snapkv,adakv,criticalkv"
variants+=",layer-defensivekv,kivi"
[ "${PHASE:-1}" = 2 ] && variants="h2o,streaming,kvquant"
grid_rounds "${SAMPLES:-5}" --lengths 4096 --seed 0 --haystack essay --protocol after,multi \
  --tasks "$RULER13" --variants "$variants" --budgets "${BUDGETS:-0.2,0.1,0.05}" \
  --out results/eval/protocols-4k
