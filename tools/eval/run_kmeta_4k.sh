#!/usr/bin/env bash
# Issue 51 item 3 / issue 52 item 2, tuning split (seed 0): one-byte key scales and zeros
# (--kv-key-meta 8: 544 bytes a K4V2 window-head at head_dim 64 instead of 672, INT2 416 instead
# of 544) put more of the text in the low-bit tier at the same budget. Does that hold the
# question-after protocols without losing the question-at-the-end one? The prompts and folder of
# run_qshare_4k.sh (4K, Qwen2.5-Coder-0.5B, RULER's essay haystack, end/after/multi, 0.2), so
# the new columns pair with its FullKV, default and q columns: K4V2 with one-byte key metadata
# at q 0.7 (the default's q) and 0.85, INT2 with it at q 0.7 and 0.9; then (second stop) INT2
# with it at q 0.8, 0.95 and 1 — at q 1 a 0.2 budget holds ~98 % of the text at 2 bits, which is
# where INT2 with f16 scales stood at 0.27 (end 62.6, after 55.7, multi 100). Samples in rounds
# (SAMPLES=N, default 2). Resumable: rerun the same command. QEVICT_BIN=PATH runs a copy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/eval/grid_common.sh
D=$QEVICT_DEFAULT
I=$QEVICT_INT2
grid_rounds "${SAMPLES:-2}" --lengths 4096 --seed 0 --haystack essay --protocol end,after,multi \
  --tasks "$RULER13" --variants "full,$D,$D:kmeta=8,$D:kmeta=8:q=0.85,$I:kmeta=8,$I:kmeta=8:q=0.9,$I:kmeta=8:q=1,$I:kmeta=8:q=0.95,$I:kmeta=8:q=0.8" \
  --budgets "${BUDGETS:-0.2}" --out results/eval/qshare-4k
