#!/usr/bin/env bash
# Issue 51 item 3 at 8K, tuning split (seed 0, RULER's essay haystack, Qwen2.5-Coder-0.5B, 0.2):
# run_adapt_4k.sh's columns — FullKV, the default, the coverage tier alone, the default with
# --kv-adapt at ADAPT (default 0.5 nats, chosen on the 4K grid) — under end, after and multi,
# to see whether the threshold chosen at 4K holds at twice the length (the statistic is a KL
# over the text's windows, whose scale may grow with their number). tools/eval/adapt_table.py
# DIR --length 8192 gives every threshold's scores. Samples in rounds (SAMPLES=N, default 1);
# resumable; QEVICT_BIN=PATH runs a copy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
LENGTH=8192 OUT=${OUT:-results/eval/adapt-8k} SAMPLES=${SAMPLES:-1} exec bash tools/eval/run_adapt_4k.sh
