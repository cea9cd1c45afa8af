#!/usr/bin/env bash
# Issue 51 item 3, tuning split (seed 0), the companion of run_qshare_4k.sh: at KIVI-2's own
# bytes (0.25-0.27 of FullKV's here), is the question-after gap coverage (windows evicted) or
# precision (windows at low bits)? At 4K on Qwen2.5-Coder-0.5B with RULER's essay haystack,
# protocols end, after and multi: FullKV, KIVI-2 (evicts nothing), and at 0.27 the default
# (K4V2, q 0.7) and INT2 at q 1 (every window's 2-bit copy fits: 544 of 2,048 B a window-head).
# Samples in rounds (SAMPLES=N, default 2). Resumable; QEVICT_BIN=PATH runs a copy of the binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bin=${QEVICT_BIN:-build/tools/qevict}
bash tools/fetch_ruler_data.sh >/dev/null
default=qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2
int2=qevict:route=end:prefill_window=32:pool=2:bits=2:vbits=2
tasks=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3
tasks+=,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2
for s in $(seq 1 "${SAMPLES:-2}"); do
  nice -n 19 "$bin" eval -t 2 -m "$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)" \
    --lengths 4096 --samples "$s" --seed 0 --haystack essay --protocol end,after,multi \
    --tasks "$tasks" --variants "full,kivi,$default,$int2:q=1" --budgets 0.27 \
    --out results/eval/qshare-4k || exit 1
done
