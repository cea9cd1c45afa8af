#!/usr/bin/env python3
"""End-to-end test of `qevict serve` with the official openai client (issue 12).

Starts the server on a free loopback port (twice: a roomy one, and a tiny one whose queue
fills), then checks: /v1/models; chat and completions, streaming and not (greedy: the
streamed text equals the whole answer); the completion equals `qevict generate` on the same
prompt token for token (the CLI's result reproduced); per-request kv_policy / kv_budget;
OpenAI-shaped 4xx errors (unknown field, bad types, bad policy, over-long prompt, malformed
JSON, oversize body, wrong API key); 429 with Retry-After when the queue is full; a client
that leaves mid-stream frees its sequence (the pool's held bytes return to zero); /metrics;
a second chat turn's cached_tokens, and a conversation named by `user` resumed by a second
server process from a shared --session-dir.

Usage: client_test.py QEVICT_BINARY MODEL.gguf      (exit 0: pass)
"""
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import openai

QEVICT, MODEL = sys.argv[1], sys.argv[2]
KEY = "test-key"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*extra):
    port = free_port()
    p = subprocess.Popen([QEVICT, "serve", "-m", MODEL, "-t", "2", "--port", str(port),
                          "--api-key", KEY, *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return p, port
        except Exception:
            if p.poll() is not None:
                sys.exit("server exited: " + p.stderr.read())
            time.sleep(0.1)
    sys.exit("server did not come up")


def raw(port, path, body, key=KEY, content_type="application/json"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def metrics(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": f"Bearer {KEY}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(qevict_\w+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def is_openai_error(body):
    try:
        e = json.loads(body)["error"]
        return isinstance(e["message"], str) and e["message"] and "type" in e
    except Exception:
        return False


server, port = start("--kv-pool-bytes", "256M", "-c", "2048", "--max-body-bytes", "65536")
try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)

    models = client.models.list()
    check(len(models.data) == 1 and models.data[0].id.endswith(".gguf"), "/v1/models lists the model")

    msgs = [{"role": "user", "content": "Name three colors of the rainbow."}]
    chat = client.chat.completions.create(model="anything", messages=msgs, max_tokens=24,
                                          temperature=0)
    text = chat.choices[0].message.content
    check(bool(text) and chat.choices[0].finish_reason in ("stop", "length"),
          f"chat completion answers ({text!r})")
    check(chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 24, "chat usage")
    check(chat.model == "anything", "the request's model name is echoed")

    stream = client.chat.completions.create(model="m", messages=msgs, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            if c.delta and c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("".join(pieces) == text, "streamed chat text equals the whole answer (greedy)")
    check(finish == chat.choices[0].finish_reason, "streamed finish reason")
    check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens,
          "stream_options.include_usage gives the usage")

    prompt = "The three primary colors are"
    comp = client.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0)
    cli = subprocess.run([QEVICT, "generate", "-m", MODEL, "-t", "2", "-p", prompt, "-n", "16",
                          "--temp", "0"], capture_output=True, text=True, check=True)
    t = comp.choices[0].text  # generate echoes the prompt, then the text and a newline
    check(cli.stdout in (prompt + t, prompt + t + "\n"),
          f"/v1/completions reproduces `qevict generate` ({t!r} vs {cli.stdout!r})")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt=prompt, max_tokens=16, temperature=0, stream=True) if c.choices)
    check(streamed == comp.choices[0].text, "streamed completion equals the whole completion")

    stop = client.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0,
                                     stop=[comp.choices[0].text.strip().split()[1]])
    check(stop.choices[0].finish_reason == "stop" and
          len(stop.choices[0].text) < len(comp.choices[0].text), "stop strings cut the text")

    # ignore_eos (llama-server's extension): exactly max_tokens tokens, end-of-text or not.
    short = client.chat.completions.create(model="m", messages=msgs, max_tokens=200,
                                           temperature=0)
    forced = client.chat.completions.create(model="m", messages=msgs, max_tokens=200,
                                            temperature=0, extra_body={"ignore_eos": True})
    check(short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 200 and
          forced.usage.completion_tokens == 200 and forced.choices[0].finish_reason == "length",
          f"ignore_eos generates through the end of text ({short.usage.completion_tokens} vs "
          f"{forced.usage.completion_tokens} tokens)")

    long_prompt = "Remember: the code word is teal. " + "The sky was grey. " * 60 + "The code word is"
    # (SnapKV's budget also holds its 32 observation queries per layer: a short context needs a
    # large fraction.)
    for policy, budget in (("h2o", 0.5), ("streaming", 0.5), ("qevict", 0.6), ("snapkv", 0.9)):
        r = client.completions.create(model="m", prompt=long_prompt, max_tokens=8, temperature=0,
                                      extra_body={"kv_policy": policy, "kv_budget": budget})
        check(r.usage.completion_tokens > 0, f"kv_policy={policy} kv_budget={budget} answers "
                                             f"({r.choices[0].text!r})")

    def bad_request(what, **kw):
        try:
            client.chat.completions.create(model="m", messages=msgs, max_tokens=4, **kw)
            check(False, what)
        except openai.BadRequestError as e:
            check(e.status_code == 400 and isinstance(e.body, dict) and e.body.get("message"),
                  f"{what}: 400 ({e.body.get('message') if isinstance(e.body, dict) else e.body})")

    bad_request("unknown field", extra_body={"frobnicate": 1})
    bad_request("wrong type", extra_body={"max_tokens": "ten"})
    bad_request("unknown kv_policy", extra_body={"kv_policy": "nope"})
    bad_request("kvquant on a server not started with it (its calibration runs the model)",
                extra_body={"kv_policy": "kvquant"})
    bad_request("kv_budget out of range", extra_body={"kv_budget": 3})
    bad_request("ignore_eos not a boolean", extra_body={"ignore_eos": 1})
    bad_request("include_usage not a boolean", extra_body={"stream_options": {"include_usage": 1}})
    bad_request("prompt + max_tokens over the context", extra_body={"max_tokens": 100000})
    status, _, body = raw(port, "/v1/chat/completions",
                          b'{"messages": [{"role": "user", "content": [{"type": 1}]}]}')
    check(status == 400 and is_openai_error(body), f"a content part of the wrong type: 400 ({status})")
    status, _, body = raw(port, "/v1/chat/completions", b"{not json")
    check(status == 400 and is_openai_error(body), "malformed JSON: 400 in OpenAI's shape")
    status, _, body = raw(port, "/v1/completions", b'{"prompt": "' + b"x" * 70000 + b'"}')
    check(status == 413 and is_openai_error(body), f"oversize body: 413 ({status})")
    status, _, body = raw(port, "/v1/completions", b'{"prompt": "hi"}', key="wrong")
    check(status == 401 and is_openai_error(body), "wrong API key: 401")
    status, _, body = raw(port, "/v1/nothing", b"{}")
    check(status == 404 and is_openai_error(body), "unknown endpoint: 404")

    # A client that leaves mid-stream: its sequence is dropped and its bytes freed.
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", method="POST",
        data=json.dumps({"prompt": prompt, "max_tokens": 400, "temperature": 0,
                         "stream": True}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=30)
    r.readline()
    r.close()
    for _ in range(100):
        m = metrics(port)
        if m.get("qevict_requests_cancelled_total", 0) >= 1 and m.get("qevict_active_sequences") == 0:
            break
        time.sleep(0.1)
    check(m.get("qevict_requests_cancelled_total", 0) >= 1, "a client leaving cancels its request")
    check(m.get("qevict_kv_reserved_bytes") == 0, "its reservation is given back")
    check(m.get("qevict_requests_finished_total", 0) >= 8,
          "answered requests, streamed ones included, count as finished")
    check(m.get("qevict_generated_tokens_total", 0) > 50 and
          m.get("qevict_kv_held_max_bytes", 0) <= m.get("qevict_kv_pool_bytes", 0),
          "metrics: tokens counted, bytes held never above the pool")
    check(server.poll() is None, "the server is still serving")
finally:
    server.terminate()
    server.wait(timeout=30)

# Conversation reuse (issue 50 item 2): a second turn reports the prompt tokens it reused in
# usage.prompt_tokens_details.cached_tokens; a conversation named by `user` is written to
# --session-dir and resumed by another server process sharing the directory (a failover).
session_dir = tempfile.mkdtemp(prefix="qevict-serve-sessions-")
story = ("I keep a small garden. In spring I plant tomatoes, beans and basil; in summer the "
         "beans climb the fence and the basil flowers if I forget to pick it. ") * 6
turn1 = [{"role": "user", "content": story + "What do I plant in spring?"}]
server, port = start("--kv-pool-bytes", "256M", "-c", "2048", "--session-dir", session_dir)
try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    r1 = client.chat.completions.create(model="m", messages=turn1, max_tokens=16, temperature=0,
                                        user="py-conv")
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "And what climbs the fence?"}]
    r2 = client.chat.completions.create(model="m", messages=turn2, max_tokens=16, temperature=0,
                                        user="py-conv")
    c1 = r1.usage.prompt_tokens_details.cached_tokens
    c2 = r2.usage.prompt_tokens_details.cached_tokens
    check(c1 == 0 and r1.usage.prompt_tokens <= c2 < r2.usage.prompt_tokens,
          f"a second turn reuses the first: cached_tokens {c1} then {c2} of "
          f"{r2.usage.prompt_tokens}")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/slots",
                                 headers={"Authorization": f"Bearer {KEY}"})
    slots = json.loads(urllib.request.urlopen(req, timeout=10).read())
    check(any(s["id"] == "py-conv" and s["state"] == "idle" for s in slots),
          f"GET /slots lists the named conversation ({slots})")
    check(os.path.exists(os.path.join(session_dir, "py-conv.qvs")),
          "the named conversation is written to --session-dir")
finally:
    server.terminate()
    server.wait(timeout=30)
server, port = start("--kv-pool-bytes", "256M", "-c", "2048", "--session-dir", session_dir)
try:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    r2b = client.chat.completions.create(model="m", messages=turn2, max_tokens=16, temperature=0,
                                         user="py-conv")
    c = r2b.usage.prompt_tokens_details.cached_tokens
    check(c >= r1.usage.prompt_tokens and r2b.usage.completion_tokens > 0,
          f"another server resumes the named conversation from the directory (cached {c})")
    m = metrics(port)
    check(m.get("qevict_sessions_restored_total") == 1 and
          m.get("qevict_session_hits_total") == 1, "metrics: one restore, one hit")
finally:
    server.terminate()
    server.wait(timeout=30)
    shutil.rmtree(session_dir, ignore_errors=True)

# A small server: one sequence at a time, one waiting; the rest get 429 with Retry-After.
server, port = start("--kv-pool-bytes", "64M", "--parallel", "1", "--max-queue", "1")
try:
    body = json.dumps({"prompt": "Count: one, two,", "max_tokens": 48, "temperature": 0}).encode()
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda _: raw(port, "/v1/completions", body), range(6)))
    codes = sorted(r[0] for r in results)
    check(codes.count(200) >= 1 and codes.count(429) >= 1 and set(codes) <= {200, 429},
          f"queue full: answered or 429 ({codes})")
    check(all(r[1].get("Retry-After") == "1" and is_openai_error(r[2])
              for r in results if r[0] == 429), "429 carries Retry-After and OpenAI's error shape")
    status, _, body = raw(port, "/v1/completions",
                          json.dumps({"prompt": "hi " * 1000, "max_tokens": 4000}).encode())
    check(status == 400 and is_openai_error(body), "a request larger than the whole pool: 400")
finally:
    server.terminate()
    server.wait(timeout=30)

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
