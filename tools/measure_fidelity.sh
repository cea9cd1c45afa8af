#!/usr/bin/env bash
# Measures the forward-pass fidelity figures of BENCHMARKS.md: teacher-forced logits over
# the first 1,100 tokens of tests/golden/english_gpl3.txt from
#   qevict (Q4_1 file), llama.cpp on the Q4_1 file, llama.cpp on an F32 copy of the same
#   weights, and a float64 NumPy forward pass;
# then top-1 agreement and mean KL between each pair (tools/compare_logits.py).
# Writes $QEVICT_CACHE/fidelity/*.npy and fidelity.json. Needs a build (tools/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
out="$cache/fidelity"
mkdir -p "$out"
model=$(tools/fetch_model.sh)
py=$(tools/venv.sh)
n=1100
echo "== llama.cpp (Q4_1 and F32 copy) ==" >&2
"$py" tools/golden/make_model_golden.py --model "$model" --n-tokens $n --out "$out/golden.json" --full-logits-dir "$out" >&2
echo "== qevict ==" >&2
build/tools/qevict perplexity -m "$model" -f tests/golden/english_gpl3.txt --max-tokens $n -c $n --logits-out "$out/qevict.npy"
echo "== float64 NumPy reference ==" >&2
"$py" tools/golden/reference_forward.py "$model" "$out/golden.json" $n "$out/reference_f64.npy" >&2
{
  echo "{"
  first=1
  for pair in "reference_f64 qevict" "reference_f64 llama_q" "reference_f64 llama_f32" "llama_f32 qevict" "llama_q qevict"; do
    set -- $pair
    res=$("$py" tools/compare_logits.py "$out/$1.npy" "$out/$2.npy")
    [ $first -eq 1 ] || echo ","
    first=0
    printf '"%s vs %s": %s' "$1" "$2" "$res"
  done
  echo "}"
} > "$out/fidelity.json"
cat "$out/fidelity.json"
