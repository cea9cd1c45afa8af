#!/usr/bin/env python3
"""Prefill and decode speed of qevict and llama.cpp (llama-cpp-python, built from source for
this CPU) on the same GGUF, same thread count, same context depths, in one run.

    python=$(tools/venv.sh)
    $python tools/bench/bench_vs_llamacpp.py --model "$(tools/fetch_model.sh)" \
        --qevict build/tools/qevict --depths 512,4096 --threads 2 --out bench_results.json

For each depth P: prefill P tokens (chunks of 512) on an empty cache → prefill tok/s; then
N greedy one-token decode steps on top → decode tok/s at depth P. Each engine runs R times
(engines alternate, so drift on the machine hits both); medians and ratios are reported.
Context tokens: tests/golden/english_gpl3.txt, tokenized, repeated as needed.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import time

import numpy as np
from llama_cpp import Llama, __version__ as llama_cpp_version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def last_logits(llm):
    # With logits_all=False llama-cpp-python does not fill llm.scores; read the context's
    # logits of the batch's last token directly.
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def llama_run(llm, prompt, n_decode, batch):
    llm.reset()
    t0 = time.perf_counter()
    for i in range(0, len(prompt), batch):
        llm.eval(prompt[i:i + batch])
    t1 = time.perf_counter()
    for _ in range(n_decode):
        tok = int(np.argmax(last_logits(llm)))
        llm.eval([tok])
    t2 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_decode / (t2 - t1)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--qevict", default=os.path.join(ROOT, "build/tools/qevict"))
    ap.add_argument("--depths", default="512,4096")
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--text", default=os.path.join(ROOT, "tests/golden/english_gpl3.txt"))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    max_ctx = max(depths) + a.n_decode + 8
    llm = Llama(model_path=a.model, n_ctx=max_ctx, n_batch=a.batch, n_ubatch=a.batch, n_threads=a.threads,
                n_threads_batch=a.threads, logits_all=False, verbose=False)
    src = llm.tokenize(open(a.text, "rb").read(), add_bos=False, special=False)
    rows = []
    for P in depths:
        prompt = [src[i % len(src)] for i in range(P)]
        q_pp, q_tg, l_pp, l_tg = [], [], [], []
        for r in range(a.reps):
            out = subprocess.run([a.qevict, "bench", "-m", a.model, "-t", str(a.threads), "-d", str(P), "-n",
                                  str(a.n_decode), "-b", str(a.batch), "-r", "1", "-f", a.text, "--json"],
                                 check=True, capture_output=True, text=True).stdout
            res = json.loads(out)[0]
            q_pp.append(res["prefill_tok_s"])
            q_tg.append(res["decode_tok_s"])
            pp, tg = llama_run(llm, prompt, a.n_decode, a.batch)
            l_pp.append(pp)
            l_tg.append(tg)
            print(f"depth {P} rep {r}: qevict pp {q_pp[-1]:.1f} tg {q_tg[-1]:.1f} | llama.cpp pp {pp:.1f} tg {tg:.1f}",
                  flush=True)
        row = {"depth": P, "n_decode": a.n_decode, "threads": a.threads,
               "qevict": {"prefill_tok_s": statistics.median(q_pp), "decode_tok_s": statistics.median(q_tg),
                          "prefill_runs": q_pp, "decode_runs": q_tg},
               "llama_cpp": {"prefill_tok_s": statistics.median(l_pp), "decode_tok_s": statistics.median(l_tg),
                             "prefill_runs": l_pp, "decode_runs": l_tg}}
        row["ratio_prefill"] = row["qevict"]["prefill_tok_s"] / row["llama_cpp"]["prefill_tok_s"]
        row["ratio_decode"] = row["qevict"]["decode_tok_s"] / row["llama_cpp"]["decode_tok_s"]
        rows.append(row)
    result = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform()},
              "llama_cpp_python": llama_cpp_version, "model": os.path.basename(a.model), "rows": rows}
    print("\n| depth | engine | prefill tok/s | decode tok/s |\n|---|---|---|---|")
    for r in rows:
        for eng in ("qevict", "llama_cpp"):
            print(f"| {r['depth']} | {eng} | {r[eng]['prefill_tok_s']:.1f} | {r[eng]['decode_tok_s']:.1f} |")
        print(f"| {r['depth']} | ratio qevict/llama.cpp | {r['ratio_prefill']:.2f} | {r['ratio_decode']:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
