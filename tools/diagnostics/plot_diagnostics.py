#!/usr/bin/env python3
"""Plots of `qevict diagnose` output (diagnostics.json), written next to it:

  fmm.png           future missed mass over decode steps per variant (paper Fig. 1a); dashed:
                    the same with the low-bit tier counted as evicted (Q disabled)
  mass_by_tier.png  FullKV attention mass by tier per variant, stacked (paper Fig. 1b: R2 vs R3),
                    of all mass and of the routed history's mass
  tier_map.png      windows x routing events, coloured by tier, for R2 / R3 / R4 on one layer:
                    promotions (Q->F) and demotions (F->Q) show as colour changes along a row
  ledger.png        ledger bytes held by promoted windows at each routing event: R3 on the model,
                    and the synthetic oscillating workload (strict and non-strict)

The numbers come from the JSON only; this script draws them.
Usage: plot_diagnostics.py DIR/diagnostics.json [--out-dir DIR]
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

TIER_CODES = {"L": 0, "F": 1, "Q": 2, "E": 3}
TIER_COLOURS = ["#bdbdbd", "#1f77b4", "#ff7f0e", "#ffffff"]
TIER_NAMES = ["sink/local", "F (full precision)", "Q (INT2)", "E (evicted)"]


def plot_fmm(j, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    prefill = j["config"]["prefill"]
    for name in j["config"]["variants"]:
        v = j["variants"][name]
        steps = np.arange(len(v["fmm"]))
        (line,) = ax.plot(steps, 100 * np.array(v["fmm"]), label=name, lw=1.4)
        if v["q"] > 0 and v["policy"] == "qevict":
            ax.plot(steps, 100 * np.array(v["fmm_q_as_evicted"]), ls="--", lw=1.0,
                    color=line.get_color(), label=f"{name}, Q counted as evicted")
    ax.set_xlabel(f"decode step (after a {prefill}-token prompt)")
    ax.set_ylabel("future missed mass (% of FullKV attention)")
    ax.set_title("FMM: FullKV attention on tokens the variant has evicted")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fmm.png"), dpi=120)
    plt.close(fig)


def plot_mass(j, out):
    names = list(j["config"]["variants"])
    # R2 and R3 first: the paper's Fig. 1b pair.
    names.sort(key=lambda n: {"R2": 0, "R3": 1}.get(n, 2))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, tiers, title in (
        (axes[0], "mass_by_tier", ["full", "quant", "evicted", "local"], "of all attention mass"),
        (axes[1], "history_mass_by_tier", ["full", "quant", "evicted"],
         "of the routed history's mass (sink + local left out)"),
    ):
        bottom = np.zeros(len(names))
        colours = {"full": TIER_COLOURS[1], "quant": TIER_COLOURS[2], "evicted": "#d62728",
                   "local": TIER_COLOURS[0]}
        labels = {"full": "F", "quant": "Q (INT2)", "evicted": "E (evicted)", "local": "sink+local"}
        for t in tiers:
            vals = np.array([100 * j["variants"][n][key][t] for n in names])
            ax.bar(names, vals, bottom=bottom, color=colours[t], label=labels[t])
            for i, (b, x) in enumerate(zip(bottom, vals)):
                if x >= 4:
                    ax.text(i, b + x / 2, f"{x:.1f}", ha="center", va="center", fontsize=7)
            bottom += vals
        ax.set_ylabel("% of FullKV attention mass")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 100)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Where FullKV's attention falls in each variant's cache (mean over decode steps)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "mass_by_tier.png"), dpi=120)
    plt.close(fig)


def tier_matrix(tm):
    events = tm["events"]
    n_w = max(len(e["tiers"]) for e in events)
    m = np.full((n_w, len(events)), np.nan)
    for k, e in enumerate(events):
        for w, c in enumerate(e["tiers"]):
            m[w, k] = TIER_CODES[c]
    return m, [e["n_past"] for e in events]


def plot_tier_map(j, out):
    names = [n for n in ("R2", "R3", "R4") if n in j["variants"]]
    if not names:
        names = list(j["config"]["variants"])[:1]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 6), squeeze=False)
    cmap = ListedColormap(TIER_COLOURS)
    cmap.set_bad("#000000")
    for ax, name in zip(axes[0], names):
        tm = j["variants"][name]["tier_map"]
        m, n_past = tier_matrix(tm)
        ax.imshow(np.ma.masked_invalid(m), aspect="auto", interpolation="nearest", cmap=cmap,
                  vmin=-0.5, vmax=3.5, origin="lower")
        ax.set_title(f"{name}: layer {tm['layer']}, windows of {tm['unit_tokens']} tokens",
                     fontsize=9)
        ax.set_xlabel("routing event (0 = end of prefill)")
        ax.set_ylabel("window (older at the bottom)")
        ax.set_facecolor("#000000")
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c, ec="#555555") for c in TIER_COLOURS]
    fig.legend(handles, TIER_NAMES, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle("Tier map: a window's tier at each routing event (black: not yet written)")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(os.path.join(out, "tier_map.png"), dpi=120)
    plt.close(fig)


def plot_ledger(j, out):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    moves_ax = axes[0].twinx()
    for name, colour in (("R3", "#1f77b4"), ("R4", "#ff7f0e")):
        v = j["variants"].get(name)
        if not v or "ledger" not in v:
            continue
        ev = v["ledger"]["per_event"]
        axes[0].plot([e["n_past"] for e in ev], [e["ledger_bytes_per_layer"] for e in ev],
                     color=colour, label=f"{name}: ledger bytes held by F windows (mean per layer)")
        moves_ax.bar([e["n_past"] for e in ev], [e["moves"] for e in ev], width=4, alpha=0.3,
                     color=colour, label=f"{name}: promotions + demotions (all layers)")
    axes[0].set_xlabel("tokens in the cache")
    axes[0].set_ylabel("ledger bytes per layer")
    moves_ax.set_ylabel("tier moves at the routing event")
    axes[0].set_title("Model run: ledger held vs churn", fontsize=10)
    h0, l0 = axes[0].get_legend_handles_labels()
    h1, l1 = moves_ax.get_legend_handles_labels()
    axes[0].legend(h0 + h1, l0 + l1, fontsize=7, loc="upper left")
    osc = j.get("oscillation", {})
    for key, style in (("non_strict", "-"), ("strict", "--")):
        o = osc.get(key)
        if not o:
            continue
        ev = o["events"]
        axes[1].plot([e["n_past"] for e in ev],
                     [100 * e["ledger_bytes_of_full"] / o["budget_bytes"] for e in ev], style,
                     label=f"{key.replace('_', '-')}: ledger held by F windows")
        axes[1].plot([e["n_past"] for e in ev],
                     [100 * e["budgeted_bytes"] / o["budget_bytes"] for e in ev], style,
                     alpha=0.6, label=f"{key.replace('_', '-')}: bytes charged to the budget")
    axes[1].set_xlabel("tokens in the cache")
    axes[1].set_ylabel("% of the budget")
    axes[1].set_title("Synthetic workload that oscillates around the F/Q boundary", fontsize=10)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ledger.png"), dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="diagnostics.json written by `qevict diagnose`")
    ap.add_argument("--out-dir", help="where the PNGs go (default: next to the JSON)")
    a = ap.parse_args()
    with open(a.json) as f:
        j = json.load(f)
    out = a.out_dir or os.path.dirname(os.path.abspath(a.json))
    os.makedirs(out, exist_ok=True)
    plot_fmm(j, out)
    plot_mass(j, out)
    plot_tier_map(j, out)
    plot_ledger(j, out)
    print(f"wrote fmm.png, mass_by_tier.png, tier_map.png, ledger.png to {out}")


if __name__ == "__main__":
    main()
