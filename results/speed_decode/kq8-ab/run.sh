#!/usr/bin/env bash
# The 8-bit decode matmul for Q4_K/Q6_K weights (c2d54ce) against the binary before it
# (0303a84: those types on the exact f32 path), FullKV decode at depth 512 (the weights'
# regime) on Qwen2.5-Coder-1.5B and 0.5B Q4_K_M, 64 steps, 2 threads, the two binaries
# alternating, two rounds. Run from the repository root with nothing else running:
#   OLD=<copy of 0303a84> NEW=<copy of c2d54ce> bash results/speed_decode/kq8-ab/run.sh
set -u
OUT=$(cd "$(dirname "$0")" && pwd)
F=/tmp/jargon.txt
zcat /usr/share/doc/jargon-text/jargon.txt.gz > $F
for rep in 1 2; do
  for model in qwen2.5-coder-1.5b qwen2.5-coder-0.5b; do
    M=$(tools/fetch_model.sh $model | tail -n1)
    for b in old new; do
      B=$OLD; [ $b = new ] && B=$NEW
      echo "== $model $b rep $rep $(date -u +%H:%M:%S)"
      $B bench -m $M -t 2 -d 512 -n 64 -r 1 -f $F --kv-policy full --json \
        > $OUT/$model-$b-rep$rep.json 2> $OUT/$model-$b-rep$rep.log
      python3 -c "import json;j=json.load(open('$OUT/$model-$b-rep$rep.json'))[0];print(round(j['decode_tok_s'],2), round(j['prefill_tok_s'],1))"
    done
  done
done
