#!/usr/bin/env python3
"""Per-task scores of columns from several `qevict eval` directories, on the same prompts.

A small run (say 5 prompts per task with a new variant) is compared against a grid's cells on
the same prompts: eval's prompts are seeded by task, length and sample index, so sample i of a
task is the same prompt in every directory of the same length. Each column is
DIR::VARIANT@BUDGET (FullKV: full@0). Prints a markdown table: per task the mean score in
percent over samples 0..N-1, then the RULER macro (mean of the RULER task means present in
every column). Exits with an error if two columns disagree on a sample's seed (different
prompts) or if a column has no cells. With --plot PNG (needs matplotlib: run it with
$(tools/eval/venv.sh)), also a figure: the RULER macro and each task of --plot-tasks against
the budget, a line per DIR::VARIANT, FullKV (budget 0) as a dashed reference line.

Usage: python3 tools/eval/compare.py --first 5 \
         results/eval/ruler-8k::full@0 results/eval/bits4-8k::qevict:pool=2:bits=4@0.2 ...
"""
import argparse
import os
import sys

from report import NIAH, read_results, task_macro_bootstrap  # this folder's report.py

RULER = set(NIAH) | {"vt", "cwe", "fwe", "qa_1", "qa_2"}


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
    ap.add_argument("--paired", type=int, default=0,
                    help="also each column's RULER macro minus column K's (1-based), on the prompts "
                         "both have, with a paired 95 %% bootstrap interval")
    ap.add_argument("--plot", default="", help="also write this PNG (score against budget)")
    ap.add_argument("--plot-tasks", default="", help="tasks to plot beside the macro, T1,T2,...")
    ap.add_argument("--title", default="", help="the figure's title")
    ap.add_argument("columns", nargs="+", help="DIR::VARIANT@BUDGET")
    a = ap.parse_args()

    cache = {}
    cols = []  # (label, {(task, sample): (score, seed)})
    points = []  # (series, budget) of each column
    for spec in a.columns:
        d, variant, budget = parse_column(spec)
        if d not in cache:
            cache[d] = read_results(os.path.join(d, "results.jsonl"))
        cells = {}
        for r in cache[d]:
            if (r["variant"] == variant and abs(r["budget"] - budget) < 1e-9
                    and r["sample"] < a.first and (a.length == 0 or r["length"] == a.length)):
                cells[(r["task"], r["sample"])] = (r["score"], r["seed"])
        if not cells:
            sys.exit(f"compare: no cells for {spec}")
        series = f"{os.path.basename(os.path.normpath(d))}: {variant}"
        cols.append((f"{series}@{budget:g}", cells))
        points.append((series, budget))

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
        for m, x in zip(means, macro):
            m["RULER macro"] = x
    if a.paired and common:
        if not 1 <= a.paired <= len(cols):
            sys.exit(f"compare: --paired {a.paired}: there are {len(cols)} columns")
        base = cols[a.paired - 1][1]
        row = []
        for _, cells in cols:
            d, lo, hi = paired_macro_diff(cells, base, common)
            row.append(f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]")
        print(f"| Δ macro vs column {a.paired} (paired) | " + " | ".join(row) + " |")
    if a.plot:
        panels = ["RULER macro"] + [t for t in a.plot_tasks.split(",") if t]
        plot(a.plot, a.title, panels, points, means)


def paired_macro_diff(cells, base, tasks):
    """Macro of (cells − base) over the prompts both have, and report.py's 95 % bootstrap
    interval on those differences: each draw resamples the prompts within each task, the same
    ones for both columns."""
    per_task = []
    for t in tasks:
        diffs = [100 * (cells[k][0] - base[k][0]) for k in cells if k[0] == t and k in base]
        if diffs:
            per_task.append(diffs)
    return task_macro_bootstrap(per_task)


def plot(path, title, panels, points, means):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    names = list(dict.fromkeys(series for series, _ in points))
    colours = {s: plt.cm.tab10(i % 10) for i, s in enumerate(names)}
    for ax, panel in zip(axes.flat, panels):
        for s in names:
            xs = sorted((b, m[panel]) for (series, b), m in zip(points, means)
                        if series == s and panel in m)
            if not xs:
                continue
            if all(b == 0 for b, _ in xs):  # FullKV: no budget
                ax.axhline(xs[0][1], color=colours[s], ls="--", lw=1.2, label=s)
            else:
                ax.plot([100 * b for b, _ in xs], [y for _, y in xs], marker="o",
                        color=colours[s], label=s)
        ax.set_xscale("log")
        ax.set_xticks([5, 10, 20, 50])
        ax.set_xticklabels(["5", "10", "20", "50"])
        lo, hi = ax.get_ylim()  # autoscaled: a few points apart must show
        ax.set_ylim(max(lo, -2), min(hi, 102))
        ax.set_xlabel("KV budget (% of the full cache)")
        ax.set_ylabel("score (%)")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle(title or "qevict eval: score against budget on the same prompts")
    fig.tight_layout(rect=(0, 0.08 + 0.035 * ((len(names) + 1) // 2), 1, 0.95))
    fig.savefig(path, dpi=110)
    print(path)


if __name__ == "__main__":
    main()
