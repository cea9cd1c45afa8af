#!/usr/bin/env python3
"""Decode and prefill speed of the tiered cache against FullKV at long contexts, in one run
(configurations alternate within each repetition, so drift hits all of them), plus the share
of decode time spent routing (--kv-stats' routing timer: ranking, quantizing, promoting).

    python3 tools/bench/bench_kv.py --model "$(tools/fetch_model.sh)" --depths 4096,8192 --reps 2 \
        --out results/speed/tiered_vs_full.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {"full": ["--kv-policy", "full"], "qevict-0.2": ["--kv-policy", "qevict", "--kv-budget", "0.2"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qevict", default=os.path.join(ROOT, "build/tools/qevict"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--depths", default="4096,8192")
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    text = os.path.join(ROOT, "tests/golden/english_gpl3.txt")
    runs = {(c, int(d)): [] for c in CONFIGS for d in a.depths.split(",")}
    for r in range(a.reps):
        for (c, d) in runs:
            cmd = [a.qevict, "bench", "-m", a.model, "-d", str(d), "-n", str(a.n_decode), "-r", "1", "-t",
                   str(a.threads), "-f", text, "--json"] + CONFIGS[c]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[0]
            runs[(c, d)].append(res)
            print(f"rep {r} {c:11s} depth {d}: prefill {res['prefill_tok_s']:.1f} decode {res['decode_tok_s']:.1f} "
                  f"kv {res['kv_bytes'] / 2**20:.1f} MiB routing {100 * res['routing_share_of_decode']:.2f}%",
                  file=sys.stderr, flush=True)
    rows = []
    for (c, d), rs in runs.items():
        rows.append({"config": c, "depth": d,
                     "prefill_tok_s": statistics.median(x["prefill_tok_s"] for x in rs),
                     "decode_tok_s": statistics.median(x["decode_tok_s"] for x in rs),
                     "kv_bytes": rs[-1]["kv_bytes"],
                     "routing_share_of_decode": statistics.median(x["routing_share_of_decode"] for x in rs),
                     "runs": rs})
    print("| context | cache | prefill tok/s | decode tok/s | KV bytes held | routing share of decode |")
    print("|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda x: (x["depth"], x["config"])):
        print(f"| {row['depth']} | {row['config']} | {row['prefill_tok_s']:.1f} | {row['decode_tok_s']:.1f} | "
              f"{row['kv_bytes'] / 2**20:.1f} MiB | {100 * row['routing_share_of_decode']:.2f} % |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
