#!/usr/bin/env python3
"""Fidelity of the tiered KV cache against FullKV at several budgets (issue: tiered cache).

For a committed text: the first --prefill tokens are a prompt (chunked prefill), the next
--forced tokens are teacher-forced one token per forward call, so routing runs while we
score. FullKV's logits are saved once (--logits-out); every variant is compared with them
(--kl-base) over the teacher-forced positions: mean KL(FullKV || variant) and top-1
agreement. Variants (--variants): qevict (F + Q + E, q = 0.70), the two-tier cache with the
same windows (--kv-q 0, F + E), StreamingLLM (sink + recent) and H2O (heavy hitters + recent,
per head), each with its authors' defaults, at every budget (equal bytes per layer). The
quantizers (kivi-2, kivi-4, zipcache, kvquant-3) keep every token and cannot meet a budget: each runs
once, at the byte point its settings give (its stored bytes / FullKV's f16 bytes, from --kv-stats).

    python=$(tools/venv.sh)
    $python tools/bench/fidelity_vs_budget.py --qevict build/tools/qevict --model "$(tools/fetch_model.sh)" \
        --out-dir results/fidelity

Writes fidelity.json, fidelity.md and fidelity.png (KL and top-1 vs budget) to --out-dir.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, refusal_ok=False):
    """stdout, stderr of cmd; exits on failure, except (refusal_ok) a budget the cache refuses
    as too small, which returns (None, its message)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        if refusal_ok and "budget too small" in p.stderr:
            return None, p.stderr.strip().splitlines()[-1]
        sys.exit(f"command failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qevict", default=os.path.join(ROOT, "build/tools/qevict"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default=os.path.join(ROOT, "tests/golden/english_gpl3.txt"),
                    help="a text file, or a .gz (e.g. /usr/share/doc/jargon-text/jargon.txt.gz, "
                         "the eval's haystack) read from --text-start on")
    ap.add_argument("--text-start", default="Chapter 1. Hacker Slang",
                    help="for a .gz text: start at the first occurrence of this")
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--forced", type=int, default=1024)
    ap.add_argument("--budgets", default="0.5,0.2,0.1,0.05")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extra", default="", help="extra qevict flags for every variant run")
    ap.add_argument("--variants", default="qevict,two-tier,streaming,h2o",
                    help="comma-separated, or 'all': every policy of the registry")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results/fidelity"))
    ap.add_argument("--plot-only", action="store_true",
                    help="no runs: redraw fidelity.md and fidelity.png from every row of "
                         "--out-dir's fidelity.json (e.g. after rows of several runs were merged)")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    if a.plot_only:
        j = json.load(open(os.path.join(a.out_dir, "fidelity.json")))
        names = list(dict.fromkeys(r["variant"] for r in j["rows"]))
        report(a, j["rows"], [(n, []) for n in names], j["fullkv_perplexity"])
        return
    if a.text.endswith(".gz"):
        import gzip
        body = gzip.open(a.text, "rt", errors="replace").read()
        at = body.find(a.text_start) if a.text_start else 0
        text_file = os.path.join(a.out_dir, "text.txt")
        with open(text_file, "w") as f:
            f.write(body[max(at, 0):max(at, 0) + 200000])
        a.text = text_file
    n = a.prefill + a.forced
    base_cmd = [a.qevict, "perplexity", "-m", a.model, "-f", a.text, "--max-tokens", str(n), "-c", str(n),
                "--prefill", str(a.prefill), "-t", str(a.threads)]
    full_npy = os.path.join(a.out_dir, "fullkv_logits.npy")
    out, _ = run(base_cmd + ["--logits-out", full_npy])
    full_ppl = float(re.search(r"perplexity: ([0-9.]+)", out).group(1))
    # Resumable: rows of an earlier run into the same --out-dir (same text and lengths) are kept.
    json_path = os.path.join(a.out_dir, "fidelity.json")
    rows = []
    if os.path.exists(json_path):
        old = json.load(open(json_path))
        if (old.get("prefill"), old.get("forced")) == (a.prefill, a.forced) and \
                abs(old.get("fullkv_perplexity", 0) - full_ppl) < 1e-6:
            rows = old["rows"]
    # qevict's rows route every prefill chunk with Eq. 1, the route BENCHMARKS' fidelity
    # tables were measured with (qevict's default until the eval suite chose `end`).
    chunk = ["--prefill-route", "chunk"]
    known = {"qevict": ("qevict", ["--kv-policy", "qevict"] + chunk),
             "two-tier": ("two-tier (q=0)", ["--kv-policy", "qevict", "--kv-q", "0"] + chunk),
             "streaming": ("streaming", ["--kv-policy", "streaming"]),
             "h2o": ("h2o", ["--kv-policy", "h2o"]),
             # Quantizers keep every token: one run each at the byte point their settings give
             # (issue 10), placed at that point (stored bytes / FullKV's f16 bytes).
             "kivi-2": ("kivi-2", ["--kv-policy", "kivi", "--kv-bits", "2"]),
             "kivi-4": ("kivi-4", ["--kv-policy", "kivi", "--kv-bits", "4"]),
             "zipcache": ("zipcache 4/2", ["--kv-policy", "zipcache"]),
             "kvquant-3": ("kvquant-3", ["--kv-policy", "kvquant"])}
    for pol in ("snapkv", "pyramidkv", "adakv", "criticalkv", "criticaladakv", "defensivekv",
                "layer-defensivekv"):
        known[pol] = (pol, ["--kv-policy", pol])
    if a.variants == "all":
        a.variants = ",".join(known)
    quantizers = {"kivi-2", "kivi-4", "zipcache 4/2", "kvquant-3"}
    variants = [known[v] for v in a.variants.split(",")]
    runs = [(float(b), name, flags) for b in a.budgets.split(",") for name, flags in variants
            if name not in quantizers]
    runs += [(None, name, flags) for name, flags in variants if name in quantizers]
    def save():
        result = {"text": os.path.relpath(a.text, ROOT), "prefill": a.prefill, "forced": a.forced,
                  "fullkv_perplexity": full_ppl, "command": " ".join(sys.argv), "rows": rows}
        with open(json_path + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(json_path + ".tmp", json_path)

    done = {(r["variant"], r["budget"]) for r in rows if not r.get("byte_point")}
    done |= {(r["variant"], None) for r in rows if r.get("byte_point")}
    for b, name, flags in runs:
        if (name, b) in done:
            continue
        budget_flags = [] if b is None else ["--kv-budget", str(b)]
        out, err = run(base_cmd + flags + budget_flags + ["--kl-base", full_npy, "--kv-stats"] +
                       (a.extra.split() if a.extra else []), refusal_ok=True)
        if out is None:  # the budget cannot hold this policy's fixed state: a row that says so
            rows.append({"variant": name, "budget": b, "refused": err, "byte_point": False})
            print(f"{name:16s} budget {b:5.2f}: refused ({err})", file=sys.stderr, flush=True)
            save()
            continue
        m = re.search(r"mean KL ([0-9.e-]+) \(p99 ([0-9.e-]+)\), top-1 agreement ([0-9.]+) over (\d+)", out)
        ppl = float(re.search(r"perplexity: ([0-9.]+)", out).group(1))
        tot = [l for l in err.splitlines() if l.startswith("kv-stats: total")]
        held = re.search(r"bytes held by the cache: ([0-9.]+) MiB", err)
        point = re.search(r"= ([0-9.]+) x FullKV's f16 bytes", err)
        if b is None:
            b = float(point.group(1))
        rows.append({"variant": name, "budget": b, "mean_kl": float(m.group(1)), "p99_kl": float(m.group(2)),
                     "top1": float(m.group(3)), "positions": int(m.group(4)), "perplexity": ppl,
                     "byte_point": name in quantizers,
                     "bytes_held_mib": float(held.group(1)) if held else None,
                     "kv_stats_total": tot[0] if tot else ""})
        print(f"{name:16s} budget {b:5.2f}: KL {rows[-1]['mean_kl']:.5f} top-1 {rows[-1]['top1']:.4f} "
              f"ppl {ppl:.3f}", file=sys.stderr, flush=True)
        save()
    save()
    report(a, rows, variants, full_ppl)


def report(a, rows, variants, full_ppl):
    """fidelity.md and fidelity.png in a.out_dir: every row, a line per variant of `variants`."""
    lines = [f"FullKV perplexity over the same positions' chunk: {full_ppl:.3f}", "",
             "| budget | variant | mean KL vs FullKV | p99 KL | top-1 agreement | perplexity | bytes held (MiB) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("refused"):
            lines.append(f"| {r['budget']:.4g} | {r['variant']} | refused: {r['refused']} | | | | |")
            continue
        lines.append(f"| {r['budget']:.4g}{' (byte point)' if r.get('byte_point') else ''} | {r['variant']} | {r['mean_kl']:.5f} | {r['p99_kl']:.4f} | {r['top1']:.4f} | "
                     f"{r['perplexity']:.3f} | {r['bytes_held_mib']} |")
    with open(os.path.join(a.out_dir, "fidelity.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        for i, (name, _) in enumerate(variants):  # 20 colours, then the style tells them apart
            rs = [r for r in rows if r["variant"] == name and not r.get("refused")]
            style = dict(color=plt.cm.tab20(i % 20), marker="os^v"[i // 5 % 4],
                         linestyle=["-", "--", ":"][i % 3], label=name)
            ax[0].plot([r["budget"] for r in rs], [r["mean_kl"] for r in rs], **style)
            ax[1].plot([r["budget"] for r in rs], [r["top1"] for r in rs], **style)
        for x, t in zip(ax, ["mean KL(FullKV || variant), nats", "top-1 agreement with FullKV"]):
            x.set_xscale("log")
            x.set_xlabel("KV budget (fraction of the full cache)")
            x.set_title(t)
            x.grid(True, alpha=0.3)
            x.legend(fontsize=7)
        ax[0].set_yscale("log")
        fig.suptitle(f"SmolLM2-135M, {a.prefill}-token prompt + {a.forced} teacher-forced tokens")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out_dir, "fidelity.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)


if __name__ == "__main__":
    main()
