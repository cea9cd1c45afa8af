#!/usr/bin/env bash
# Issue 51 item 3, tuning split (seed 0): does giving the low-bit tier more of the budget (--kv-q,
# the share of the history bytes for Q; 0.70 by default) hold the question-after protocols
# without losing the question-at-the-end one? At 4K on Qwen2.5-Coder-0.5B with RULER's essay
# haystack, protocols end, after and multi, at 0.2: FullKV, the default (K4V2, q 0.7), K4V2 at
# q 0.9 and 1, INT2 keys and values at q 0.9 and 1 (more windows in Q, at 2 bits). All share
# the text's prefill. Samples in rounds (SAMPLES=N, default 3). Resumable: rerun the same
# command. QEVICT_BIN=PATH runs a copy of the binary (record its commit: PATH --version).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=${QEVICT_BIN:-build/tools/qevict}
bash tools/fetch_ruler_data.sh >/dev/null  # qa_1/qa_2 and the essay haystack
default=qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2
int2=qevict:route=end:prefill_window=32:pool=2:bits=2:vbits=2
variants="full,$default,$default:q=0.9,$default:q=1,$int2:q=0.9,$int2:q=1"
tasks=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3
tasks+=,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2
for s in $(seq 1 "${SAMPLES:-3}"); do
  nice -n 19 "$bin" eval -t 2 -m "$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)" \
    --lengths 4096 --samples "$s" --seed 0 --haystack essay --protocol end,after,multi \
    --tasks "$tasks" --variants "$variants" --budgets "${BUDGETS:-0.2}" \
    --out results/eval/qshare-4k || exit 1
done
