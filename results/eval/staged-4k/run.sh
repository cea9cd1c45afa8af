#!/usr/bin/env bash
# Issue 52 item 1: --prefill-route staged against end at 4K (tuning split, seed 0), RULER's
# essay haystack, the 13 RULER tasks, budgets 0.2 / 0.1, Qwen2.5-Coder-0.5B. Samples in rounds
# (every task has k before any has k + 1), resumable; the run is paused (SIGSTOP) while
# /work/measure/QUIET exists. QEVICT_BIN: a copy of the binary. Usage: run.sh MAX_SAMPLES
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
bin=${QEVICT_BIN:-build/tools/qevict}
max=${1:-3}
bash tools/fetch_ruler_data.sh >/dev/null
model=$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)
for s in $(seq 1 "$max"); do
  while [ -e /work/measure/QUIET ]; do sleep 20; done
  nice -n 19 "$bin" eval -t 2 -m "$model" --lengths 4096 --samples "$s" --seed 0 --haystack essay \
    --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2 \
    --variants full,qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2,qevict:route=staged:prefill_window=32:pool=2:bits=4:vbits=2 \
    --budgets 0.2,0.1 --out results/eval/staged-4k &
  pid=$!
  # QUIET: stop the eval (this one process, by id) while the lead measures.
  while kill -0 "$pid" 2>/dev/null; do
    if [ -e /work/measure/QUIET ]; then
      kill -STOP "$pid" 2>/dev/null
      while [ -e /work/measure/QUIET ]; do sleep 2; done
      kill -CONT "$pid" 2>/dev/null
    fi
    sleep 1
  done
  wait "$pid" || exit 1
done
