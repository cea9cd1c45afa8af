#!/usr/bin/env python3
"""Renames variants in a `qevict eval` output directory, for when a default changes.

A variant's name is its spec (`qevict:route=end`); when a policy's default changes, the same
spec runs something else. Before resuming a sweep on a binary with the new default, give the
cells the name that still says what ran (`qevict:route=end:prefill_window=0`). Rewrites
results.jsonl.gz and results.jsonl (whichever exist) in place, line for line, touching only
the "variant" field; refuses a rename whose new name already has cells. Then rerun
`qevict eval --summary-only --out DIR` for summary.csv / summary.md.

Usage: python3 tools/eval/rename_variant.py DIR "OLD=>NEW" ["OLD=>NEW" ...]
"""
import argparse
import gzip
import json
import os
import sys


def rewrite(path, opener, mapping):
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    have = set()
    for line in lines:
        if line.strip():
            have.add(json.loads(line)["variant"])
    clash = [new for old, new in mapping.items() if new in have and old in have]
    if clash:
        sys.exit(f"{path}: cells named {', '.join(clash)} exist already; nothing changed")
    out, n = [], 0
    for line in lines:
        if not line.strip():
            out.append(line)
            continue
        d = json.loads(line)
        if d["variant"] in mapping:
            d["variant"] = mapping[d["variant"]]
            # The same separators and key order as the C++ writer (nlohmann dump(-1)).
            line = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
            n += 1
        out.append(line)
    tmp = path + ".tmp"
    with opener(tmp, "wt") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, path)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("renames", nargs="+", metavar="OLD=>NEW")
    a = ap.parse_args()
    mapping = {}
    for r in a.renames:
        old, sep, new = r.partition("=>")  # specs hold "=" themselves
        if not sep or not old or not new:
            sys.exit(f"'{r}' is not OLD=>NEW")
        mapping[old] = new
    done = False
    for name, opener in (("results.jsonl.gz", gzip.open), ("results.jsonl", open)):
        path = os.path.join(a.dir, name)
        if os.path.exists(path):
            print(f"{path}: {rewrite(path, opener, mapping)} cells renamed")
            done = True
    if not done:
        sys.exit(f"{a.dir}: no results.jsonl(.gz)")


if __name__ == "__main__":
    main()
