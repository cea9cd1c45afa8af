#!/usr/bin/env python3
"""Per-task scores of columns from several `qevict eval` directories, on the same prompts.

A small run (say 5 prompts per task with a new variant) is compared against a grid's cells on
the same prompts: eval's prompts are seeded by task, length and sample index, so sample i of a
task is the same prompt in every directory of the same length. Each column is
DIR::VARIANT@BUDGET (FullKV: full@0). Prints a markdown table: per task the mean score in
percent over samples 0..N-1, then the RULER macro (mean of the RULER task means present in
every column). Exits with an error if two columns disagree on a sample's seed (different
prompts) or if a column has no cells.

Usage: python3 tools/eval/compare.py --first 5 \
         results/eval/ruler-8k::full@0 results/eval/bits4-8k::qevict:pool=2:bits=4@0.2 ...
"""
import argparse
import gzip
import json
import os
import sys

RULER = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1",
         "qa_2"}


def read_results(d):
    plain = os.path.join(d, "results.jsonl")
    if os.path.exists(plain):
        f = open(plain, encoding="utf-8")
    else:
        f = gzip.open(plain + ".gz", "rt", encoding="utf-8")
    with f:
        return [json.loads(line) for line in f if line.strip()]


def parse_column(spec):
    if "::" not in spec or "@" not in spec:
        sys.exit(f"compare: '{spec}' is not DIR::VARIANT@BUDGET")
    d, rest = spec.split("::", 1)
    variant, budget = rest.rsplit("@", 1)
    try:
        return d, variant, float(budget)
    except ValueError:
        sys.exit(f"compare: '{budget}' in '{spec}' is not a budget")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=5, help="samples 0..N-1 of each task")
    ap.add_argument("--length", type=int, default=0, help="only this length (default: any)")
    ap.add_argument("columns", nargs="+", help="DIR::VARIANT@BUDGET")
    a = ap.parse_args()

    cache = {}
    cols = []  # (label, {(task, sample): (score, seed)})
    for spec in a.columns:
        d, variant, budget = parse_column(spec)
        if d not in cache:
            cache[d] = read_results(d)
        cells = {}
        for r in cache[d]:
            if (r["variant"] == variant and abs(r["budget"] - budget) < 1e-9
                    and r["sample"] < a.first and (a.length == 0 or r["length"] == a.length)):
                cells[(r["task"], r["sample"])] = (r["score"], r["seed"])
        if not cells:
            sys.exit(f"compare: no cells for {spec}")
        cols.append((f"{os.path.basename(os.path.normpath(d))}: {variant}@{budget:g}", cells))

    for label, cells in cols[1:]:
        for key, (_, seed) in cells.items():
            if key in cols[0][1] and cols[0][1][key][1] != seed:
                sys.exit(f"compare: {label} sample {key} has another prompt (seed) than {cols[0][0]}")

    tasks = sorted({t for _, cells in cols for (t, _) in cells})
    print("| task | " + " | ".join(label for label, _ in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    means = [dict() for _ in cols]
    for t in tasks:
        row = []
        for i, (_, cells) in enumerate(cols):
            v = [s for (task, _), (s, _) in cells.items() if task == t]
            if v:
                means[i][t] = 100 * sum(v) / len(v)
                row.append(f"{means[i][t]:.1f} ({len(v)})")
            else:
                row.append("")
        print(f"| {t} | " + " | ".join(row) + " |")
    common = [t for t in tasks if t in RULER and all(t in m for m in means)]
    if common:
        macro = [sum(m[t] for t in common) / len(common) for m in means]
        print(f"| **RULER macro** ({len(common)} tasks) | " + " | ".join(f"**{x:.1f}**" for x in macro) + " |")


if __name__ == "__main__":
    main()
