#!/usr/bin/env bash
# Measures the forward-pass fidelity figures of BENCHMARKS.md (§1 for smollm2, §1b for
# qwen2.5-coder-0.5b): teacher-forced logits over the first 1,100 tokens of
# tests/golden/english_gpl3.txt from
#   qevict (the quantized file), llama.cpp on the quantized file, llama.cpp on an F32 copy of
#   the same weights, and a float64 NumPy forward pass;
# then top-1 agreement and mean KL between each pair (tools/compare_logits.py), and whether
# qevict's tokenizer gives llama.cpp's token ids for the whole text.
#   tools/measure_fidelity.sh [NAME]     NAME: a tools/fetch_model.sh model (default smollm2)
# Writes $QEVICT_CACHE/fidelity[-NAME]/*.npy and fidelity.json. Needs a build (tools/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cache=${QEVICT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qevict}
name=${1:-smollm2}
out="$cache/fidelity"
[ "$name" = smollm2 ] || out="$cache/fidelity-$name"
mkdir -p "$out"
model=$(tools/fetch_model.sh "$name" | tail -n1)
py=$(tools/venv.sh)
text=tests/golden/english_gpl3.txt
n=1100
echo "== llama.cpp (quantized file and F32 copy) ==" >&2
"$py" tools/golden/make_model_golden.py --model "$model" --n-tokens $n --out "$out/golden.json" --full-logits-dir "$out" >&2
echo "== qevict ==" >&2
build/tools/qevict perplexity -m "$model" -f $text --max-tokens $n -c $n --logits-out "$out/qevict.npy"
echo "== float64 NumPy reference ==" >&2
"$py" tools/golden/reference_forward.py "$model" "$out/golden.json" $n "$out/reference_f64.npy" >&2
echo "== tokenizer: qevict vs llama.cpp on the whole text ==" >&2
build/tools/qevict tokenize -m "$model" -f $text --ids > "$out/qevict_ids.json"
tokenizer=$("$py" - "$model" $text "$out/qevict_ids.json" <<'PY'
import json, sys
from llama_cpp import Llama
model, text, ours = sys.argv[1:]
llm = Llama(model_path=model, vocab_only=True, verbose=False)
want = llm.tokenize(open(text, "rb").read(), add_bos=False, special=False)
got = json.load(open(ours))
first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
if first is None and len(got) != len(want):
    first = min(len(got), len(want))
print(json.dumps({"n_tokens_llama_cpp": len(want), "n_tokens_qevict": len(got),
                  "ids_equal": got == want, "first_difference": first}))
PY
)
{
  echo "{"
  printf '"model": "%s",\n"tokenizer": %s' "$(basename "$model")" "$tokenizer"
  for pair in "reference_f64 qevict" "reference_f64 llama_q" "reference_f64 llama_f32" "llama_f32 qevict" "llama_q qevict"; do
    set -- $pair
    res=$("$py" tools/compare_logits.py "$out/$1.npy" "$out/$2.npy")
    printf ',\n"%s vs %s": %s' "$1" "$2" "$res"
  done
  echo
  echo "}"
} > "$out/fidelity.json"
cat "$out/fidelity.json"
