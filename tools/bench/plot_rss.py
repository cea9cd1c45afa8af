#!/usr/bin/env python3
"""Plots the `rss:` lines that `qevict generate --rss-every N` prints (stderr) for several
runs: process RSS and KV-cache bytes against generated tokens. Also writes them as CSV.

    python tools/bench/plot_rss.py --out results/memory/rss_8192 full=full.err qevict=tiered.err
"""
import argparse
import re


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output prefix (.png and .csv are added)")
    ap.add_argument("runs", nargs="+", help="label=stderr-file")
    a = ap.parse_args()
    pat = re.compile(r"rss: generated (\d+) tokens, RSS (\d+) KiB, KV cache (\d+) bytes")
    data = {}
    for spec in a.runs:
        label, path = spec.split("=", 1)
        data[label] = [tuple(int(x) for x in m.groups()) for m in map(pat.search, open(path)) if m]
    with open(a.out + ".csv", "w") as f:
        f.write("run,generated_tokens,rss_kib,kv_bytes\n")
        for label, rows in data.items():
            for t, rss, kv in rows:
                f.write(f"{label},{t},{rss},{kv}\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for label, rows in data.items():
        ax[0].plot([r[0] for r in rows], [r[2] / 2**20 for r in rows], "o-", label=label)
        ax[1].plot([r[0] for r in rows], [r[1] / 1024 for r in rows], "o-", label=label)
    ax[0].set_title("KV cache bytes held (MiB)")
    ax[1].set_title("process RSS (MiB, includes the mapped model)")
    for x in ax:
        x.set_xlabel("generated tokens")
        x.grid(True, alpha=0.3)
        x.legend()
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)


if __name__ == "__main__":
    main()
