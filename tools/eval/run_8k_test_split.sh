#!/usr/bin/env bash
# Issue 53 test split at 8K: fresh seed 20261206 (the tuning grids used seed 0), RULER's essay
# haystack, the 13 RULER tasks, FullKV, the default, the paper's configuration (Eq. 1, INT2, no
# pooling) and the eviction baselines that led the tuning grids at some budget (AdaKV,
# CriticalKV, Layer-DefensiveKV), at 0.2 / 0.1 / 0.05. Resumable: rerun the same command;
# QEVICT_BIN=PATH runs a copy of the binary (record its commit: PATH --version).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# A copy of the binary, so that rebuilding the tree never changes the grid's code mid-run.
bin=${QEVICT_BIN:-build/tools/qevict}
bash tools/fetch_ruler_data.sh >/dev/null  # qa_1/qa_2 and the essay haystack
# Samples 1..10 in rounds, so every task has k samples before any has k + 1.
for s in 1 2 3 4 5 6 7 8 9 10; do
  nice -n 19 "$bin" eval -t 2 -m "$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)" --lengths 8192 --samples $s --seed 20261206 --haystack essay \
    --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2 \
    --variants full,qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2,qevict:route=end:prefill_window=0:bits=2,adakv,criticalkv,layer-defensivekv \
    --budgets 0.2,0.1,0.05 --out results/eval/ruler-8k-test || exit 1
done
