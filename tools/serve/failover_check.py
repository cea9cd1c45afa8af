#!/usr/bin/env python3
"""Issue 50 item 6: a conversation survives the loss of its replica.

Starts tools/serve/replicas.sh (nginx in front of two `qevict serve` replicas sharing a
--session-dir), holds one conversation through nginx with an X-Session-Id header (a document,
then questions), kills the replica that served it (kill -9) and asks the next question: nginx
must route it to the other replica, which restores the conversation from the shared directory,
so the turn succeeds and reports its earlier tokens as cached.

Usage: failover_check.py [--model M.gguf] [--out DIR] [-- extra serve flags]   (exit 0: pass)
Needs only the standard library, nginx and build/tools/qevict.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools/serve/replicas.sh")


def chat(url, sid, messages, max_tokens=24):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json",
                                          "X-Session-Id": sid})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        data = json.loads(r.read())
        upstream = r.headers.get("X-Qevict-Upstream", "")
    usage = data.get("usage", {})
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"text": data["choices"][0]["message"]["content"], "upstream": upstream,
            "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
            "seconds": round(time.time() - t0, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("serve_flags", nargs="*")
    a = ap.parse_args()
    doc = open(os.path.join(ROOT, "tests/golden/english_gpl3.txt")).read()[:6000]
    start = [SCRIPT, "start"] + ([a.model] if a.model else []) + (["--"] + a.serve_flags
                                                                   if a.serve_flags else [])
    url = subprocess.check_output(start, text=True).strip().splitlines()[-1]
    sid = "conv-%d" % os.getpid()
    turns, ok = [], True
    try:
        msgs = [{"role": "user", "content": doc + "\n\nWhat licence is this text?"}]
        questions = ["Who may copy it?", "Name one freedom it protects.", "Answer in one word: is it free?"]
        for i, q in enumerate([None] + questions):
            if q is not None:
                msgs.append({"role": "user", "content": q})
            if i == 2:  # kill the replica that holds the conversation, as a crash would
                port = turns[-1]["upstream"].rsplit(":", 1)[-1]
                n = "1" if port == "8091" else "2"
                subprocess.check_call([SCRIPT, "kill", n])
                turns.append({"event": "killed replica %s (port %s)" % (n, port)})
            t = chat(url, sid, msgs)
            t["turn"] = i + 1
            turns.append(t)
            msgs.append({"role": "assistant", "content": t["text"]})
            print(json.dumps(t), flush=True)
        served = [t for t in turns if "turn" in t]
        before, after = served[1], served[2]
        checks = {
            "turn 2 reused turn 1 (cached_tokens > 0)": before["cached_tokens"] > 0,
            "turn 3 went to the other replica": after["upstream"] != before["upstream"],
            "turn 3 restored the conversation from disk (cached_tokens > 0)": after["cached_tokens"] > 0,
            "turn 4 reused turn 3 on the new replica": served[3]["cached_tokens"] > 0,
        }
        for k, v in checks.items():
            print(("PASS " if v else "FAIL ") + k)
            ok &= v
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "failover.json"), "w") as f:
                json.dump({"turns": turns, "checks": checks}, f, indent=1)
    finally:
        subprocess.call([SCRIPT, "stop"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
