#!/usr/bin/env python3
"""Prefill and decode speed of two qevict builds, alternating, in one run (A/B check that a
change kept the speed). For every (policy, depth): runs `BIN bench -r 1 --json` for A, then
B, --reps times; reports medians and the B/A ratio. Only the standard library is needed.

    python3 tools/bench/ab_speed.py --a /path/to/old/qevict --b build/tools/qevict \\
        --model "$(tools/fetch_model.sh)" --depths 512,4096 --reps 5

Writes ab_speed.json and ab_speed.md to --out-dir and prints the markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def bench(binary, model, depth, n_decode, threads, policy, route):
    cmd = [binary, "bench", "-m", model, "-d", str(depth), "-n", str(n_decode), "-r", "1",
           "-t", str(threads), "--json"]
    name, _, budget = policy.partition(":")
    cmd += ["--kv-policy", name]
    if budget:
        cmd += ["--kv-budget", budget]
    if route and name != "full":  # binaries from before and after a default changed
        cmd += ["--prefill-route", route]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    row = json.loads(p.stdout)[0]
    return row["prefill_tok_s"], row["decode_tok_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="baseline qevict binary")
    ap.add_argument("--b", required=True, help="candidate qevict binary")
    ap.add_argument("--model", required=True)
    ap.add_argument("--depths", default="512,4096")
    ap.add_argument("--policies", default="full,qevict:0.2",
                    help="comma-separated NAME or NAME:BUDGET")
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prefill-route", default="",
                    help="chunk or end for every budgeted policy (default: each binary's own)")
    ap.add_argument("--out-dir", default="results/ab_speed")
    a = ap.parse_args()
    depths = [int(x) for x in a.depths.split(",")]
    policies = a.policies.split(",")
    runs = {}
    total = a.reps * len(depths) * len(policies) * 2
    done = 0
    for rep in range(a.reps):
        for policy in policies:
            for depth in depths:
                for tag, binary in (("a", a.a), ("b", a.b)):
                    pp, tg = bench(binary, a.model, depth, a.n_decode, a.threads, policy,
                                   a.prefill_route)
                    runs.setdefault((policy, depth, tag), []).append((pp, tg))
                    done += 1
                    print(f"[{done}/{total}] rep {rep + 1} {policy} depth {depth} {tag}: "
                          f"prefill {pp:.1f} decode {tg:.1f} tok/s", file=sys.stderr, flush=True)
    rows = []
    md = ["| policy | depth | prefill A | prefill B | B/A | decode A | decode B | B/A |",
          "|---|---|---|---|---|---|---|---|"]
    for policy in policies:
        for depth in depths:
            ra, rb = runs[(policy, depth, "a")], runs[(policy, depth, "b")]
            ppa = statistics.median(r[0] for r in ra)
            ppb = statistics.median(r[0] for r in rb)
            tga = statistics.median(r[1] for r in ra)
            tgb = statistics.median(r[1] for r in rb)
            rows.append({"policy": policy, "depth": depth, "prefill_a": ppa, "prefill_b": ppb,
                         "decode_a": tga, "decode_b": tgb, "runs_a": ra, "runs_b": rb})
            md.append(f"| {policy} | {depth} | {ppa:.1f} | {ppb:.1f} | {ppb / ppa:.3f} | "
                      f"{tga:.1f} | {tgb:.1f} | {tgb / tga:.3f} |")
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, "ab_speed.json"), "w") as f:
        json.dump({"a": a.a, "b": a.b, "reps": a.reps, "threads": a.threads,
                   "prefill_route": a.prefill_route,
                   "n_decode": a.n_decode, "rows": rows}, f, indent=1)
    text = "\n".join(md) + "\n"
    with open(os.path.join(a.out_dir, "ab_speed.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
