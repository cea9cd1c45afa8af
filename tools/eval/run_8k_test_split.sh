#!/usr/bin/env bash
# Issue 53 test split at 8K: fresh seed 20261206 (the tuning grids used seed 0), RULER's essay
# haystack, the 13 RULER tasks, FullKV, the default, the paper's configuration (Eq. 1, INT2, no
# pooling) and the eviction baselines that led the tuning grids at some budget (AdaKV,
# CriticalKV, Layer-DefensiveKV), at 0.2 / 0.1 / 0.05. Samples 1..10 in rounds. Resumable:
# rerun the same command; QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
grid_rounds "${SAMPLES:-10}" --lengths 8192 --seed 20261206 --haystack essay --tasks "$RULER13" \
  --variants "full,$QEVICT_DEFAULT,$QEVICT_PAPER,adakv,criticalkv,layer-defensivekv" \
  --budgets 0.2,0.1,0.05 --out results/eval/ruler-8k-test
