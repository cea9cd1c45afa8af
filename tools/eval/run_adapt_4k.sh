#!/usr/bin/env bash
# Issue 51 item 3, tuning split (seed 0, 4K, RULER's essay haystack, Qwen2.5-Coder-0.5B, 0.2):
# --kv-adapt, which keeps the default's K4V2 tier when the prompt's end points into the text
# (a question in view) and switches to the coverage tier (INT2, one-byte key scales, q 0.95)
# when it does not. Columns: FullKV, the default, the coverage tier alone, and the default with
# --kv-adapt at each threshold of ADAPT (default 0.5 nats), under end, after and multi. The
# adapt columns' lines carry `focus` (the statistic, measured before routing: the same for
# every column of a prompt), so the score of any threshold follows from the default's and the
# coverage column's lines (tools/eval/adapt_table.py); the adapt columns check that the switch
# gives exactly those answers. A new folder: these cells come from one binary (after c2d54ce, which
# changed the 0.5B's decode numerics; EVALUATION "Machine time"). Samples in rounds (SAMPLES=N,
# default 2); resumable; QEVICT_BIN=PATH runs a copy. SEED (default 0, the tuning split) and
# BASELINES (a comma list of variants) serve the test-split wrapper run_adapt_8k_test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
D=$QEVICT_DEFAULT
C=$QEVICT_INT2:kmeta=8:q=0.95
V="full,$D,$C"
for t in ${ADAPT:-0.5}; do V+=",$D:adapt=$t"; done
[ -z "${BASELINES:-}" ] || V+=",$BASELINES"  # eviction baselines in the same run
grid_rounds "${SAMPLES:-2}" --lengths "${LENGTH:-4096}" --seed "${SEED:-0}" --haystack essay --protocol end,after,multi \
  --tasks "${TASKS:-$RULER13}" --variants "$V" --budgets "${BUDGETS:-0.2}" \
  --out "${OUT:-results/eval/adapt-4k}"
