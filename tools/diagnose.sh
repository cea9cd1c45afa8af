#!/usr/bin/env bash
# The paper's diagnostics (QEvict §3, SPEC §8) on the default model, as in DIAGNOSTICS.md:
# sets everything up (tools/setup.sh: packages, build, model), runs `qevict diagnose` on the
# committed text — FullKV, R1-R4, StreamingLLM and H2O in lockstep, 512-token prompt, 256
# greedy steps, 20 % budget — then draws the plots (matplotlib from the small pinned plot
# venv of tools/eval/venv.sh).
# Output: $QEVICT_DIAG_OUT (default results/diagnostics): diagnostics.{json,md},
# fullkv_attention.npy, fmm.png, mass_by_tier.png, tier_map.png, ledger.png.
# Extra arguments go to `qevict diagnose` (e.g. --kv-budget 0.1, -m MODEL, -t 2).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
model=$(tools/setup.sh | tail -n1)
out=${QEVICT_DIAG_OUT:-results/diagnostics}
build/tools/qevict diagnose -m "$model" -f tests/golden/english_gpl3.txt --prefill 512 --gen 256 \
  --kv-budget 0.2 --variants R1,R2,R3,R4,streaming,h2o --out-dir "$out" "$@"
python=$(tools/eval/venv.sh)  # matplotlib + NumPy only (no llama.cpp build)
"$python" tools/diagnostics/plot_diagnostics.py "$out/diagnostics.json"
