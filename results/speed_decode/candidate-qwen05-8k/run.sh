#!/usr/bin/env bash
# Issue 51's candidate default at 8K on Qwen 0.5B, its decode beside FullKV and today's
# default: 64 decode steps after an 8,192-token prefill (the Jargon File), 2 threads, configs
# alternating, two repetitions. Run from the repository root with nothing else running.
set -u
B=${QEVICT_BIN:-build/tools/qevict}  # the run: a copy of 0303a84
M=$(tools/fetch_model.sh qwen2.5-coder-0.5b | tail -n1)
F=/tmp/jargon.txt
zcat /usr/share/doc/jargon-text/jargon.txt.gz > $F
OUT=$(cd "$(dirname "$0")" && pwd)
for rep in 1 2; do
  for cfg in "full|--kv-policy full" \
             "default|--kv-policy qevict --kv-budget 0.2" \
             "int2-m8-q0.95|--kv-policy qevict --kv-budget 0.2 --kv-bits 2 --kv-value-bits 2 --kv-key-meta 8 --kv-q 0.95"; do
    name=${cfg%%|*}; args=${cfg#*|}
    echo "== $name rep $rep $(date -u +%H:%M:%S)"
    $B bench -m $M -t 2 -d 8192 -n 64 -r 1 -f $F $args --kv-stats --json \
      > $OUT/$name-rep$rep.json 2> $OUT/$name-rep$rep.log
    tail -c 300 $OUT/$name-rep$rep.json; echo
  done
done
