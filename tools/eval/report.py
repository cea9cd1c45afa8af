#!/usr/bin/env python3
"""Tables for EVALUATION.md from a `qevict eval` output directory (summary.csv, results.jsonl).

Prints markdown, per length:
  - the RULER macro (mean over the RULER tasks present, 95 % bootstrap interval from
    summary.csv) of every variant at every budget, FullKV first;
  - per task family at each budget: niah (mean over the niah tasks), vt, cwe, fwe, and the
    long-document tasks lcc (edit similarity, and exact match from results.jsonl), doc_qa and
    doc_sum (ROUGE-L agreement with FullKV);
  - bytes each variant's cache held at the end of a sample (median over samples, MiB, from
    results.jsonl) against FullKV's;
  - the sweep's machine time: the sum over samples of one batch's prefill + decode seconds;
  - with --per-task, one table per task: each variant's mean score at every budget and the
    number of samples (FullKV and the quantizers in the first column);
  - with --macro-tasks T1,T2,..., the macro over those tasks only (mean of the task means) with
    a 95 % bootstrap interval (samples resampled within each task, 2,000 draws, seed 0), e.g.
    over the tasks a running sweep has finished.
Cells with fewer samples than the others of their length are marked with their n.

Usage: python3 tools/eval/report.py DIR [--budgets 0.5,0.2,0.1,0.05] [--per-task]
                                     [--macro-tasks T1,T2,...]
"""
import argparse
import csv
import json
import os
import statistics
from collections import defaultdict

NIAH = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
        "niah_multikey_3", "niah_multivalue", "niah_multiquery"]
FAMILIES = [("niah", NIAH), ("vt", ["vt"]), ("cwe", ["cwe"]), ("fwe", ["fwe"]), ("qa", ["qa_1", "qa_2"]),
            ("lcc", ["lcc"]),
            ("doc_qa", ["doc_qa"]), ("doc_sum", ["doc_sum"])]


def task_macro_bootstrap(per_task, draws=2000, seed=0):
    """The macro (mean of the task means) of per_task, a list of per-task sample lists, and a
    95 % percentile bootstrap interval: each draw resamples the samples within each task.
    report.py --macro-tasks and compare.py --paired (on paired differences) both use it."""
    import random

    rng = random.Random(seed)
    boots = sorted(statistics.mean(statistics.mean(rng.choices(x, k=len(x))) for x in per_task)
                   for _ in range(draws))
    mean = statistics.mean(statistics.mean(x) for x in per_task)
    return mean, boots[int(0.025 * draws) - 1], boots[int(0.975 * draws) - 1]


def read_summary(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            r["length"] = int(r["length"])
            r["budget"] = float(r["budget"])
            r["n"] = int(r["n"])
            for k in ("mean", "ci95_low", "ci95_high"):
                r[k] = 100.0 * float(r[k])
            rows.append(r)
    return rows


def read_results(path):
    # results.jsonl, or the gzipped copy a fresh clone has (`qevict eval` keeps both).
    out = []
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        import gzip
        opener = lambda: gzip.open(path + ".gz", "rt")  # noqa: E731
    else:
        opener = lambda: open(path)  # noqa: E731
    with opener() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def variant_order(names):
    def key(v):
        return (v != "full", v.split(":")[0] != "qevict", v)
    return sorted(names, key=key)


def budget_table(title, variants, budgets, cell):
    """A markdown table, one row per variant and one column per budget: cell(v, b) is the
    text of a cell, or None for '–'."""
    print(f"\n### {title}\n")
    print("| variant | " + " | ".join(f"{b:g}" for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for v in variants:
        cols = [cell(v, b) for b in budgets]
        print(f"| {v} | " + " | ".join("–" if c is None else c for c in cols) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--budgets", default="0.5,0.2,0.1,0.05")
    ap.add_argument("--per-task", action="store_true", help="also one table per task")
    ap.add_argument("--macro-tasks", default="", help="also the macro over these tasks only")
    a = ap.parse_args()
    budgets = [float(b) for b in a.budgets.split(",")]
    summary = read_summary(os.path.join(a.dir, "summary.csv"))
    results = read_results(os.path.join(a.dir, "results.jsonl"))

    cell = {(r["length"], r["task"], r["variant"], r["budget"]): r for r in summary}
    lengths = sorted({r["length"] for r in summary})
    # Per-sample scores for family means and exact match: (length, task, variant, budget) -> list.
    scores = defaultdict(list)
    exact = defaultdict(list)
    held = defaultdict(list)
    batches = {}
    for j in results:
        k = (j["length"], j["task"], j["variant"], j["budget"])
        scores[k].append(100.0 * j["score"])
        if "exact_match" in j:
            exact[k].append(100.0 * float(j["exact_match"]))
        held[(j["length"], j["variant"], j["budget"])].append(j.get("bytes_held", 0) / 2**20)
        batches[(j["length"], j["task"], j["sample"], j["prefill_seconds"], j["decode_seconds"])] = \
            j["prefill_seconds"] + j["decode_seconds"]

    def at(table, key, b):
        """table[key + (b,)]; FullKV and the quantizers (budget 0) fill the first column."""
        return table.get(key + (b,)) or (table.get(key + (0.0,)) if b == budgets[0] else None)

    for length in lengths:
        variants = variant_order({r["variant"] for r in summary if r["length"] == length})
        macro = {(v, b): cell.get((length, "macro", v, b)) for v in variants for b in [0.0] + budgets}
        ns = [r["n"] for r in macro.values() if r]
        n_max = max(ns) if ns else 0
        def macro_cell(v, b):
            r = at(macro, (v,), b)
            if r is None:
                return None
            tag = "" if r["n"] == n_max else f" (n={r['n']})"
            return f"{r['mean']:.1f} [{r['ci95_low']:.1f}, {r['ci95_high']:.1f}]{tag}"

        budget_table(f"{length:,} tokens: RULER macro (%, 95 % interval)", variants, budgets,
                     macro_cell)
        print("\nFullKV and the quantizers (kivi, kvquant, zipcache) run once, at no budget or at their"
              " byte point: their value is in the first column.")

        for b in budgets:
            print(f"\n### {length:,} tokens at budget {b:g}: by task family (%; n samples)\n")
            fams = [f for f, ts in FAMILIES if any(scores.get((length, t, "full", 0.0)) for t in ts)]
            print("| variant | " + " | ".join(fams) + " | lcc exact |")
            print("|---|" + "---|" * (len(fams) + 1))
            for v in variants:
                bb = 0.0 if any(k[0] == length and k[2] == v and k[3] == 0.0 for k in scores) else b
                cols = []
                for f, ts in FAMILIES:
                    if f not in fams:
                        continue
                    per_task = [statistics.mean(scores[(length, t, v, bb)]) for t in ts
                                if scores.get((length, t, v, bb))]
                    n = sum(len(scores.get((length, t, v, bb), [])) for t in ts)
                    cols.append(f"{statistics.mean(per_task):.1f} ({n})" if per_task else "–")
                ex = exact.get((length, "lcc", v, bb))
                cols.append(f"{statistics.mean(ex):.1f}" if ex else "–")
                print(f"| {v} | " + " | ".join(cols) + " |")

        def held_cell(v, b):
            h = at(held, (length, v), b)
            return f"{statistics.median(h):.2f}" if h else None

        budget_table(f"{length:,} tokens: bytes the cache held at the end of a sample (MiB, median)",
                     variants, budgets, held_cell)
        if a.per_task:
            tasks = sorted({k[1] for k in scores if k[0] == length})
            for t in tasks:
                n_full = len(scores.get((length, t, "full", 0.0), []))
                print(f"\n### {length:,} tokens, {t}: score (%) at "
                      + " / ".join(f"{b:g}" for b in budgets) + f" (FullKV: {n_full} samples)\n")
                print("| variant | scores | n |")
                print("|---|---|---|")
                for v in variants:
                    cols, ns = [], set()
                    for b in budgets:
                        x = at(scores, (length, t, v), b)
                        if x is None:
                            continue
                        cols.append(f"{statistics.mean(x):.0f}")
                        ns.add(len(x))
                    if cols:
                        print(f"| {v} | " + " / ".join(cols) + " | "
                              + ",".join(str(n) for n in sorted(ns)) + " |")

        if a.macro_tasks:
            mts = a.macro_tasks.split(",")

            def task_macro_cell(v, b):
                per = [at(scores, (length, t, v), b) for t in mts]
                if any(x is None for x in per):
                    return None
                m, lo, hi = task_macro_bootstrap(per)
                n = min(len(x) for x in per)
                return f"{m:.1f} [{lo:.1f}, {hi:.1f}] (n≥{n})"

            budget_table(f"{length:,} tokens: macro over {', '.join(mts)} (%, 95 % bootstrap "
                         "interval)", variants, budgets, task_macro_cell)

        secs = sum(t for k, t in batches.items() if k[0] == length)
        n_samples = len({(k[1], k[2]) for k in batches if k[0] == length})
        print(f"\nMachine time at {length:,}: {secs / 3600:.2f} h over {n_samples} samples "
              f"({secs / max(n_samples, 1) / 60:.1f} min per sample, every variant in one batch).")


if __name__ == "__main__":
    main()
