#!/usr/bin/env python3
"""One table per question protocol from a `qevict eval --protocol ...` directory (issue 51).

For every (protocol, variant@budget): the mean score in percent — the macro over tasks (mean
of the task means; a `multi` task's samples are its question turns) with a 95 % bootstrap
interval (resampled within each task, report.py's task_macro_bootstrap) — the paired gap to
FullKV and to --ref (the default unless given) on the prompts both answered, with its own
interval, and from the lines' diagnostics: the share of the asked needle's tokens evicted
(`E`) and held at low bits (`Q`) when the question arrived, and the windows promoted in the
turn. Cells are paired by (task, sample, turn); a gap is over the pairs present in both.

Writes DIR/protocols.md, DIR/protocols.csv and, with matplotlib (run it with
$(tools/eval/venv.sh)), DIR/protocols.png (score per protocol, one bar per column, 95 %
intervals). Prints the markdown too.

Usage: python3 tools/eval/protocol_table.py results/eval/qshare-4k [--ref VARIANT@BUDGET]
"""
import argparse
import csv
import os
import statistics
from collections import defaultdict

from report import read_results, task_macro_bootstrap  # this folder's report.py

DEFAULT = "qevict:route=end:prefill_window=32:pool=2:bits=4:vbits=2@0.2"
PROTOCOLS = ["end", "after", "multi", "first"]


def column(r):
    b = float(r.get("budget", 0.0))
    return f"{r['variant']}@{b:g}" if b > 0 else r["variant"]


def per_task(cells):
    """{task: [score, ...]} from {(task, sample, turn): score}."""
    out = defaultdict(list)
    for (task, _, _), s in sorted(cells.items()):
        out[task].append(100.0 * s)
    return out


def paired_gap(a, b):
    """Macro of the per-task mean differences a - b over the keys both have, and its interval."""
    keys = set(a) & set(b)
    if not keys:
        return None
    diffs = defaultdict(list)
    for k in sorted(keys):
        diffs[k[0]].append(100.0 * (a[k] - b[k]))
    return task_macro_bootstrap(list(diffs.values()))


def needle_shares(lines):
    """Mean shares of the asked needle's tokens in E and Q when the question arrived, and the
    mean promotions of the turn, over the lines that carry them (None when none do)."""
    e, q, promo = [], [], []
    for r in lines:
        d = r.get("diagnostics") or {}
        tiers = (d.get("before") or {}).get("needle_tiers")
        if tiers and sum(tiers.values()) > 0:
            tot = sum(tiers.values())
            e.append(100.0 * tiers.get("E", 0) / tot)
            q.append(100.0 * tiers.get("Q", 0) / tot)
        if "promotions" in d:
            promo.append(d["promotions"])
    mean = lambda x: statistics.mean(x) if x else None  # noqa: E731
    return mean(e), mean(q), mean(promo)


def fmt_gap(g):
    return "–" if g is None else f"{g[0]:+.1f} [{g[1]:+.1f}, {g[2]:+.1f}]"


def fmt(x, spec=".1f"):
    return "–" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--ref", default=DEFAULT, help="the column gaps are also taken against")
    ap.add_argument("--length", type=int, default=0, help="only this length (default: every)")
    args = ap.parse_args()

    rows = read_results(os.path.join(args.dir, "results.jsonl"))
    cells = defaultdict(dict)  # (length, protocol, column) -> {(task, sample, turn): score}
    lines = defaultdict(list)
    for r in rows:
        if args.length and r["length"] != args.length:
            continue
        key = (r["length"], r.get("protocol", "end"), column(r))
        cells[key][(r["task"], r["sample"], r.get("turn", 0))] = r["score"]
        lines[key].append(r)

    md, table = [], []
    for length in sorted({k[0] for k in cells}):
        md.append(f"\n## {length} tokens\n")
        for proto in [p for p in PROTOCOLS if any(k[:2] == (length, p) for k in cells)]:
            cols = sorted((k[2] for k in cells if k[:2] == (length, proto)),
                          key=lambda c: (c != "full", c != args.ref, c))
            full = cells.get((length, proto, "full"), {})
            ref = cells.get((length, proto, args.ref), {})
            md.append(f"\n### `{proto}`\n")
            md.append("| column | n | score [95 %] | − FullKV (paired) | − reference (paired) "
                      "| needle E % | needle Q % | promotions |")
            md.append("|---|---|---|---|---|---|---|---|")
            for c in cols:
                own = cells[(length, proto, c)]
                m = task_macro_bootstrap(list(per_task(own).values()))
                gf = paired_gap(own, full) if c != "full" else None
                gr = paired_gap(own, ref) if c != args.ref else None
                e, q, promo = needle_shares(lines[(length, proto, c)])
                md.append(f"| {c} | {len(own)} | {m[0]:.1f} [{m[1]:.1f}, {m[2]:.1f}] | {fmt_gap(gf)} "
                          f"| {fmt_gap(gr)} | {fmt(e)} | {fmt(q)} | {fmt(promo, '.0f')} |")
                table.append({"length": length, "protocol": proto, "column": c, "n": len(own),
                              "mean": m[0], "ci95_low": m[1], "ci95_high": m[2],
                              "gap_full": gf[0] if gf else "", "gap_ref": gr[0] if gr else "",
                              "needle_E": e if e is not None else "",
                              "needle_Q": q if q is not None else ""})
    text = "\n".join(md).lstrip() + "\n"
    print(text)
    with open(os.path.join(args.dir, "protocols.md"), "w") as f:
        f.write(f"Reference column: `{args.ref}`. Made by tools/eval/protocol_table.py.\n\n" + text)
    with open(os.path.join(args.dir, "protocols.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0].keys()))
        w.writeheader()
        w.writerows(table)
    plot(table, os.path.join(args.dir, "protocols.png"))


def plot(table, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("protocol_table: no matplotlib, no plot (run with $(tools/eval/venv.sh))")
        return
    protos = [p for p in PROTOCOLS if any(t["protocol"] == p for t in table)]
    cols = sorted({t["column"] for t in table}, key=lambda c: (c != "full", c))
    # Up to 20 columns in distinct colours, the legend beside the axes (it hid bars inside).
    fig, ax = plt.subplots(figsize=(12, 4.8))
    colours = plt.get_cmap("tab20" if len(cols) > 10 else "tab10").colors
    width = 0.8 / max(len(cols), 1)
    for i, c in enumerate(cols):
        xs, ys, lo, hi = [], [], [], []
        for j, p in enumerate(protos):
            t = [t for t in table if t["protocol"] == p and t["column"] == c]
            if t:
                xs.append(j + (i - (len(cols) - 1) / 2) * width)
                ys.append(t[0]["mean"])
                lo.append(t[0]["mean"] - t[0]["ci95_low"])
                hi.append(t[0]["ci95_high"] - t[0]["mean"])
        label = c.replace("qevict:route=end:prefill_window=32:pool=2:", "qevict:")
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label,
               color=colours[i % len(colours)])
    ax.set_xticks(range(len(protos)))
    ax.set_xticklabels(protos)
    ax.set_ylabel("score (macro over tasks, %)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
