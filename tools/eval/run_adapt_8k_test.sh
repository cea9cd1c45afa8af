#!/usr/bin/env bash
# Issue 51 on the test split (seed 20261206, never used to choose anything; RULER's essay
# haystack, Qwen2.5-Coder-0.5B, budget 0.2), 8K: run_adapt_4k.sh's columns — FullKV, the
# default, the coverage tier alone, the default with --kv-adapt 0.6 (the threshold fixed on the
# 4K tuning split) — and the six eviction baselines the issue names (SnapKV, AdaKV, CriticalKV,
# Layer-DefensiveKV, H2O, StreamingLLM), under end, after and multi, in one run. Every other
# threshold's scores follow from the default's and the coverage column's lines by each prompt's
# focus (tools/eval/adapt_table.py DIR --length 8192). Samples in rounds (SAMPLES=N, default 5);
# resumable: rerun the same command; QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LENGTH=8192 SEED=20261206 ADAPT=0.6 SAMPLES=${SAMPLES:-5} \
  BASELINES=snapkv,adakv,criticalkv,layer-defensivekv,h2o,streaming \
  OUT=${OUT:-results/eval/adapt-8k-test} exec bash tools/eval/run_adapt_4k.sh
