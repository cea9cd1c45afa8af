#!/usr/bin/env python3
"""Prefill and decode speed of qevict (FullKV and the tiered cache) against llama.cpp's native
llama-bench (f16 and q4_0 KV, flash attention on), side by side, in one run, set against the
memory read bandwidth measured in the same run (build/tools/qevict-membw).

    python=$(tools/venv.sh)
    $python tools/bench/decode_bench.py --depths 512,4096,8192,16384 --reps 3 --out-dir results/speed_decode

Rows (--configs): qevict-full (--kv-policy full), qevict-0.2 / qevict-0.1 (--kv-policy qevict
--kv-budget 0.2 / 0.1), llama.cpp-f16 and llama.cpp-q4_0 (-ctk/-ctv, -fa 1); on request also
qevict-0.2-int2 / qevict-0.1-int2 (the same with --kv-bits 2, the paper's INT2 tier) and qevict-0.2-coverage
(--kv-adapt's coverage tier: INT2, one-byte key scales, q 0.95). Repetitions
alternate: rep 1 of every (depth, row), then rep 2, ..., so drift on a shared machine hits all
rows alike; medians are reported. qevict-membw runs at the start of every rep.

What is measured, for both engines (same GGUF, same --threads, no warm-up run):
  prefill  P tokens on an empty cache in chunks of --batch (qevict bench -d P; llama-bench
           -p P -d 0 -b/-ub --batch);
  decode   --n-decode one-token steps on top of a P-token context (qevict bench's decode
           after its prefill; llama-bench -p 0 -n N -d P, whose depth fill is untimed).
  --llama-prefill-max D times llama.cpp's prefill only up to depth D: every llama-bench call
  fills its own cache, so a prefill row at 16K costs a second 16K fill per rep.
qevict's decode tokens are greedy (argmax), llama-bench's are random ids: same work per step.
Run it on a quiet machine: llama.cpp's CPU threads (OpenMP, GGML_OPENMP is on by default) spin
at every barrier, so when other processes compete for the cores its figures collapse far more
than qevict's (on a 2-core machine at load average ~5.8: 0.35-1.4 decode tok/s at depth 512
with the default wait policy, 17-19 with OMP_WAIT_POLICY=passive). The 1-minute load average
is recorded with every run and summarised in the output; a warning is printed above 0.5.
--llama-args passes extra flags to every llama-bench call.

Bytes read per decode token (every row; an estimate of the traffic a step must stream):
  weights  the GGUF's tensor bytes (gguf-py), without token_embd when the model has a
           separate output.weight (decode then reads one embedding row only);
  KV       the K and V data attention reads, on average over the decode steps:
           qevict tiered: the sink + F + Q tier bytes from --kv-stats after the run;
           qevict-full and llama.cpp: n_layers x 2 x n_kv_heads x head_dim x (bytes per
           element: f16 2, q4_0 18/32) x (P + N/2) tokens, from the model's shapes.
           qevict bench's own kv_bytes (all the cache holds: whole pages, free pool slots,
           the RoPE table, scratch) is reported beside it for the qevict rows.
  achieved GB/s = bytes per token x decode tok/s. On a CPU whose last-level cache is about as
  large as the weights, achieved figures can pass the DRAM bandwidth: that is cache, not error.

Writes decode_bench.json (every run), decode_bench.csv (medians) and decode_bench.md (tables,
also printed) into --out-dir. The JSON's meta.qevict_commit is the commit the --qevict binary
was built from (`qevict --version`; null for a binary older than that flag), and
meta.checkout_commit this checkout's HEAD when the script ran (results written before
--version existed hold the checkout's HEAD as qevict_commit, which need not be the binary's:
results/README.md says which commit each folder's binary was). Progress goes to stderr.
Needs only this venv's python (gguf), the qevict build (build/tools/qevict,
build/tools/qevict-membw) and tools/llamacpp.sh.
"""
import argparse
import csv
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QEVICT_CONFIGS = {
    "qevict-full": ["--kv-policy", "full"],
    "qevict-0.2": ["--kv-policy", "qevict", "--kv-budget", "0.2"],
    "qevict-0.1": ["--kv-policy", "qevict", "--kv-budget", "0.1"],
    # The paper's INT2 low-bit tier (qevict's default until the task suite moved it to keys at
    # 4 bits, values at 2), for side-by-side runs with the default.
    "qevict-0.2-int2": ["--kv-policy", "qevict", "--kv-budget", "0.2", "--kv-bits", "2"],
    "qevict-0.1-int2": ["--kv-policy", "qevict", "--kv-budget", "0.1", "--kv-bits", "2"],
    # Issue 51's coverage tier (INT2, one-byte key scales, q 0.95): the decode a user of
    # --kv-adapt gets when the prompt asks no question. Spelled out, because --kv-adapt itself
    # keeps the default's tier on this bench's text: --file is repeated to the depth, so the
    # prompt's end looks back at its earlier copies and its focus is high (a 16K run measured
    # the same tier bytes as qevict-0.2).
    "qevict-0.2-coverage": ["--kv-policy", "qevict", "--kv-budget", "0.2", "--kv-bits", "2",
                            "--kv-value-bits", "2", "--kv-key-meta", "8", "--kv-q", "0.95"],
}
LLAMA_CONFIGS = {"llama.cpp-f16": "f16", "llama.cpp-q4_0": "q4_0"}
# Bytes per element of llama.cpp KV types (ggml blocks: q4_0 = 32 values in 18 B, q8_0 in 34 B).
GGML_KV_BYTES = {"f16": 2.0, "bf16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                 "q5_0": 22 / 32, "q5_1": 24 / 32}
BASE_F16 = "llama.cpp-f16"
BASE_FULL = "qevict-full"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, what):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"decode_bench: {what} failed ({p.returncode}):\n  {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr, time.time() - t0


def script_output(script):
    """The last stdout line of one of our tools/*.sh scripts (they print a path there)."""
    p = subprocess.run([os.path.join(ROOT, "tools", script)], stdout=subprocess.PIPE, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        sys.exit(f"decode_bench: tools/{script} failed (see above)")
    return p.stdout.strip().splitlines()[-1]


def model_facts(path):
    try:
        from gguf import GGUFReader
    except ImportError:
        sys.exit("decode_bench: the gguf package is missing: run this with $(tools/venv.sh)")
    r = GGUFReader(path)

    def field(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    weights = sum(sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        weights -= sizes["token_embd.weight"]  # decode reads one row of it, not all
    n_embd = int(field(f"{arch}.embedding_length"))
    n_head = int(field(f"{arch}.attention.head_count"))
    head_dim = int(field(f"{arch}.attention.key_length", n_embd // n_head))
    return {"name": field("general.name", os.path.basename(path)), "file": os.path.basename(path),
            "file_bytes": os.path.getsize(path), "weight_bytes_read_per_token": weights,
            "tied_embeddings": "output.weight" not in sizes,
            "n_layers": int(field(f"{arch}.block_count")), "n_kv_heads": int(field(f"{arch}.attention.head_count_kv")),
            "head_dim": head_dim, "n_ctx_train": int(field(f"{arch}.context_length", 0))}


def tier_bytes(stderr):
    """sink + F + Q bytes, all layers, from qevict's --kv-stats 'total' line (None if absent)."""
    header = next((l for l in stderr.splitlines() if "sink B" in l and "Q B" in l), None)
    total = next((l for l in stderr.splitlines() if re.match(r"kv-stats:\s+total\b", l)), None)
    if header is None or total is None:
        return None
    cols = header.split("|")[-1]
    if not (cols.index("sink B") < cols.index(" F B") < cols.index(" Q B")):
        return None
    nums = [int(x) for x in total.split("|")[-1].split()]
    return {"sink": nums[0], "full": nums[1], "quant": nums[2]} if len(nums) >= 3 else None


def kv_data_bytes(facts, kv_type, depth, n_decode):
    """K + V bytes of a contiguous cache over the decode steps' mean length (P + N/2)."""
    per_token = facts["n_layers"] * 2 * facts["n_kv_heads"] * facts["head_dim"] * GGML_KV_BYTES[kv_type]
    return int(per_token * (depth + n_decode / 2))


def run_qevict(a, cfg, depth, facts):
    cmd = [a.qevict, "bench", "-m", a.model, "-d", str(depth), "-n", str(a.n_decode), "-b", str(a.batch),
           "-r", "1", "-t", str(a.threads), "-f", a.text, "--json"] + QEVICT_CONFIGS[cfg]
    tiered = "--kv-budget" in QEVICT_CONFIGS[cfg]
    if tiered:
        cmd.append("--kv-stats")
    out, err, secs = run(cmd, f"qevict bench ({cfg}, depth {depth})")
    res = json.loads(out)[0]
    row = {"prefill_tok_s": res["prefill_tok_s"], "decode_tok_s": res["decode_tok_s"],
           "kv_bytes_held": res["kv_bytes"], "routing_share_of_decode": res.get("routing_share_of_decode"),
           "seconds": secs}
    if tiered:
        tb = tier_bytes(err)
        row["kv_tier_bytes"] = tb
        row["kv_bytes_read"] = sum(tb.values()) if tb else res["kv_bytes"]
        row["kv_bytes_read_source"] = "--kv-stats sink+F+Q" if tb else "bench kv_bytes (no --kv-stats parse)"
    else:
        row["kv_bytes_read"] = kv_data_bytes(facts, "f16", depth, a.n_decode)
        row["kv_bytes_read_source"] = "model shapes, f16, depth + n/2"
    return row


def llama_bench(a, kv_type, extra, what):
    cmd = [os.path.join(a.llama_bin, "llama-bench"), "-m", a.model, "-t", str(a.threads), "-fa", "1",
           "-ctk", kv_type, "-ctv", kv_type, "-b", str(a.batch), "-ub", str(a.batch), "-r", "1",
           "--no-warmup", "-o", "json"] + a.llama_args.split() + extra
    out, _, secs = run(cmd, f"llama-bench ({what})")
    tests = json.loads(out)
    if len(tests) != 1:
        sys.exit(f"decode_bench: llama-bench gave {len(tests)} results for one test: {out[:500]}")
    return tests[0], secs


def run_llama(a, cfg, depth, facts):
    kv_type = LLAMA_CONFIGS[cfg]
    pp, s1 = {"avg_ts": None}, 0.0
    if a.llama_prefill_max <= 0 or depth <= a.llama_prefill_max:
        pp, s1 = llama_bench(a, kv_type, ["-p", str(depth), "-n", "0", "-d", "0"], f"{cfg} prefill {depth}")
    tg, s2 = llama_bench(a, kv_type, ["-p", "0", "-n", str(a.n_decode), "-d", str(depth)],
                         f"{cfg} decode at depth {depth}")
    return {"prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"],
            "kv_bytes_read": kv_data_bytes(facts, kv_type, depth, a.n_decode),
            "kv_bytes_read_source": f"model shapes, {kv_type}, depth + n/2", "seconds": s1 + s2,
            "llama_bench": {"build_commit": tg.get("build_commit"), "build_number": tg.get("build_number"),
                            "cpu_info": tg.get("cpu_info"), "backends": tg.get("backends"),
                            "type_k": tg.get("type_k"), "flash_attn": tg.get("flash_attn")}}


def run_membw(a):
    out, _, _ = run([a.membw, "-t", str(a.threads), "-s", str(a.membw_mib)], "qevict-membw")
    return json.loads(out)


def fmt_ratio(x, y):
    return f"{x / y:.2f}" if x and y else "—"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="GGUF (default: tools/fetch_model.sh)")
    ap.add_argument("--qevict", default=os.path.join(ROOT, "build/tools/qevict"))
    ap.add_argument("--membw", default=os.path.join(ROOT, "build/tools/qevict-membw"))
    ap.add_argument("--llama-bin", default="", help="llama.cpp bin dir (default: tools/llamacpp.sh)")
    ap.add_argument("--depths", default="512,4096,8192,16384")
    ap.add_argument("--configs", default="qevict-full,qevict-0.2,qevict-0.1," + ",".join(LLAMA_CONFIGS))
    ap.add_argument("--n-decode", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512, help="prefill chunk (qevict -b, llama-bench -b/-ub)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-args", default="", help="extra llama-bench flags for every llama.cpp run")
    ap.add_argument("--llama-prefill-max", type=int, default=0,
                    help="time llama.cpp's prefill only at depths up to this (0: every depth); each "
                         "llama-bench call fills its own cache, so a deep prefill row costs a second fill")
    ap.add_argument("--membw-mib", type=int, default=1024, help="qevict-membw buffer (MiB)")
    ap.add_argument("--text", default=os.path.join(ROOT, "tests/golden/english_gpl3.txt"),
                    help="qevict's prompt tokens (llama-bench uses random ids)")
    ap.add_argument("--label", default="", help="a note stored with the results (e.g. 'noisy smoke run')")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results/speed_decode"))
    a = ap.parse_args()

    depths = [int(d) for d in a.depths.split(",")]
    configs = a.configs.split(",")
    for c in configs:
        if c not in QEVICT_CONFIGS and c not in LLAMA_CONFIGS:
            sys.exit(f"decode_bench: unknown config {c} (known: {', '.join(list(QEVICT_CONFIGS) + list(LLAMA_CONFIGS))})")
    for exe, target in ((a.qevict, "qevict"), (a.membw, "qevict-membw")):
        if not os.access(exe, os.X_OK):
            sys.exit(f"decode_bench: {exe} is missing: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && "
                     f"cmake --build build -j2 --target {target}")
    # The results record the binary's commit (--qevict may be a copy built at another commit
    # than the checkout this script runs from); the checkout's HEAD is kept beside it.
    qevict_commit, commit_source = binary_commit(a.qevict), "qevict --version"
    checkout = git_commit()
    if qevict_commit is None:
        commit_source = "unknown: the binary has no --version (built before it)"
        log(f"decode_bench: WARNING: {a.qevict} does not report its commit (no --version); "
            "qevict_commit is recorded as null, the checkout's HEAD as checkout_commit")
    elif checkout and qevict_commit.split("+")[0] != checkout.split("+")[0]:
        log(f"decode_bench: note: the binary was built from {qevict_commit}, the checkout is at {checkout}")
    a.model = a.model or script_output("fetch_model.sh")
    if any(c in LLAMA_CONFIGS for c in configs) and not a.llama_bin:
        a.llama_bin = script_output("llamacpp.sh")
    facts = model_facts(a.model)
    os.makedirs(a.out_dir, exist_ok=True)

    if os.getloadavg()[0] > 0.5:
        log(f"decode_bench: WARNING: load average {os.getloadavg()[0]:.2f} before the first run; other "
            "processes will distort the figures (llama.cpp's far more than qevict's)")
    runs = {(c, d): [] for d in depths for c in configs}
    membw = []
    t_start = time.time()
    for r in range(a.reps):
        mb = run_membw(a)
        membw.append(mb)
        log(f"[rep {r + 1}/{a.reps}] qevict-membw {mb['read_gb_s']:.2f} GB/s ({a.threads} threads, "
            f"{mb['buffer_bytes'] >> 20} MiB); load average {os.getloadavg()[0]:.2f}")
        for d in depths:
            for c in configs:
                res = run_qevict(a, c, d, facts) if c in QEVICT_CONFIGS else run_llama(a, c, d, facts)
                res["rep"] = r + 1
                res["loadavg_1min"] = os.getloadavg()[0]
                runs[(c, d)].append(res)
                pf = f"{res['prefill_tok_s']:8.1f}" if res["prefill_tok_s"] is not None else "     n/a"
                log(f"[rep {r + 1}/{a.reps}] depth {d:6d} {c:15s} prefill {pf} tok/s  "
                    f"decode {res['decode_tok_s']:7.2f} tok/s  ({res['seconds']:.0f} s)")

    bw = statistics.median(m["read_gb_s"] for m in membw)
    rows = []
    for (c, d), rs in runs.items():
        dec = statistics.median(x["decode_tok_s"] for x in rs)
        kv_read = int(statistics.median(x["kv_bytes_read"] for x in rs))
        per_tok = facts["weight_bytes_read_per_token"] + kv_read
        row = {"config": c, "depth": d, "n_decode": a.n_decode, "threads": a.threads, "reps": len(rs),
               "prefill_tok_s": median_or_none(x["prefill_tok_s"] for x in rs), "decode_tok_s": dec,
               "kv_bytes_read": kv_read, "kv_bytes_read_source": rs[-1]["kv_bytes_read_source"],
               "kv_bytes_held": int(statistics.median(x["kv_bytes_held"] for x in rs)) if "kv_bytes_held" in rs[0] else None,
               "bytes_per_decode_token": per_tok, "achieved_gb_s": per_tok * dec / 1e9,
               "share_of_membw": per_tok * dec / 1e9 / bw,
               "beyond_trained_context": bool(facts["n_ctx_train"]) and d + a.n_decode > facts["n_ctx_train"]}
        rows.append(row)
    by = {(x["config"], x["depth"]): x for x in rows}
    for x in rows:
        for key, base in (("vs_llamacpp_f16", BASE_F16), ("vs_qevict_full", BASE_FULL)):
            b = by.get((base, x["depth"]))
            x[f"decode_{key}"] = x["decode_tok_s"] / b["decode_tok_s"] if b else None
            x[f"prefill_{key}"] = (x["prefill_tok_s"] / b["prefill_tok_s"]
                                   if b and x["prefill_tok_s"] and b["prefill_tok_s"] else None)

    loads = [x["loadavg_1min"] for rs in runs.values() for x in rs]
    md = render_markdown(a, rows, facts, membw, bw, configs, loads)
    print(md)
    llama_info = next((x["llama_bench"] for rs in runs.values() for x in rs if "llama_bench" in x), None)
    meta = {"command": " ".join(sys.argv), "label": a.label,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "wall_seconds": time.time() - t_start, "qevict_commit": qevict_commit,
            "qevict_commit_source": commit_source, "checkout_commit": checkout, "model": facts,
            "llama_bench": llama_info, "llama_bin": a.llama_bin, "threads": a.threads,
            "n_decode": a.n_decode, "batch": a.batch, "reps": a.reps, "depths": depths, "configs": configs,
            "membw_gb_s_median": bw, "membw_runs": membw}
    with open(os.path.join(a.out_dir, "decode_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "runs": [{"config": c, "depth": d, "runs": rs} for (c, d), rs in runs.items()]},
                  f, indent=1)
    fields = ["config", "depth", "n_decode", "threads", "reps", "prefill_tok_s", "decode_tok_s",
              "decode_vs_llamacpp_f16", "decode_vs_qevict_full", "prefill_vs_llamacpp_f16", "prefill_vs_qevict_full",
              "kv_bytes_read", "kv_bytes_read_source", "kv_bytes_held", "bytes_per_decode_token", "achieved_gb_s",
              "share_of_membw", "beyond_trained_context"]
    with open(os.path.join(a.out_dir, "decode_bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for x in sorted(rows, key=lambda x: (x["depth"], configs.index(x["config"]))):
            w.writerow(x)
    with open(os.path.join(a.out_dir, "decode_bench.md"), "w") as f:
        f.write(md + "\n")
    log(f"decode_bench: wrote decode_bench.{{json,csv,md}} to {a.out_dir} ({time.time() - t_start:.0f} s)")


def median_or_none(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def binary_commit(exe):
    """The commit the qevict binary says it was built from (`qevict --version`: "qevict <hash>",
    "+dirty" when its sources differed from it, "unknown" when built without git), or None when
    the binary predates --version."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.match(r"qevict (\S+)\s*$", out.stdout.strip()) if out.returncode == 0 else None
    return m.group(1) if m else None


def git_commit():
    """The checkout's HEAD (+dirty): recorded beside the binary's commit, never in its place."""
    try:
        c = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if c.returncode != 0 or not c.stdout.strip():
            return None
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", ROOT, "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
        return c.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return None


def render_markdown(a, rows, facts, membw, bw, configs, loads):
    order = sorted(rows, key=lambda x: (x["depth"], configs.index(x["config"])))
    L = []
    if a.label:
        L += [f"**{a.label}**", ""]
    L += [f"Model {facts['file']} ({facts['name']}), {a.threads} threads, prefill in chunks of {a.batch} on an "
          f"empty cache, then {a.n_decode} one-token decode steps at each depth; median of {a.reps} "
          f"rep(s), rows alternating. llama.cpp = native llama-bench (flash attention on, -ctk/-ctv as named).",
          "",
          f"1-minute load average after each run: {min(loads):.2f} to {max(loads):.2f} (about the thread count on a quiet machine, the bench itself; "
          "more, and llama.cpp's spinning threads lose far more than qevict's).",
          "",
          "| depth | engine / KV | prefill tok/s | decode tok/s | decode vs llama.cpp f16 | decode vs qevict FullKV "
          "| prefill vs llama.cpp f16 | prefill vs qevict FullKV |",
          "|---|---|---|---|---|---|---|---|"]
    for x in order:
        mark = " †" if x["beyond_trained_context"] else ""
        pf = f"{x['prefill_tok_s']:.1f}" if x["prefill_tok_s"] is not None else "not timed"
        L.append(f"| {x['depth']:,}{mark} | {x['config']} | {pf} | {x['decode_tok_s']:.2f} | "
                 f"{fmt_opt(x['decode_vs_llamacpp_f16'])} | {fmt_opt(x['decode_vs_qevict_full'])} | "
                 f"{fmt_opt(x['prefill_vs_llamacpp_f16'])} | {fmt_opt(x['prefill_vs_qevict_full'])} |")
    if any(x["beyond_trained_context"] for x in rows):
        L += ["", f"† past the model's trained context ({facts['n_ctx_train']:,} tokens): these rows are for "
                  "speed only; the model's output there is not meaningful."]
    L += ["", f"Memory read bandwidth (qevict-membw, {a.threads} threads, {membw[0]['buffer_bytes'] >> 20} MiB "
              f"buffer, median over the {len(membw)} rep(s)): **{bw:.2f} GB/s** (per rep: "
              + ", ".join(f"{m['read_gb_s']:.2f}" for m in membw) + ").",
          "",
          f"Bytes per decode token = weights read ({facts['weight_bytes_read_per_token'] / 2**20:.1f} MiB"
          f"{', embeddings tied: the whole table is read for the logits' if facts['tied_embeddings'] else ''}) "
          "+ K/V data read (qevict tiered: sink + F + Q tiers from --kv-stats; qevict-full and llama.cpp: "
          "from the model's shapes and the KV type, over depth + n/2 tokens).",
          "",
          "| depth | engine / KV | KV read MiB | (qevict: KV held MiB) | bytes per token MiB | decode tok/s | achieved GB/s "
          "| share of membw |",
          "|---|---|---|---|---|---|---|---|"]
    for x in order:
        held = f"{x['kv_bytes_held'] / 2**20:.1f}" if x.get("kv_bytes_held") is not None else "—"
        L.append(f"| {x['depth']:,} | {x['config']} | {x['kv_bytes_read'] / 2**20:.1f} | {held} | "
                 f"{x['bytes_per_decode_token'] / 2**20:.1f} | {x['decode_tok_s']:.2f} | {x['achieved_gb_s']:.2f} | "
                 f"{x['share_of_membw']:.2f} |")
    L += ["", "A share above 1 means the step streamed faster than DRAM reads: part of the weights stayed in the "
              "last-level cache."]
    return "\n".join(L)


def fmt_opt(v):
    return f"{v:.2f}" if v is not None else "—"


if __name__ == "__main__":
    main()
