"""Helpers shared by the serving benchmarks (throughput.py, multiturn_bench.py): a server
process started and waited for, HTTP GETs, Prometheus gauges, RSS, the f16 KV bytes per token
read from a GGUF header, and haystack texts cut to a token count by the model's tokenizer.
Standard library only."""
import gzip
import http.client
import json
import re
import socket
import struct
import subprocess
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read().decode("utf-8", "replace")
    c.close()
    return r.status, body


def metric(text, name):
    """A gauge or counter of a Prometheus text page (the first sample of that name)."""
    m = re.search(r"^" + re.escape(name) + r"(?:\{[^}]*\})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def rss_mib(pid, field="VmRSS"):
    """VmRSS (now) or VmHWM (the peak) of a process in MiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def gguf_metadata(path):
    """The key/value metadata of a GGUF file's header (arrays of scalars are skipped)."""
    keys = {}
    with open(path, "rb") as f:
        magic, _version, _n_tensors, n_kv = struct.unpack("<IIQQ", f.read(24))
        if magic != 0x46554747:
            raise ValueError(f"{path}: not a GGUF file")

        def rstr():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                 12: "d"}

        def rval(t):
            if t == 8:
                return rstr()
            if t == 9:
                (et,) = struct.unpack("<I", f.read(4))
                (n,) = struct.unpack("<Q", f.read(8))
                if et in sizes:
                    f.seek(struct.calcsize("<" + sizes[et]) * n, 1)
                    return None
                return [rval(et) for _ in range(n)]
            fmt = "<" + sizes[t]
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        for _ in range(n_kv):
            k = rstr()
            (t,) = struct.unpack("<I", f.read(4))
            keys[k] = rval(t)
    return keys


def kv_bytes_per_token(model):
    """f16 K and V bytes of one token over every layer, from the model's metadata."""
    keys = gguf_metadata(model)
    arch = keys["general.architecture"]
    n_head = keys[f"{arch}.attention.head_count"]
    n_kv = keys.get(f"{arch}.attention.head_count_kv", n_head)
    d = keys.get(f"{arch}.attention.key_length", keys[f"{arch}.embedding_length"] // n_head)
    return 2 * keys[f"{arch}.block_count"] * n_kv * d * 2


def haystack_texts(qevict, model, haystack, n, tokens, stride=7919 * 13, label="Document"):
    """n different slices of a (gzipped) text, "LABEL i: ..." each, cut to at most `tokens`
    tokens (within 32) by the model's tokenizer through `qevict tokenize`."""
    text = re.sub(r"\s+", " ", gzip.open(haystack, "rt", errors="replace").read())
    chars = tokens * 10  # more than enough text, then trimmed

    def count(s):
        ids = subprocess.run([qevict, "tokenize", "-m", model, "-p", s, "--ids"],
                             capture_output=True, text=True, check=True).stdout
        return len(json.loads(ids))

    out = []
    for i in range(n):
        start = (i * stride) % max(1, len(text) - chars - 1)
        base = f"{label} {i}: " + text[start:start + chars]
        lo, hi = 0, len(base)  # bisect the cut: the longest prefix within the token count
        while hi - lo > 16:
            mid = (lo + hi) // 2
            if count(base[:mid]) <= tokens:
                lo = mid
            else:
                hi = mid
        s = base[:lo]
        n_ids = count(s)
        if not tokens - 32 <= n_ids <= tokens:
            raise RuntimeError(f"text {i}: {n_ids} tokens, not ~{tokens}")
        out.append(s)
    return out


class ServerProc:
    """A server process (its command line given), its stderr kept (the last 200 lines), up
    when `health` answers 200; stop() terminates it (SIGKILL after 30 s)."""

    def __init__(self, cmd, port, name, health="/health", wait_s=120):
        self.cmd, self.port, self.name = cmd, port, name
        self.err = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.time() + wait_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {' '.join(cmd)}\n{''.join(self.err[-20:])}")
            try:
                if get(port, health)[0] == 200:
                    return
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not come up in {wait_s} s: {' '.join(cmd)}")
            time.sleep(0.2)

    def _drain(self):
        for line in self.proc.stderr:
            self.err.append(line)
            if len(self.err) > 200:
                del self.err[:100]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
