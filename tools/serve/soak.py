#!/usr/bin/env python3
"""Bounded soak of `qevict serve` (issue 12): loopback only, stops by itself.

Starts the server, then runs N concurrent clients for D seconds. Each client loops: a
streaming chat or completion request with a random prompt length (short to ~1,500 tokens),
a random KV policy and budget (full, qevict, h2o, streaming, snapkv), sometimes leaving in
the middle of the stream (a disconnect), sometimes sending a malformed request (bad JSON,
unknown field, wrong type, oversize body). It samples /metrics and the server's RSS once a
second and checks, at the end:
  - 0 server errors (5xx, broken streams, a server that died),
  - every well-formed request answered or refused with 429, every malformed one a 4xx,
  - KV bytes held never above the pool (the server's own max over every step),
  - RSS flat after warm-up (the last third's max within 10 % + 32 MiB of the middle third's).
Writes a JSON summary (and prints it).

Usage: soak.py QEVICT MODEL [--clients 64] [--seconds 600] [--pool 256M] [--out FILE]
"""
import argparse
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("qevict")
ap.add_argument("model")
ap.add_argument("--clients", type=int, default=64)
ap.add_argument("--seconds", type=float, default=600)
ap.add_argument("--pool", default="256M")
ap.add_argument("--parallel", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--out", default="")
args = ap.parse_args()

WORDS = ("the river ran past a quiet town where people kept small gardens and talked about "
         "weather trains letters and the long winter that had come early this year").split()
POLICIES = [("full", None), ("qevict", 0.5), ("qevict", 0.3), ("h2o", 0.5), ("streaming", 0.5),
            ("snapkv", 0.4)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
server = subprocess.Popen([args.qevict, "serve", "-m", args.model, "-t", str(args.threads),
                           "--port", str(port), "--kv-pool-bytes", args.pool, "-c", "4096",
                           "--parallel", str(args.parallel), "--max-queue", "32",
                           "--max-body-bytes", "262144", "--http-threads", str(args.clients + 16)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
base = f"http://127.0.0.1:{port}"
for _ in range(300):
    try:
        urllib.request.urlopen(base + "/health", timeout=1).read()
        break
    except Exception:
        if server.poll() is not None:
            sys.exit("server exited: " + server.stderr.read())
        time.sleep(0.1)

lock = threading.Lock()
stats = {"ok": 0, "refused_429": 0, "disconnected": 0, "malformed_4xx": 0, "server_errors": 0,
         "unexpected": [], "tokens": 0}


def bump(key, n=1):
    with lock:
        stats[key] += n


def unexpected(what):
    with lock:
        stats["server_errors"] += 1
        if len(stats["unexpected"]) < 20:
            stats["unexpected"].append(what)


def post(path, body, stream_cut=None):
    """Returns (status, n_events). stream_cut: leave after that many events."""
    req = urllib.request.Request(base + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, 0
    n = 0
    done = False
    with r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                return 500, n
            n += 1
            if stream_cut is not None and n >= stream_cut:
                return -1, n  # we left
    return (200 if done else 599), n


def client(seed, deadline):
    rng = random.Random(seed)
    while time.time() < deadline:
        kind = rng.random()
        if kind < 0.08:  # malformed
            body = rng.choice([b"{not json", b'{"prompt": 5}', b'{"prompt": "x", "bogus": 1}',
                               b'{"messages": "hi"}', b'{"prompt": "' + b"y" * 300000 + b'"}'])
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            status, _ = post(path, body)
            if 400 <= status < 500:
                bump("malformed_4xx")
            else:
                unexpected(f"malformed request got {status}")
            continue
        n_words = int(rng.choice([20, 60, 200, 600, 1100]) * rng.uniform(0.5, 1.0))
        text = " ".join(rng.choice(WORDS) for _ in range(n_words))
        policy, budget = rng.choice(POLICIES)
        body = {"max_tokens": rng.randint(4, 64), "temperature": 0.7, "stream": True,
                "kv_policy": policy}
        if budget:
            body["kv_budget"] = budget
        if rng.random() < 0.5:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": text}]
        else:
            path = "/v1/completions"
            body["prompt"] = text
        cut = rng.randint(1, 6) if rng.random() < 0.15 else None
        try:
            status, n = post(path, json.dumps(body).encode(), cut)
        except Exception as e:  # connection reset etc.
            unexpected(f"{type(e).__name__}: {e}")
            continue
        bump("tokens", n)
        if status == 200:
            bump("ok")
        elif status == -1:
            bump("disconnected")
        elif status == 429:
            bump("refused_429")
            time.sleep(0.5)
        elif status == 400:
            # A well-formed request the server cannot take (e.g. a budget below the policy's
            # fixed regions for a short prompt) is a clear 4xx, not an error of the server.
            bump("malformed_4xx")
        else:
            unexpected(f"{path} {policy} got {status}")


def metrics():
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(qevict_\w+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


t0 = time.time()
deadline = t0 + args.seconds
threads = [threading.Thread(target=client, args=(i, deadline), daemon=True)
           for i in range(args.clients)]
for t in threads:
    t.start()
samples = []
while time.time() < deadline:
    time.sleep(1.0)
    if server.poll() is not None:
        unexpected("the server died")
        break
    m = metrics()
    samples.append({"t": round(time.time() - t0, 1), "rss_kib": rss_kib(server.pid),
                    "held": m.get("qevict_kv_held_bytes", 0),
                    "reserved": m.get("qevict_kv_reserved_bytes", 0),
                    "active": m.get("qevict_active_sequences", 0),
                    "queue": m.get("qevict_queue_depth", 0)})
    if len(samples) % 30 == 0:
        s = samples[-1]
        print(f"[{s['t']:6.0f} s] active {s['active']:.0f} queue {s['queue']:.0f} "
              f"held {s['held']/2**20:.1f} MiB rss {s['rss_kib']/1024:.0f} MiB  {stats['ok']} ok "
              f"{stats['refused_429']} 429 {stats['disconnected']} left "
              f"{stats['malformed_4xx']} 4xx {stats['server_errors']} errors", flush=True)
for t in threads:
    t.join(timeout=660)
final = metrics() if server.poll() is None else {}
alive = server.poll() is None
server.terminate()
server.wait(timeout=30)

third = max(1, len(samples) // 3)
mid = max(s["rss_kib"] for s in samples[third:2 * third]) if len(samples) >= 3 else 0
last = max(s["rss_kib"] for s in samples[2 * third:]) if len(samples) >= 3 else 0
pool = final.get("qevict_kv_pool_bytes", 0)
summary = {
    "clients": args.clients, "seconds": args.seconds, "pool_bytes": pool,
    **{k: v for k, v in stats.items()},
    "server_alive_at_end": alive,
    "requests_total": final.get("qevict_requests_total"),
    "generated_tokens_total": final.get("qevict_generated_tokens_total"),
    "kv_held_max_bytes": final.get("qevict_kv_held_max_bytes"),
    "rss_mid_third_max_mib": round(mid / 1024, 1), "rss_last_third_max_mib": round(last / 1024, 1),
    "samples": samples,
}
checks = {
    "no server errors": stats["server_errors"] == 0 and alive,
    "held never above the pool": 0 < pool and final.get("qevict_kv_held_max_bytes", 1e30) <= pool,
    "rss flat after warm-up": last <= mid * 1.10 + 32 * 1024,
}
summary["checks"] = checks
if args.out:
    with open(args.out + ".tmp", "w") as f:
        json.dump(summary, f, indent=1)
    import os
    os.replace(args.out + ".tmp", args.out)
print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1))
sys.exit(0 if all(checks.values()) else 1)
