#!/usr/bin/env python3
"""Reference kept sets for the faithfulness check (issue 10 item 2).

Loads SmolLM2-135M-Instruct Q4_1 in transformers (gguf_file= dequantizes it to f32), prefills
each committed prompt (tools/faithfulness/prompts/*.txt) once, capturing what a kvpress press's
forward hook hands to compress() at every layer, calls each press's compress() on it (what the
press's hook does during that prefill), and records which tokens every (layer, KV head) keeps:

  streaming      StreamingLLMPress(n_sink=4)
  snapkv         SnapKVPress(window_size=32, kernel_size=5)
  pyramidkv      PyramidKVPress(window_size=32, kernel_size=5, beta=20)
  adakv          AdaKVPress(SnapKVPress(32, 5), alpha_safeguard=0.2)       (masks: kept = not masked)
  criticalkv     CriticalKVPress(SnapKVPress(32, 5), epsilon=1e-4, first_stage_ratio=0.5)
  criticaladakv  CriticalAdaKVPress(SnapKVPress(32, 5), alpha 0.2, eps 1e-4, first stage 0.5)
  defensivekv, layer-defensivekv
                 not in kvpress: a NumPy transcription (defensive_keep below) of
                 FFY0/DefensiveKV@9251b95 kvpress/presses/efficient_defensivekv_press.py:L32-75,
                 L116-227, efficient_ada_scorer_press.py:L83-98, efficient_ada_global_scorer_press.py
                 L160-192, run on the attention inputs of the same forward pass (kvpress's
                 SnapKVPress.compute_window_attention and CriticalKVPress.vwl1norm, taken in a hook).

The window (32), kernel (5, average pooling) and the other settings are our C++ defaults
(src/kvcache/registry.cpp), set on the presses; kvpress's own SnapKV default window is 64.
kvpress keeps n_kept = int(n * (1 - cr)) tokens per head, the window included; the C++ side
(tests/e2e/faithfulness_test.cpp) runs each case at that many tokens per KV head.

Writes tests/golden/faithfulness.json: the prompts' token ids and, per (prompt, method,
ratio), the kept sets as one little-endian bitset over [layer][kv_head][position], base64.
Needs the venv of tools/faithfulness/venv.sh (torch, transformers, kvpress):

  $(tools/faithfulness/venv.sh) tools/faithfulness/make_golden.py
"""
import argparse
import base64
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMPTS = ["gpl2", "apache2", "mpl2", "artistic", "gfdl13"]
WINDOW, KERNEL, BETA, ALPHA, EPS, FIRST_STAGE, N_SINK = 32, 5, 20, 0.2, 1e-4, 0.5, 4
METHODS = ["streaming", "snapkv", "pyramidkv", "adakv", "criticalkv", "criticaladakv",
           "defensivekv", "layer-defensivekv"]


def make_press(method, cr):
    import kvpress as kp
    snap = lambda: kp.SnapKVPress(compression_ratio=cr, window_size=WINDOW, kernel_size=KERNEL)
    if method == "streaming":
        return kp.StreamingLLMPress(compression_ratio=cr, n_sink=N_SINK)
    if method == "snapkv":
        return snap()
    if method == "pyramidkv":
        return kp.PyramidKVPress(compression_ratio=cr, window_size=WINDOW, kernel_size=KERNEL,
                                 beta=BETA)
    if method == "adakv":
        return kp.AdaKVPress(press=snap(), alpha_safeguard=ALPHA)
    if method == "criticalkv":
        return kp.CriticalKVPress(press=snap(), epsilon=EPS, first_stage_ratio=FIRST_STAGE)
    if method == "criticaladakv":
        return kp.CriticalAdaKVPress(press=snap(), alpha_safeguard=ALPHA, epsilon=EPS,
                                     first_stage_ratio=FIRST_STAGE)
    raise ValueError(method)


def capture_layers(model, ids):
    """One prefill; per layer what a press's forward hook hands to compress(): the attention
    module, its input hidden states, the layer's keys and values (the whole prompt) and the
    RoPE tables. Later layers never see a press's pruning (the hook runs after the layer's
    attention), so calling each press's compress() on these is its prefill compression."""
    from transformers import DynamicCache
    from kvpress.presses.base_press import BasePress
    from kvpress.utils import extract_keys_and_values

    layers = {}

    class Capture(BasePress):
        def forward_hook(self, module, input, kwargs, output):
            keys, values = extract_keys_and_values(kwargs["past_key_values"], module.layer_idx)
            cos, sin = kwargs["position_embeddings"]
            layers[module.layer_idx] = (module, kwargs["hidden_states"].clone(), keys.clone(),
                                        values.clone(), (cos.clone(), sin.clone()))
            return output

    with torch.no_grad(), Capture()(model):
        model(input_ids=torch.tensor([ids]), past_key_values=DynamicCache(), use_cache=True)
    return [layers[l] for l in range(len(layers))]


def run_press(model, layers, method, cr, H):
    """Kept positions per (layer, KV head) after kvpress's compression: bool [L][H][n]."""
    press = make_press(method, cr)
    press.post_init_from_model(model)  # as press(model) does
    L, n = len(layers), layers[0][2].shape[2]
    kept = np.zeros((L, H, n), dtype=bool)
    for layer, (module, hs, keys, values, pe) in enumerate(layers):
        module.masked_key_indices = None
        with torch.no_grad():
            k2, _ = press.compress(module, hs, keys, values, None, {"position_embeddings": pe})
        masked = getattr(module, "masked_key_indices", None)
        if masked is not None:  # AdaKV family: masks instead of pruning
            _, hi, si = masked
            kept[layer] = True
            kept[layer, hi.numpy(), si.numpy()] = False
            module.masked_key_indices = None
        else:  # pruned: find each kept key row among the originals (exact copies)
            for h in range(H):
                d = torch.cdist(k2[0, h].double(), keys[0, h].double(),
                                compute_mode="donot_use_mm_for_euclid_dist")
                mn, idx = d.min(dim=1)
                assert float(mn.max()) == 0.0, "a kept key is no copy of an original"
                kept[layer, h, idx.numpy()] = True
    return kept


def defensive_inputs(layers):
    """Per layer: A f32 [H][G][w][n-w] (window queries' softmax over all keys, first n-w
    columns) and nu f32 [H][n-w] (mean over the group of ||v W_O^h||_1), as DefensiveKV's
    score() reads them (its compute_window_attention is kvpress's SnapKV one plus the window
    bias; vwl1norm on values[..., :-w])."""
    from kvpress import CriticalKVPress, SnapKVPress

    out = []
    for module, hs, keys, values, pe in layers:
        with torch.no_grad():
            a = SnapKVPress.compute_window_attention(module, hs, keys, WINDOW, pe)
            nu = CriticalKVPress.vwl1norm(values[..., :-WINDOW, :], module)
        H = keys.shape[1]
        out.append((a[0].reshape(H, a.shape[1] // H, WINDOW, -1).float().numpy(),
                    nu[0].float().numpy()))
    return out


def avg_pool(x, k):
    """torch avg_pool1d(kernel k, stride 1, padding k//2), count_include_pad: along the last axis."""
    r = k // 2
    pad = np.zeros(x.shape[:-1] + (x.shape[-1] + 2 * r,), dtype=np.float64)
    pad[..., r:r + x.shape[-1]] = x
    c = np.cumsum(pad, axis=-1)
    c = np.concatenate([np.zeros(x.shape[:-1] + (1,)), c], axis=-1)
    return (c[..., k:] - c[..., :-k]) / k


def defensive_scores(a, nu, cr, w=WINDOW, k=KERNEL):
    """DefensiveKV's flattened scores of one layer, f64 [H][n] (window included), transcribed
    from efficient_defensivekv_press.py score() L186-222 and vwl1norm() L32-75."""
    a = a.astype(np.float64)
    H, G, W, m = a.shape
    window_bias = a[..., -w:].sum(-1).mean()                         # L154
    ave = a.mean(axis=1).mean(axis=-2)                               # L201: [H][m]
    base = a.sum(-1, keepdims=True)                                  # L202
    pooled = avg_pool(a, k)                                          # L203-208
    s = pooled / pooled.sum(-1, keepdims=True) * base                # L209
    mx = s.max(axis=1).max(axis=-2)                                  # L213: over G, then w
    s = np.maximum(mx, mx.mean(-1, keepdims=True))                   # L214 clamp(min=mean)
    nu = nu.astype(np.float64)
    s = s * (nu / nu.sum(0, keepdims=True))                          # L54-55: over heads
    threshold = 0.9 - window_bias                                    # L58
    norm = ave / ave.sum(-1, keepdims=True)                          # L59
    order = np.argsort(-norm, axis=-1, kind="stable")                # L63
    cum = np.cumsum(np.take_along_axis(norm, order, -1), -1)         # L64
    count = np.argmax(cum >= threshold, axis=-1)                     # L65-66 (0: never)
    count = np.minimum(count, int(m * (1 - cr) - w))                 # L67, q_len = n - w
    smax = s.max()                                                   # L73: the layer's max
    for h in range(H):
        s[h, order[h, :count[h]]] = smax
    return np.concatenate([s, np.full((H, w), s.max())], axis=-1)    # L222


def topk_mask(flat, k):
    """Boolean mask of the k largest (ties: lower index first, as a stable sort)."""
    keep = np.zeros(flat.shape, dtype=bool)
    keep[np.argsort(-flat, kind="stable")[:k]] = True
    return keep


def defensive_keep(inputs, n, cr, over_layers):
    L = len(inputs)
    scores = np.stack([defensive_scores(a, nu, cr) for a, nu in inputs])  # [L][H][n]
    H = scores.shape[1]
    kept = np.zeros(scores.shape, dtype=bool)
    if not over_layers:  # efficient_ada_scorer_press.py:L89-96: one top per layer
        for l in range(L):
            kept[l] = topk_mask(scores[l].reshape(-1), int(n * (1 - cr) * H)).reshape(H, n)
        return kept
    # efficient_ada_global_scorer_press.py:L172-192: a top over every layer sets the layers'
    # budgets, then a top within each layer.
    top = topk_mask(scores.reshape(-1), int(n * (1 - cr) * H * L)).reshape(L, H * n)
    for l in range(L):
        kept[l] = topk_mask(scores[l].reshape(-1), int(top[l].sum())).reshape(H, n)
    return kept


def b64bits(kept):
    return base64.b64encode(np.packbits(kept.reshape(-1), bitorder="little").tobytes()).decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/qevict/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ratios", default="0.5,0.8", help="kvpress compression ratios")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/golden/faithfulness.json"))
    ap.add_argument("--scores-out", default="",
                    help="also save the reference inputs (npz) for tie analysis")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import kvpress
    import transformers

    d, f = os.path.split(args.model)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.eval()
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_key_value_heads
    ratios = [float(r) for r in args.ratios.split(",")]
    methods = args.methods.split(",")
    golden = {
        "about": "kept token sets per (layer, KV head) after prefill compression: kvpress "
                 "presses and a NumPy transcription of DefensiveKV; tools/faithfulness/make_golden.py",
        "model": os.path.basename(args.model),
        "versions": {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.4",
                     "transformers": transformers.__version__, "torch": torch.__version__},
        "settings": {"window": WINDOW, "kernel": KERNEL, "pool": "avg", "beta": BETA,
                     "alpha_safeguard": ALPHA, "epsilon": EPS, "first_stage_ratio": FIRST_STAGE,
                     "n_sink": N_SINK},
        "n_layers": L, "n_kv_heads": H,
        "bitset": "base64 of little-endian bits over [layer][kv_head][position]",
        "prompts": [], "cases": [],
    }
    dump = {}
    for pi, name in enumerate(PROMPTS):
        text = open(os.path.join(HERE, "prompts", name + ".txt")).read()
        ids = tok(text, add_special_tokens=False)["input_ids"]
        n = len(ids)
        golden["prompts"].append({"name": name, "tokens": ids})
        t0 = time.time()
        layers = capture_layers(model, ids)
        inputs = None
        for cr in ratios:
            n_kept = int(n * (1 - cr))
            for method in methods:
                if method in ("defensivekv", "layer-defensivekv"):
                    if inputs is None:
                        inputs = defensive_inputs(layers)
                        if args.scores_out:
                            for l, (a, nu) in enumerate(inputs):
                                dump[f"{name}_A{l}"] = a
                                dump[f"{name}_nu{l}"] = nu
                    kept = defensive_keep(inputs, n, cr, method == "layer-defensivekv")
                else:
                    kept = run_press(model, layers, method, cr, H)
                golden["cases"].append({
                    "prompt": pi, "method": method, "ratio": cr, "n": n, "n_kept": n_kept,
                    "kept_per_layer": [int(x) for x in kept.sum(axis=(1, 2))],
                    "kept": b64bits(kept)})
        print(f"{name}: {n} tokens, {time.time() - t0:.1f} s", file=sys.stderr)
    with open(args.out, "w") as fo:
        json.dump(golden, fo, separators=(",", ":"))
        fo.write("\n")
    if args.scores_out:
        np.savez_compressed(args.scores_out, **dump)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} B)", file=sys.stderr)


if __name__ == "__main__":
    main()
