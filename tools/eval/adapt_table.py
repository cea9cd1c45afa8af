#!/usr/bin/env python3
"""--kv-adapt's threshold from a grid that ran the default, the coverage tier and FullKV
(tools/eval/run_adapt_4k.sh; issue 51 item 3).

The lines of a column run with --kv-adapt carry `focus`: KL (nats) of the prompt-end
observation window's attention over the text from the prompt's own attention per query, mean
over layers, measured before any routing — the same for every column of a prompt (the
statistic does not depend on the tier). --kv-adapt T keeps the default's tier when focus >= T
and takes the coverage tier below, so its score on a prompt is the default's or the coverage
column's line.
For every threshold T this gives each protocol's macro (mean of task means, 95 % bootstrap
interval as protocol_table.py) and its paired gaps to FullKV and to the default, and the
share of prompts sent to coverage. The columns that really ran with adapt=T are checked
against that: the same output as the column their `adapted` field names, line by line.

Writes DIR/adapt.md, DIR/adapt.csv and (with matplotlib: $(tools/eval/venv.sh)) DIR/adapt.png.
Usage: python3 tools/eval/adapt_table.py results/eval/adapt-4k [--thresholds 0.05,0.1,...]
"""
import argparse
import csv
import os
from collections import defaultdict

from protocol_table import paired_gap, per_task  # this folder's
from report import read_results, task_macro_bootstrap

DEFAULT = "qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2"
COVERAGE = "qevict:route=end:prefill_window=32:pool=2:bits=2:vbits=2:kmeta=8:q=0.95"
PROTOCOLS = ["end", "after", "multi"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--length", type=int, default=0, help="only this length (default: every)")
    ap.add_argument("--chosen", type=float, default=None, help="mark this threshold in the plot")
    ap.add_argument("--thresholds", default="0,0.3,0.35,0.4,0.45,0.5,0.55,0.6,0.7,0.8,1,1.5,100")
    args = ap.parse_args()

    rows = [r for r in read_results(os.path.join(args.dir, "results.jsonl"))
            if not args.length or r["length"] == args.length]
    cells = defaultdict(dict)  # (length, protocol, variant) -> {(task, sample, turn): line}
    focus = {}  # (length, protocol, task, sample) -> focus
    for r in rows:
        proto = r.get("protocol", "end")
        v = r["variant"] if r["variant"] == "full" or abs(r["budget"] - args.budget) < 1e-9 else None
        if v is None:
            continue
        cells[(r["length"], proto, v)][(r["task"], r["sample"], r.get("turn", 0))] = r
        if "focus" in r and ":adapt=" in r["variant"]:
            focus.setdefault((r["length"], proto, r["task"], r["sample"]), r["focus"])

    md, table = [], []
    thresholds = [float(t) for t in args.thresholds.split(",")]
    for length in sorted({k[0] for k in cells}):
        md.append(f"\n## {length} tokens, budget {args.budget:g}\n")
        md.append("Simulated from the default's and the coverage column's lines: the coverage "
                  "tier where focus < T.\n")
        md.append("| T | protocol | n | to coverage | score [95 %] | − FullKV (paired) | − default (paired) |")
        md.append("|---|---|---|---|---|---|---|")
        for t in thresholds:
            for proto in PROTOCOLS:
                d = cells.get((length, proto, DEFAULT), {})
                c = cells.get((length, proto, COVERAGE), {})
                full = {k: x["score"] for k, x in cells.get((length, proto, "full"), {}).items()}
                keys = [k for k in d if k in c and (length, proto, k[0], k[1]) in focus]
                if not keys:
                    continue
                sim, dsc, cov = {}, {}, 0
                for k in keys:
                    f = focus[(length, proto, k[0], k[1])]
                    use_c = f < t
                    cov += use_c
                    sim[k] = (c if use_c else d)[k]["score"]
                    dsc[k] = d[k]["score"]
                m = task_macro_bootstrap(list(per_task(sim).values()))
                gf = paired_gap(sim, full)
                gd = paired_gap(sim, dsc)
                fmt = lambda g: "–" if g is None else f"{g[0]:+.1f} [{g[1]:+.1f}, {g[2]:+.1f}]"  # noqa: E731
                md.append(f"| {t:g} | {proto} | {len(keys)} | {100.0 * cov / len(keys):.0f} % | "
                          f"{m[0]:.1f} [{m[1]:.1f}, {m[2]:.1f}] | {fmt(gf)} | {fmt(gd)} |")
                table.append({"length": length, "threshold": t, "protocol": proto, "n": len(keys),
                              "to_coverage": cov / len(keys), "mean": m[0], "ci95_low": m[1],
                              "ci95_high": m[2], "gap_full": gf[0] if gf else "",
                              "gap_default": gd[0] if gd else ""})
        # The focus each protocol's prompts had (the statistic's spread).
        md.append("\n| protocol | prompts | focus min | 25 % | median | 75 % | max |")
        md.append("|---|---|---|---|---|---|---|")
        for proto in PROTOCOLS:
            fs = sorted(f for (ln, p, _, _), f in focus.items() if ln == length and p == proto)
            if fs:
                q = lambda x: fs[min(len(fs) - 1, int(x * len(fs)))]  # noqa: E731
                md.append(f"| {proto} | {len(fs)} | {fs[0]:.3f} | {q(0.25):.3f} | {q(0.5):.3f} | "
                          f"{q(0.75):.3f} | {fs[-1]:.3f} |")
        # Columns that ran with adapt: their lines against the column they say they took.
        checked = mism = 0
        for (ln, proto, v), own in cells.items():
            if ln != length or ":adapt=" not in v:
                continue
            for k, x in own.items():
                other = COVERAGE if x.get("adapted") == "coverage" else DEFAULT
                y = cells.get((ln, proto, other), {}).get(k)
                if y is None:
                    continue
                checked += 1
                mism += x["output"] != y["output"]
        md.append(f"\nadapt columns against the column they chose: {checked} lines checked, "
                  f"{mism} with another output.\n")
    text = "\n".join(md).lstrip() + "\n"
    print(text)
    with open(os.path.join(args.dir, "adapt.md"), "w") as f:
        f.write("Made by tools/eval/adapt_table.py.\n\n" + text)
    if table:
        with open(os.path.join(args.dir, "adapt.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0].keys()))
            w.writeheader()
            w.writerows(table)
        plot(table, focus, os.path.join(args.dir, "adapt.png"), args.chosen)


def plot(table, focus, path, chosen=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("adapt_table: no matplotlib, no plot (run with $(tools/eval/venv.sh))")
        return
    lengths = sorted({t["length"] for t in table})
    fig, axes = plt.subplots(2, len(lengths), figsize=(6.5 * len(lengths), 7), squeeze=False)
    for i, length in enumerate(lengths):
        ax = axes[0][i]
        for proto in PROTOCOLS:
            pts = [t for t in table if t["length"] == length and t["protocol"] == proto]
            if not pts:
                continue
            xs = [min(t["threshold"], 2.0) for t in pts]
            ax.plot(xs, [t["mean"] for t in pts], marker="o", label=proto)
            ax.fill_between(xs, [t["ci95_low"] for t in pts], [t["ci95_high"] for t in pts], alpha=0.15)
        ax.set_xlabel("--kv-adapt threshold T, nats (2 = every prompt to coverage)")
        ax.set_ylabel("score (macro, %)")
        ax.set_title(f"{length} tokens: score if the coverage tier is taken below T")
        ax.legend()
        # The statistic per prompt, by protocol: where a threshold can separate them.
        ax = axes[1][i]
        for j, proto in enumerate(PROTOCOLS):
            fs = [f for (ln, p, _, _), f in focus.items() if ln == length and p == proto]
            ax.scatter(fs, [j + 0.08 * ((k % 5) - 2) for k in range(len(fs))], s=18, label=proto)
        if chosen is not None:
            ax.axvline(chosen, color="k", linestyle="--", linewidth=1)
            ax.text(chosen, len(PROTOCOLS) - 0.75, f" T = {chosen:g}", fontsize=9)
        ax.set_yticks(range(len(PROTOCOLS)), PROTOCOLS)
        ax.set_xlabel("focus: KL(prompt-end window || the text's own attention), nats, mean over layers")
        ax.set_title("focus of each prompt (first turn) by protocol")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"adapt_table: wrote {path}")


if __name__ == "__main__":
    main()
