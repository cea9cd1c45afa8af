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
# BUDGETS=0.2 runs one budget first). Resumable: rerun the same command. QEVICT_BIN=PATH runs a copy of the binary (record its commit: PATH --version).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=${QEVICT_BIN:-build/tools/qevict}
bash tools/fetch_ruler_data.sh >/dev/null  # qa_1/qa_2 and the essay haystack
default=qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2
variants="full,$default,qevict:route=end:prefill_window=0:bits=2,$default:score=age"
variants+=",qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=4,snapkv,adakv,criticalkv"
variants+=",layer-defensivekv,kivi"
[ "${PHASE:-1}" = 2 ] && variants="h2o,streaming,kvquant"
tasks=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3
tasks+=,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2
for s in $(seq 1 "${SAMPLES:-5}"); do
  nice -n 19 "$bin" eval -t 2 -m "$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)" \
    --lengths 4096 --samples "$s" --seed 0 --haystack essay --protocol after,multi \
    --tasks "$tasks" --variants "$variants" --budgets "${BUDGETS:-0.2,0.1,0.05}" \
    --out results/eval/protocols-4k || exit 1
done
