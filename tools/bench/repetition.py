#!/usr/bin/env python3
"""Repetition profile of generated texts: for consecutive segments of N words, the share of
distinct word 4-grams (1.0 = no 4-gram repeats inside the segment; degenerate loops → ~0).
Used to compare long generations with FullKV and with the tiered cache (BENCHMARKS.md).

    python3 tools/bench/repetition.py full.txt tiered.txt [--segment 1000]
"""
import argparse


def profile(text, seg):
    words = text.split()
    out = []
    for i in range(0, max(len(words) - 3, 1), seg):
        w = words[i:i + seg]
        grams = [tuple(w[j:j + 4]) for j in range(len(w) - 3)]
        out.append(len(set(grams)) / len(grams) if grams else 1.0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--segment", type=int, default=1000)
    a = ap.parse_args()
    profs = {f: profile(open(f, encoding="utf-8", errors="replace").read(), a.segment) for f in a.files}
    n = max(len(p) for p in profs.values())
    print("| words | " + " | ".join(profs) + " |")
    print("|---" * (len(profs) + 1) + "|")
    for i in range(n):
        cells = [f"{p[i]:.2f}" if i < len(p) else "" for p in profs.values()]
        print(f"| {i * a.segment}–{(i + 1) * a.segment} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
