#!/usr/bin/env python3
"""Plots of `qevict eval`'s summary.csv, written next to it:

  eval_LENGTH.png   one panel per task (and the macro mean): score against budget, a line per
                    variant with its 95 % interval as a band; FullKV (no budget) as a
                    horizontal reference line. qevict's variants drawn thicker.

The numbers come from summary.csv only; this script draws them.
Usage: $(tools/eval/venv.sh) tools/eval/plot_eval.py DIR/summary.csv [--out-dir DIR]
"""
import argparse
import csv
import math
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["length"] = int(r["length"])
        r["budget"] = float(r["budget"])
        r["n"] = int(r["n"])
        for k in ("mean", "ci95_low", "ci95_high"):
            r[k] = 100.0 * float(r[k])
    return rows


MARKERS = "osD^vP*Xhp<>"


def plot_length(rows, length, out, bands):
    tasks = sorted({r["task"] for r in rows if r["task"] != "macro"})
    if any(r["task"] == "macro" for r in rows):
        tasks.append("macro")
    cols = min(4, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.0 * nrows), squeeze=False)
    variants = sorted({r["variant"] for r in rows})
    # tab20 and a marker per variant: 17 variants must stay apart (tab10 repeats after ten).
    colours = {v: plt.cm.tab20(i % 20) for i, v in enumerate(variants)}
    markers = {v: MARKERS[i % len(MARKERS)] for i, v in enumerate(variants)}
    if bands is None:
        bands = len(variants) <= 6  # more bands than that hide the lines
    budgets = sorted({r["budget"] for r in rows if r["budget"] > 0})
    for ax, task in zip(axes.flat, tasks):
        by = defaultdict(list)
        for r in rows:
            if r["task"] == task:
                by[r["variant"]].append(r)
        for v, rs in sorted(by.items()):
            rs.sort(key=lambda r: r["budget"])
            if all(r["budget"] == 0 for r in rs):  # FullKV: no budget, a reference line
                ax.axhline(rs[0]["mean"], color=colours[v], ls="--", lw=1.2,
                           label=f"{v} (n={rs[0]['n']})")
                continue
            x = [r["budget"] for r in rs]
            ours = v.startswith("qevict")
            ax.plot(x, [r["mean"] for r in rs], marker=markers[v], ms=4, color=colours[v],
                    lw=2.0 if ours else 1.0, label=v)
            if bands:
                ax.fill_between(x, [r["ci95_low"] for r in rs], [r["ci95_high"] for r in rs],
                                color=colours[v], alpha=0.15)
        ax.set_title(task, fontsize=10)
        ax.set_ylim(-3, 103)
        if budgets:
            ax.set_xscale("log")  # 5 / 10 / 20 / 50 % evenly apart
            ax.set_xticks(budgets)
            ax.set_xticklabels([f"{100 * b:g}" for b in budgets])
            ax.minorticks_off()
        ax.set_xlabel("KV budget (% of the full cache)")
        ax.set_ylabel("score (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # As many columns as the longest name lets fit across the figure (~190 characters at
    # fontsize 8), the panels lifted by the legend's rows; bbox "tight" clips nothing.
    longest = max((len(x) for x in labels), default=1)
    ncol = max(1, min(6, len(labels), 190 // (longest + 6)))
    rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
    what = "bands: 95 % bootstrap" if bands else "95 % intervals in summary.csv; --bands draws them"
    fig.suptitle(f"qevict eval, {length} tokens: score vs KV budget ({what}; dashed: no budget)")
    fig.tight_layout(rect=(0, min(0.4, 0.01 + 0.016 * rows), 1, 0.96))
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summary_csv")
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--bands", action=argparse.BooleanOptionalAction, default=None,
                    help="draw the 95 %% intervals (default: only with at most 6 variants)")
    a = ap.parse_args()
    out_dir = a.out_dir or os.path.dirname(os.path.abspath(a.summary_csv))
    os.makedirs(out_dir, exist_ok=True)
    rows = read_rows(a.summary_csv)
    for length in sorted({r["length"] for r in rows}):
        out = os.path.join(out_dir, f"eval_{length}.png")
        plot_length([r for r in rows if r["length"] == length], length, out, a.bands)
        print(out)


if __name__ == "__main__":
    main()
