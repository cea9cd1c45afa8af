#!/usr/bin/env python3
"""Medians per (depth, row) over the progress logs (stderr) of one or more decode_bench.py
invocations: for a run split across invocations for time (e.g. a first `--reps 3` run stopped
after rep 2, and its rep 3 from `--reps 1` runs), so the table is still a median over every rep.

    python3 tools/bench/merge_decode_logs.py run1.log run2.log ... > table.md

Reads the lines decode_bench.py prints per run ("[rep R/N] depth D ROW prefill X tok/s decode
Y tok/s") and per rep ("qevict-membw B GB/s"); prints a markdown table with the rep count
and the decode figure of every rep, ratios against llama.cpp f16 / q4_0 and qevict FullKV at
the same depth, and the bandwidth probe's median. Needs only the standard library.
"""
import argparse
import re
import statistics

RUN = re.compile(r"\[rep (\d+)/\d+\] depth\s+(\d+) (\S+)\s+prefill\s+(\S+) tok/s\s+decode\s+(\S+) tok/s")
MEMBW = re.compile(r"qevict-membw (\S+) GB/s")
ORDER = ["qevict-full", "qevict-0.2", "qevict-0.1", "llama.cpp-f16", "llama.cpp-q4_0"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--trained-context", type=int, default=8192,
                    help="mark depths whose decode passes it (default: SmolLM2's 8,192)")
    ap.add_argument("--n-decode", type=int, default=64)
    a = ap.parse_args()
    runs, membw = {}, []
    for path in a.logs:
        with open(path) as f:
            for line in f:
                m = RUN.search(line)
                if m:
                    pf = None if m.group(4) == "n/a" else float(m.group(4))
                    runs.setdefault((int(m.group(2)), m.group(3)), []).append((pf, float(m.group(5))))
                m = MEMBW.search(line)
                if m:
                    membw.append(float(m.group(1)))
    if not runs:
        raise SystemExit("merge_decode_logs: no decode_bench.py run lines in " + ", ".join(a.logs))
    med = {}
    for key, rs in runs.items():
        pfs = [p for p, _ in rs if p is not None]
        med[key] = {"prefill": statistics.median(pfs) if pfs else None,
                    "decode": statistics.median(d for _, d in rs), "decodes": [d for _, d in rs]}

    def ratio(depth, row, base, what):
        b, x = med.get((depth, base)), med[(depth, row)]
        return f"{x[what] / b[what]:.2f}" if b and b[what] and x[what] else "—"

    rows = sorted(med, key=lambda k: (k[0], ORDER.index(k[1]) if k[1] in ORDER else len(ORDER)))
    print("| depth | engine / KV | reps | prefill tok/s | decode tok/s | decode vs llama.cpp f16 "
          "| decode vs llama.cpp q4_0 | decode vs qevict FullKV | prefill vs llama.cpp f16 "
          "| prefill vs qevict FullKV | decode per rep |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for depth, row in rows:
        x = med[(depth, row)]
        mark = " †" if depth + a.n_decode > a.trained_context else ""
        pf = f"{x['prefill']:.1f}" if x["prefill"] is not None else "not timed"
        print(f"| {depth:,}{mark} | {row} | {len(x['decodes'])} | {pf} | {x['decode']:.2f} "
              f"| {ratio(depth, row, 'llama.cpp-f16', 'decode')} | {ratio(depth, row, 'llama.cpp-q4_0', 'decode')} "
              f"| {ratio(depth, row, 'qevict-full', 'decode')} | {ratio(depth, row, 'llama.cpp-f16', 'prefill')} "
              f"| {ratio(depth, row, 'qevict-full', 'prefill')} | {', '.join(f'{d:.2f}' for d in x['decodes'])} |")
    if membw:
        print(f"\nqevict-membw read bandwidth per rep: {', '.join(f'{b:.2f}' for b in membw)} GB/s; "
              f"median {statistics.median(membw):.2f} GB/s.")


if __name__ == "__main__":
    main()
