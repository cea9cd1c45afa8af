#!/usr/bin/env bash
# A/B of the key metadata format at 8K on Qwen 0.5B, decode 64 steps, configs alternating.
set -u
B=${QEVICT_BIN:-build/tools/qevict}  # the run: a copy of d924aa4
M=$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)
F=/tmp/jargon.txt
zcat /usr/share/doc/jargon-text/jargon.txt.gz > $F
OUT=$(cd "$(dirname "$0")" && pwd)
for rep in 1 2; do
  for cfg in "k4v2-f16|--kv-bits 4 --kv-value-bits 2 --kv-key-meta 16" \
             "k4v2-m8|--kv-bits 4 --kv-value-bits 2 --kv-key-meta 8" \
             "int2-m8-q0.9|--kv-bits 2 --kv-value-bits 2 --kv-key-meta 8 --kv-q 0.9"; do
    name=${cfg%%|*}; args=${cfg#*|}
    echo "== $name rep $rep $(date -u +%H:%M:%S)"
    $B bench -m $M -t 2 -d 8192 -n 64 -r 1 -f $F --kv-policy qevict --kv-budget 0.2 $args --kv-stats --json \
      > $OUT/$name-rep$rep.json 2> $OUT/$name-rep$rep.log
    tail -c 300 $OUT/$name-rep$rep.json; echo
  done
done
