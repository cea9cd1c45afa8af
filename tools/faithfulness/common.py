"""What the three NumPy faithfulness scripts (kivi_numpy.py, kvquant_numpy.py, zipcache_numpy.py)
share: their command line and the qevict run that dumps a cache's prompt state for them."""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def arg_parser(doc, out_dir, golden_tokens):
    """The options every script takes; a script adds its own (bits, group, ...) after."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qevict", default=os.path.join(ROOT, "build/tools/qevict"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default=os.path.join(ROOT, "tests/golden/english_gpl3.txt"))
    ap.add_argument("--tokens", type=int, default=1024, help="prompt tokens (all prefill)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, out_dir))
    ap.add_argument("--reuse-dump", "--no-run", dest="reuse_dump", action="store_true",
                    help="skip the qevict run when --out-dir already holds its dump")
    ap.add_argument("--golden-out", default="", help="write the CTest golden data here")
    ap.add_argument("--golden-tokens", type=int, default=golden_tokens)
    return ap


def dump_prompt(a, dump, policy_args, meta_name):
    """Runs `qevict perplexity` on the first a.tokens tokens of a.text, all prefill, with the
    cache's --kv-trace dump into `dump` (unless --reuse-dump finds it there). Returns the dump's
    meta and the command line (which the scripts' JSON records)."""
    os.makedirs(dump, exist_ok=True)
    meta_path = os.path.join(dump, meta_name)
    n = a.tokens
    cmd = [a.qevict, "perplexity", "-m", a.model, "-f", a.text, "--max-tokens", str(n + 1), "-c", str(n + 1),
           "--prefill", str(n), "-t", "2"] + policy_args + ["--kv-trace", dump]
    if not (a.reuse_dump and os.path.exists(meta_path)):
        print("+", " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    with open(meta_path) as f:
        return json.load(f), " ".join(cmd)
