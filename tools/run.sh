#!/usr/bin/env bash
# The main job: sets everything up (tools/setup.sh), then runs a long-context generation on
# the default model — the whole GPL-3 text (~7,600 tokens) as context and a question about
# it, answered with the chat template, while the tiered KV cache holds a fifth of the
# full cache's bytes (--kv-budget 0.2) and prints what it did (--kv-stats).
# Extra arguments go to `qevict generate`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
model=$(tools/setup.sh | tail -n1)
prompt=$(mktemp)
trap 'rm -f "$prompt"' EXIT
{
  cat tests/golden/english_gpl3.txt
  printf '\n\nQuestion: according to the license above, what must you do when you convey a modified version of the program? Answer in a few sentences.\n'
} > "$prompt"
build/tools/qevict generate -m "$model" --chat -f "$prompt" -n 200 -c 8192 --temp 0 \
  --kv-policy qevict --kv-budget 0.2 --kv-stats "$@"
