#!/usr/bin/env python3
"""Every prompt a column answered worse than FullKV, with where its needle was (issue 51).

For each cell of VARIANT (a substring of the variant's name, optionally @BUDGET) that scored
below the FullKV cell of the same (task, sample, protocol, turn): the two scores, the asked
needle's tokens by tier when the question arrived (F / Q / E shares of its token-layers, from
the line's diagnostics.before.needle_tiers) and in F after the answer, the windows promoted
during the turn, and the output against the expected answer. It tells the two failures of
the issue apart: a needle evicted before the question (E) from one held at low bits and read
wrong (Q, not promoted). Lines without diagnostics (protocol `end`) show "–".

Usage: python3 tools/eval/losses.py results/eval/adapt-8k kmeta=8:q=0.95 [--protocol after]
"""
import argparse
import os

from report import read_results  # this folder's report.py


def key(r):
    return (r["task"], int(r["sample"]), r.get("protocol", "end"), r.get("turn"))


def shares(tiers):
    n = sum(tiers.values())
    return {t: tiers.get(t, 0) / n for t in "FQE"} if n else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("variant", help="a substring of the variant's name, optionally @BUDGET")
    ap.add_argument("--protocol", default="", help="only this protocol (end, after, multi, first)")
    a = ap.parse_args()
    name, _, budget = a.variant.partition("@")
    rows = read_results(os.path.join(a.dir, "results.jsonl"))
    full = {key(r): float(r["score"]) for r in rows if r["variant"] == "full"}
    print(f"| task | sample | protocol | turn | score | FullKV | needle F / Q / E at the question "
          f"| needle in F after | promoted | output | expected |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    n = lost = 0
    for r in rows:
        if r["variant"] == "full" or name not in r["variant"]:
            continue
        if budget and abs(float(r.get("budget", 0)) - float(budget)) > 1e-9:
            continue
        if a.protocol and r.get("protocol", "end") != a.protocol:
            continue
        k = key(r)
        if k not in full:
            continue
        n += 1
        if float(r["score"]) >= full[k]:
            continue
        lost += 1
        d = r.get("diagnostics") or {}
        before = shares(d.get("before", {}).get("needle_tiers", {}))
        after = shares(d.get("after", {}).get("needle_tiers", {}))
        at_q = " / ".join(f"{before[t]:.2f}" for t in "FQE") if before else "–"
        in_f = f"{after['F']:.2f}" if after else "–"
        prom = d.get("after", {}).get("promotions", "–")
        out = " ".join(str(r.get("output", "")).split())[:48].replace("|", "\\|")
        exp = ", ".join(str(e) for e in r.get("expected", []))[:48].replace("|", "\\|")
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3] if k[3] is not None else ''} | {float(r['score']):.2f} "
              f"| {full[k]:.2f} | {at_q} | {in_f} | {prom} | {out} | {exp} |")
    print(f"\n{lost} of {n} paired cells below FullKV.")


if __name__ == "__main__":
    main()
