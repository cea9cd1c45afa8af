#!/usr/bin/env bash
# Issue 51 item 3, the 8K check of the candidates from run_kmeta_4k.sh (tuning split, seed 0;
# RULER's essay haystack; Qwen2.5-Coder-0.5B; protocols end, after and multi at 0.2): INT2 keys
# and values with one-byte key scales and zeros (--kv-key-meta 8) at q 0.9 (first stop) and
# 0.95 (second stop: at 4K it matched q 1 under `end` and `multi` and led it under `after`),
# beside FullKV and the default — run_protocols_8k_candidate.sh with these columns, in its
# folder, so they pair with that grid's cells (INT2 at q 0.9 with f16 metadata,
# Layer-DefensiveKV). A default changes only if `end` holds within a point here (paired) and
# the test split then reports it. SAMPLES=N rounds (default 2); resumable; QEVICT_BIN=PATH runs
# a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
I=$QEVICT_INT2
VARIANTS="full,$QEVICT_DEFAULT,$I:kmeta=8:q=0.9,$I:kmeta=8:q=0.95" \
  SAMPLES=${SAMPLES:-2} exec bash tools/eval/run_protocols_8k_candidate.sh
