#!/usr/bin/env python3
"""A plain float64 NumPy forward pass of a llama- or qwen2-architecture GGUF model: the third,
slowest and most literal implementation in our chain of trust (qevict ↔ llama.cpp ↔ this).
Weights are dequantized with gguf-py; every operation is in float64, no KV cache. qwen2
differs from llama by Q/K/V biases and NeoX RoPE (llama.cpp's LLM_ARCH_QWEN2).

    $python tools/golden/reference_forward.py MODEL.gguf TOKENS.json N OUT.npy

TOKENS.json is a JSON object with a "tokens" list (e.g. tests/golden/model_golden.json);
the first N tokens are run and their logits [N, n_vocab] saved as float32 .npy.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, tokens_json, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    r = GGUFReader(path)
    meta = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("tokenizer.")}
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2"):
        sys.exit(f"only the llama and qwen2 architectures are implemented here, not {arch}")
    neox = arch == "qwen2"
    E = meta[f"{arch}.embedding_length"]
    H = meta[f"{arch}.attention.head_count"]
    Hk = meta.get(f"{arch}.attention.head_count_kv", H)
    D = E // H
    L = meta[f"{arch}.block_count"]
    eps = meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    base = meta.get(f"{arch}.rope.freq_base", 10000.0)
    tensors = {t.name: t for t in r.tensors}

    def get(name):
        t = tensors[name]
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
        cols = int(t.shape[0])
        return a.reshape(-1, cols) if len(t.shape) > 1 else a.reshape(-1)

    toks = json.load(open(tokens_json))["tokens"][:n]
    n = len(toks)
    emb = get("token_embd.weight")
    out_w = get("output.weight") if "output.weight" in tensors else emb
    x = emb[toks].copy()

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    # RoPE by pos * base^(-2i/D) on pair i: GGUF llama layout rotates adjacent pairs
    # (2i, 2i+1); NeoX (qwen2) rotates (i, i + D/2).
    ang = np.arange(n)[:, None] * base ** (-np.arange(0, D, 2) / D)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):
        if neox:
            a, b = v[..., : D // 2], v[..., D // 2 :]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = v[..., 0::2], v[..., 1::2]
        o = np.empty_like(v)
        o[..., 0::2] = a * cos - b * sin
        o[..., 1::2] = a * sin + b * cos
        return o

    def linear(h, name):  # h @ W.T (+ bias when the model has one)
        y = h @ get(name + ".weight").T
        return y + get(name + ".bias") if name + ".bias" in tensors else y

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(L):
        p = f"blk.{layer}."
        h = rms(x, get(p + "attn_norm.weight"))
        q = rope(linear(h, p + "attn_q").reshape(n, H, D))
        k = rope(linear(h, p + "attn_k").reshape(n, Hk, D))
        v = linear(h, p + "attn_v").reshape(n, Hk, D)
        att = np.zeros((n, H, D))
        for hh in range(H):
            kh = hh // (H // Hk)
            s = q[:, hh, :] @ k[:, kh, :].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, hh, :] = (s / s.sum(-1, keepdims=True)) @ v[:, kh, :]
        x = x + att.reshape(n, -1) @ get(p + "attn_output.weight").T
        h = rms(x, get(p + "ffn_norm.weight"))
        g = h @ get(p + "ffn_gate.weight").T
        u = h @ get(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ get(p + "ffn_down.weight").T
    logits = rms(x, get("output_norm.weight")) @ out_w.T
    np.save(out, logits.astype(np.float32))
    print(f"wrote {out}: [{n}, {logits.shape[1]}]")


if __name__ == "__main__":
    main()
