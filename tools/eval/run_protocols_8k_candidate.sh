#!/usr/bin/env bash
# Issue 51 item 3, the check before a default changes: at 8K (tuning split, seed 0; RULER's
# essay haystack; Qwen2.5-Coder-0.5B), protocols end, after and multi at 0.2: FullKV, the
# default (K4V2, q 0.7), the candidate from the 4K sweep (INT2, q 0.9: more of the text at 2
# bits; EVALUATION.md "Item 3, first step") and Layer-DefensiveKV (the best eviction baseline
# under `after` at 4K). The candidate becomes the default only if it holds `end` within a point
# here (paired) and gains under `after`/`multi`; then the test split reports it.
# Estimate: ~2 h a round of 13 tasks on 2 cores (an 8K text's prefill ~2 min per protocol);
# SAMPLES=N rounds (default 5). Resumable; QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=${QEVICT_BIN:-build/tools/qevict}
bash tools/fetch_ruler_data.sh >/dev/null
default=qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2
int2=qevict:route=end:prefill_window=32:pool=2:bits=2:vbits=2
tasks=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3
tasks+=,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2
for s in $(seq 1 "${SAMPLES:-5}"); do
  nice -n 19 "$bin" eval -t 2 -m "$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)" \
    --lengths 8192 --samples "$s" --seed 0 --haystack essay --protocol end,after,multi \
    --tasks "$tasks" --variants "full,$default,$int2:q=0.9,layer-defensivekv" --budgets 0.2 \
    --out results/eval/protocols-8k || exit 1
done
