#!/usr/bin/env python3
"""Compares two float32 logits files [n_positions, n_vocab] (.npy): top-1 agreement and
mean KL(base || test) of the softmax distributions, per position averaged.

    python tools/compare_logits.py BASE.npy TEST.npy [--json OUT.json]
"""
import argparse
import json

import numpy as np


def log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("test")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    base = np.load(a.base, mmap_mode="r")
    test = np.load(a.test, mmap_mode="r")
    n = min(len(base), len(test))
    if base.shape[1] != test.shape[1]:
        raise SystemExit(f"vocab sizes differ: {base.shape} vs {test.shape}")
    kls, agree, maxdiff = [], 0, 0.0
    for i in range(0, n, 128):
        j = min(n, i + 128)
        b = log_softmax(np.asarray(base[i:j]))
        t = log_softmax(np.asarray(test[i:j]))
        kls.extend((np.exp(b) * (b - t)).sum(axis=-1).tolist())
        agree += int((b.argmax(-1) == t.argmax(-1)).sum())
        maxdiff = max(maxdiff, float(np.abs(np.asarray(base[i:j]) - np.asarray(test[i:j])).max()))
    kls = np.array(kls)
    res = {"positions": n, "top1_agreement": agree / n, "mean_kl": float(kls.mean()),
           "p99_kl": float(np.quantile(kls, 0.99)), "max_kl": float(kls.max()), "max_abs_logit_diff": maxdiff}
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
