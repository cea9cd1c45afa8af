#!/usr/bin/env python3
"""Multi-turn traffic at equal memory (issue 50 item 7): conversations that stay warm.

N conversations run at once, each a ~D-token document then Q follow-up questions, one chat
turn after another with --think seconds between a reply and the next question (the user
reading). Every server gets the same KV memory (--pool-mib):
  qevict-0.2   qevict serve --kv-pool-bytes POOL --kv-policy qevict --kv-budget 0.2 (sessions
               reused from the pool: only a turn's new tokens are prefilled)
  qevict-full  the same with --kv-policy full
  llama-f16    llama-server -c POOL/(f16 KV bytes a token) -np SLOTS (prompt cache on, its
               default), SLOTS = the whole --ctx contexts that fit POOL (each slot keeps its
               last conversation); --cache-ram only with --llama-cache-ram
Per turn: time to first token (streaming), tokens generated, and the prompt tokens the server
says it reused (qevict: usage.prompt_tokens_details.cached_tokens; llama-server:
timings.cache_n when it reports it). Reported per system: TTFT p50 / p95 of the first turn
and of the follow-ups, aggregate generated tok/s over the run, reuse hit rate (follow-ups with
cached tokens > 0), conversations held warm (qevict: its sessions_in_memory gauge sampled every
second, max and mean; llama-server: its slots, each holding one conversation), the prompt
tokens the server prefilled, and peak RSS (VmHWM). Documents are cut to --doc-tokens by the
model's tokenizer (`qevict tokenize`).

Usage: multiturn_bench.py QEVICT LLAMA_SERVER MODEL [--convs 8] [--doc-tokens 6000] ...
Standard library only. A timing: run it with nothing else on the machine.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("qevict")
ap.add_argument("llama_server")
ap.add_argument("model")
ap.add_argument("--systems", default="qevict-0.2,qevict-full,llama-f16")
ap.add_argument("--convs", type=int, default=8)
ap.add_argument("--questions", type=int, default=4)
ap.add_argument("--doc-tokens", type=int, default=4000)
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--think", type=float, default=2.0)
ap.add_argument("--pool-mib", type=int, default=1024)
ap.add_argument("--ctx", type=int, default=5120,
                help="tokens a conversation may reach (qevict -c; llama-server's slot size)")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--llama-cache-ram", type=int, default=-1, help="MiB for llama-server --cache-ram (-1: not passed)")
ap.add_argument("--haystack", default="/usr/share/doc/jargon-text/jargon.txt.gz")
ap.add_argument("--out", default="")
args = ap.parse_args()

QUESTIONS = ["Summarise the document above in one sentence.",
             "Which term does the document define first?",
             "Name one person or program the document mentions.",
             "Quote one short phrase from the middle of the document.",
             "What is the document's last topic?",
             "Give the document a title."]


def log(*a):
    print("[multiturn]", *a, file=sys.stderr, flush=True)


def documents(n):
    """n different texts of --doc-tokens tokens (within 32), by the model's tokenizer."""
    return common.haystack_texts(args.qevict, args.model, args.haystack, n, args.doc_tokens,
                                 stride=104729)


def flash_attn_flag():
    """llama-server's flash-attention switch: `-fa on` where it takes a value, else `-fa`."""
    h = subprocess.run([args.llama_server, "--help"], capture_output=True, text=True).stdout
    return ["-fa", "on"] if re.search(r"--flash-attn\s+\[?on", h) else ["-fa"]


class Server:
    def __init__(self, system):
        self.system, self.port = system, common.free_port()
        pool = args.pool_mib << 20
        if system.startswith("llama"):
            tokens = pool // common.kv_bytes_per_token(args.model)  # the whole pool, in f16
            self.slots = max(1, tokens // args.ctx)
            cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "--port",
                   str(self.port), "-c", str(tokens), "-np", str(self.slots), *flash_attn_flag(),
                   "--metrics", "--no-webui", "--threads-http", "64"]
            if args.llama_cache_ram >= 0:
                cmd += ["--cache-ram", str(args.llama_cache_ram)]
        else:
            self.slots = None
            cmd = [args.qevict, "serve", "-m", args.model, "-t", str(args.threads), "--port",
                   str(self.port), "-c", str(args.ctx), "--kv-pool-bytes", str(pool),
                   "--parallel", "64", "--http-threads", "64"]
            if system == "qevict-0.2":
                cmd += ["--kv-policy", "qevict", "--kv-budget", "0.2"]
        self.cmd = cmd
        self.sp = common.ServerProc(cmd, self.port, system)
        self.proc = self.sp.proc
        self.warm, self._stop = [], threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        """Conversations held warm, once a second (qevict's gauge; llama-server: its slots)."""
        while not self._stop.wait(1.0):
            if self.slots is not None:
                self.warm.append(self.slots)
                continue
            try:
                v = common.metric(common.get(self.port, "/metrics", timeout=5)[1],
                                  "qevict_sessions_in_memory")
            except OSError:
                v = None
            if v is not None:
                self.warm.append(v)

    def stop(self):
        self._stop.set()
        self.sp.stop()


def chat_turn(port, messages, sid):
    body = {"model": "m", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json", "X-Session-Id": sid})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text, n_tok, cached, prompt_tokens = None, "", 0, None, None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        for ch in ev.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.time() - t0
                text += piece
                n_tok += 1
        u = ev.get("usage")
        if u:
            prompt_tokens = u.get("prompt_tokens")
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
        t = ev.get("timings")  # llama-server
        if t and "cache_n" in t:
            cached = t["cache_n"]
            if prompt_tokens is None and "prompt_n" in t:
                prompt_tokens = t["prompt_n"] + t["cache_n"]
    c.close()
    return {"ttft": ttft if ttft is not None else time.time() - t0, "seconds": time.time() - t0,
            "text": text, "chunks": n_tok, "cached": cached, "prompt_tokens": prompt_tokens}


def conversation(port, i, doc, out):
    msgs = [{"role": "user", "content": doc + "\n\n" + QUESTIONS[0]}]
    sid = f"bench-{i}"
    for turn in range(args.questions + 1):
        if turn > 0:
            time.sleep(args.think)
            msgs.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        try:
            r = chat_turn(port, msgs, sid)
        except Exception as e:  # noqa: BLE001 — recorded, the run goes on
            out.append({"conv": i, "turn": turn, "error": str(e)})
            return
        r.update({"conv": i, "turn": turn})
        out.append(r)
        msgs.append({"role": "assistant", "content": r["text"]})


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else None


def run(system, docs):
    srv = Server(system)
    log(system, " ".join(srv.cmd))
    res = []
    t0 = time.time()
    ths = [threading.Thread(target=conversation, args=(srv.port, i, d, res)) for i, d in enumerate(docs)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.time() - t0
    metrics = ""
    try:
        metrics = common.get(srv.port, "/metrics", timeout=30)[1]
    except OSError:
        pass
    peak = common.rss_mib(srv.proc.pid, "VmHWM")
    srv.stop()
    ok = [r for r in res if "error" not in r]
    first = [r["ttft"] for r in ok if r["turn"] == 0]
    follow = [r["ttft"] for r in ok if r["turn"] > 0]
    hits = [r for r in ok if r["turn"] > 0 and (r["cached"] or 0) > 0]
    gen = sum(r["chunks"] for r in ok)
    prompt = sum(r["prompt_tokens"] or 0 for r in ok)
    reused = sum(r["cached"] or 0 for r in ok)
    evaluated = common.metric(metrics, "llamacpp:prompt_tokens_total")
    if evaluated is not None and not any(r["cached"] for r in ok):
        # llama-server streams without cache_n: what it prefilled is its own counter's.
        reused = max(0, prompt - int(evaluated))
    row = {"system": system, "cmd": srv.cmd, "slots": srv.slots, "wall_s": round(wall, 1),
           "turns_ok": len(ok), "turns_failed": len(res) - len(ok),
           "ttft_first_p50": pct(first, 50), "ttft_first_p95": pct(first, 95),
           "ttft_follow_p50": pct(follow, 50), "ttft_follow_p95": pct(follow, 95),
           "agg_tok_s": gen / wall if wall else None,
           "reuse_hit_rate": (len(hits) / max(1, len([r for r in ok if r["turn"] > 0]))
                              if any(r["cached"] is not None for r in ok) else None),
           "warm_max": max(srv.warm, default=None),
           "warm_mean": round(sum(srv.warm) / len(srv.warm), 2) if srv.warm else None,
           "prompt_tokens": prompt, "prompt_tokens_reused": reused,
           "peak_rss_mib": round(peak, 1),
           "sessions_metrics": {k: v for k, v in re.findall(r"^((?:qevict_session|llamacpp:prompt_tokens_total)\S*) ([0-9.eE+-]+)$", metrics, re.M)},
           "turns": res}
    log(system, json.dumps({k: v for k, v in row.items() if k not in ("turns", "cmd")}))
    return row


def main():
    docs = documents(args.convs)
    rows = [run(s, docs) for s in args.systems.split(",")]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args),
            "load_avg": os.getloadavg()}
    meta["qevict_version"] = subprocess.run([args.qevict, "--version"], capture_output=True,
                                            text=True).stdout.strip()
    md = ["| system | convs | turns ok / failed | TTFT turn 1 p50 / p95 s | TTFT follow-ups p50 / p95 s | aggregate tok/s | reuse hit rate | warm max / mean | prompt tokens prefilled / total | peak RSS MiB |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
    for r in rows:
        md.append(f"| {r['system']} | {args.convs} | {r['turns_ok']} / {r['turns_failed']} | "
                  f"{f(r['ttft_first_p50'])} / {f(r['ttft_first_p95'])} | "
                  f"{f(r['ttft_follow_p50'])} / {f(r['ttft_follow_p95'])} | {f(r['agg_tok_s'])} | "
                  f"{f(r['reuse_hit_rate'])} | {f(r['warm_max'])} / {f(r['warm_mean'])} | "
                  f"{r['prompt_tokens'] - r['prompt_tokens_reused']:,} / {r['prompt_tokens']:,} | "
                  f"{r['peak_rss_mib']:.0f} |")
    print("\n".join(md))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "multiturn.json"), "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
        with open(os.path.join(args.out, "multiturn.md"), "w") as fh:
            fh.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
