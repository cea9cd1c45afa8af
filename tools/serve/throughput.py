#!/usr/bin/env python3
"""Throughput at equal memory (issue 12): `qevict serve` against native `llama-server`, one run.

Every server gets the same KV memory (--pool-mib, default 1536 MiB) for sessions of 8K-token
contexts (--ctx): llama-server as `-c SLOTS*CTX -np SLOTS` with f16 K/V and flash attention,
SLOTS = how many whole f16 contexts fit the memory; qevict as `--kv-pool-bytes POOL -c CTX`,
FullKV and qevict at 20 % (--budget), its scheduler admitting what fits by reservation.
For each server and each stream count N (--streams 1,8,32), a fresh server process gets N
concurrent streaming /v1/completions requests, each a different ~6K-token text (--prompt-tokens,
slices of the Jargon File, the eval's haystack) with ignore_eos and room to generate to the
end of the context. The clock starts (T0) when every request the server is processing has
received its first token, i.e. every admitted session is decoding (the server's own gauge:
qevict_active_sequences / llamacpp:requests_processing); tokens received in the next
--window seconds give the aggregate decode tok/s; then every client disconnects.
Also reported: sessions decoding at once, requests left waiting, time to T0 (prefill of the
admitted prompts), peak RSS of the server process.

Usage: throughput.py QEVICT LLAMA_SERVER MODEL [--out FILE] [--threads 2] ...
Needs no package beyond the standard library. Run on a quiet machine: it is a timing.
"""
import argparse
import json
import os
import socket
import sys
import threading
import time
import http.client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("qevict")
ap.add_argument("llama_server")
ap.add_argument("model")
ap.add_argument("--pool-mib", type=int, default=1536, help="KV memory every server gets")
ap.add_argument("--ctx", type=int, default=8192, help="tokens per session")
ap.add_argument("--prompt-tokens", type=int, default=6144)
ap.add_argument("--streams", default="1,8,32")
ap.add_argument("--budget", type=float, default=0.2)
ap.add_argument("--window", type=float, default=20.0, help="seconds of decode measured")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--systems", default="llama-f16,qevict-full,qevict",
                help="comma-separated: llama-f16, llama-q4_0, qevict-full, qevict")
ap.add_argument("--cases", default="",
                help="comma-separated SYSTEM:N pairs to run instead of every system at every "
                     "stream count (e.g. llama-f16:8,qevict:32)")
ap.add_argument("--kv-bytes-per-token", type=int, default=0,
                help="f16 K+V bytes per token, all layers (default: from the GGUF via qevict)")
ap.add_argument("--haystack", default="/usr/share/doc/jargon-text/jargon.txt.gz")
ap.add_argument("--out", default="")
args = ap.parse_args()
streams = [int(x) for x in args.streams.split(",")]


def log(*a):
    print("[throughput]", *a, file=sys.stderr, flush=True)


def kv_bytes_per_token():
    """f16 K and V bytes of one token over every layer, from the model's metadata."""
    return args.kv_bytes_per_token or common.kv_bytes_per_token(args.model)


def prompts(n):
    """n different texts of --prompt-tokens tokens (at most, within 32), cut by the model's
    tokenizer through `qevict tokenize`."""
    return common.haystack_texts(args.qevict, args.model, args.haystack, n, args.prompt_tokens)


class Server:
    def __init__(self, system, slots_f16):
        self.system = system
        self.port = common.free_port()
        pool = args.pool_mib * 1024 * 1024
        if system.startswith("llama"):
            ctk = "f16" if system == "llama-f16" else "q4_0"
            self.slots = slots_f16 if ctk == "f16" else slots_f16 * 3  # q4_0: 4.5 of 16 bits
            cmd = [args.llama_server, "-m", args.model, "-t", str(args.threads), "--port",
                   str(self.port), "-c", str(self.slots * args.ctx), "-np", str(self.slots),
                   "-fa", "-ctk", ctk, "-ctv", ctk, "--metrics", "--no-webui", "-b", "2048",
                   "-ub", "512", "--threads-http", "80"]  # a thread per client + /metrics
            self.gauge = "llamacpp:requests_processing"
            self.health = "/health"
        else:
            cmd = [args.qevict, "serve", "-m", args.model, "-t", str(args.threads), "--port",
                   str(self.port), "-c", str(args.ctx), "--kv-pool-bytes", str(pool),
                   "--parallel", "64", "--max-queue", "64", "--http-threads", "80"]
            if system == "qevict":
                cmd += ["--kv-policy", "qevict", "--kv-budget", str(args.budget)]
            self.slots = None
            self.gauge = "qevict_active_sequences"
            self.health = "/health"
        self.cmd = cmd
        self.sp = common.ServerProc(cmd, self.port, system, self.health, wait_s=120)
        self.proc = self.sp.proc
        # Warm-up: one short request.
        req = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        c.request("POST", "/v1/completions", json.dumps(req), {"Content-Type": "application/json"})
        c.getresponse().read()
        c.close()

    def processing(self):
        # llama-server answers /metrics from its main loop, which a long prefill batch holds
        # for seconds: a late answer is no answer (polled again).
        try:
            st, body = common.get(self.port, "/metrics")
        except OSError:
            return None
        return common.metric(body, self.gauge) if st == 200 else None

    def stop(self):
        self.sp.stop()


class Stream(threading.Thread):
    def __init__(self, port, prompt, stop_ev):
        super().__init__(daemon=True)
        self.port, self.prompt, self.stop_ev = port, prompt, stop_ev
        self.times = []  # arrival time of every token chunk
        self.error = None
        self.finished = False
        self.conn = None

    def leave(self):
        """Disconnects now, also a request still waiting for a slot (it would otherwise be
        admitted, prefilled and only then notice the stop)."""
        c = self.conn
        if c is not None and c.sock is not None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self):
        body = {"prompt": self.prompt, "max_tokens": args.ctx - args.prompt_tokens - 64,
                "temperature": 0, "stream": True, "ignore_eos": True}
        try:
            c = self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
            c.request("POST", "/v1/completions", json.dumps(body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                self.error = f"HTTP {r.status}: {r.read()[:200]!r}"
                return
            while not self.stop_ev.is_set():
                line = r.fp.readline()
                if not line:
                    self.finished = True
                    break
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                j = json.loads(line[6:])
                ch = j.get("choices") or []
                if ch and ch[0].get("text") is not None and ch[0].get("finish_reason") is None:
                    self.times.append(time.monotonic())
            c.sock.shutdown(socket.SHUT_RDWR)  # leave: the server cancels the request
            c.close()
        except Exception as e:  # noqa: BLE001 - reported in the results
            if not self.stop_ev.is_set():  # after the stop, leave() closed the socket
                self.error = repr(e)


def run_case(system, n, texts, slots_f16):
    srv = Server(system, slots_f16)
    try:
        stop_ev = threading.Event()
        ss = [Stream(srv.port, texts[i], stop_ev) for i in range(n)]
        t_start = time.monotonic()
        for s in ss:
            s.start()
        peak_rss = common.rss_mib(srv.proc.pid)
        t0 = None
        while t0 is None:
            time.sleep(0.1)
            peak_rss = max(peak_rss, common.rss_mib(srv.proc.pid))
            decoding = sum(1 for s in ss if s.times)
            busy = srv.processing()
            errs = [s.error for s in ss if s.error]
            if errs:
                raise RuntimeError(f"{system} N={n}: {errs[0]}")
            if decoding > 0 and busy is not None and decoding >= busy and \
                    time.monotonic() - t_start > 1.0:
                t0 = time.monotonic()
                at_once = decoding
            if time.monotonic() - t_start > 3600:
                raise RuntimeError(f"{system} N={n}: no steady state after an hour")
        while time.monotonic() < t0 + args.window:
            time.sleep(0.2)
            peak_rss = max(peak_rss, common.rss_mib(srv.proc.pid))
        t1 = time.monotonic()
        tokens = sum(sum(1 for t in s.times if t0 <= t < t1) for s in ss)
        active_in_window = sum(1 for s in ss if any(t0 <= t < t1 for t in s.times))
        stop_ev.set()
        for s in ss:
            s.leave()
        for s in ss:
            s.join(timeout=30)
        res = {"system": system, "streams": n, "decoding_at_once": at_once,
               "active_in_window": active_in_window, "waiting": n - at_once,
               "seconds_to_steady": round(t0 - t_start, 2), "window_s": round(t1 - t0, 2),
               "tokens_in_window": tokens, "decode_tok_s": round(tokens / (t1 - t0), 2),
               "per_stream_tok_s": round(tokens / (t1 - t0) / max(1, active_in_window), 2),
               "peak_rss_mib": round(peak_rss, 1), "command": " ".join(srv.cmd)}
        if srv.slots is not None:
            res["slots"] = srv.slots
        log(json.dumps({k: v for k, v in res.items() if k != "command"}))
        return res
    finally:
        srv.stop()


def main():
    per_tok = kv_bytes_per_token()
    pool = args.pool_mib * 1024 * 1024
    slots_f16 = pool // (per_tok * args.ctx)
    log(f"f16 KV {per_tok} B/token; {args.ctx}-token sessions: {slots_f16} fit "
        f"{args.pool_mib} MiB in f16")
    if args.cases:
        cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    else:  # alternating servers within each stream count
        cases = [(system, n) for n in streams for system in args.systems.split(",")]
    texts = prompts(max(n for _, n in cases))
    results = []
    for system, n in cases:
        results.append(run_case(system, n, texts, slots_f16))
    out = {"model": os.path.basename(args.model), "pool_mib": args.pool_mib, "ctx": args.ctx,
           "prompt_tokens": args.prompt_tokens, "budget": args.budget,
           "kv_bytes_per_token_f16": per_tok, "threads": args.threads, "window_s": args.window,
           "results": results}
    s = json.dumps(out, indent=1)
    print(s)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(s + "\n")


main()
