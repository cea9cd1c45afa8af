#!/usr/bin/env python3
"""KIVI faithfulness (issue 10 item 2): a NumPy transcription of the reference quantizer
(jy-yuan/KIVI@876b4d2), run on the keys/values qevict's engine computed, compared with the
codes qevict's KIVI cache stored.

    python=~/.cache/qevict/venv/bin/python   # numpy only (tools/requirements.txt)
    $python tools/faithfulness/kivi_numpy.py --qevict build/tools/qevict \\
        --model ~/.cache/qevict/models/SmolLM2-135M-Instruct.Q4_1.gguf --bits 2 --out-dir results/kivi_faith
    $python tools/faithfulness/kivi_numpy.py ... --golden-out tests/golden/kivi   # regenerate the CTest data

1. Runs `qevict perplexity --kv-policy kivi --kv-trace DIR` on the first --tokens tokens of a
   committed text: at the end of the prompt the cache dumps, per layer, its f16 inputs and
   its codes/scales/minimums (KiviKvCache::dump_prompt).
2. Quantizes the same inputs with the transcription below and reports, per (layer, KV head),
   the share of codes equal to the reference's and the largest dequantized difference in
   code steps; scales and minimums are compared exactly.
3. With --golden-out: writes the first --golden-tokens tokens of layers 0 and L-1, and the
   transcription's codes for them at 2 and 4 bits (G = R = 32), as small .npy files; the
   CTest KiviFaithfulness (tests/kvcache/kivi_faithfulness_test.cpp) feeds those inputs to the
   C++ cache and checks its codes against them, without Python.

A group whose values are all equal has scale 0: the reference divides 0 by 0 there (its codes
are undefined: NaN cast to int32); qevict writes code 0. Such groups are counted apart.
"""
import json
import os

import numpy as np

import common
from common import ROOT


def quantize_along_last_dim(data, group_size, bit):
    """quant/new_pack.py:L217-252 (triton_quantize_and_pack_along_last_dim) without the
    packing: data float16 [..., T]; groups of group_size along the last dim. Every op runs in
    float16, as the reference's torch.float16 tensors do (NumPy rounds each float16 op's exact
    result to float16, as CUDA's half arithmetic does)."""
    assert data.dtype == np.float16
    shape = data.shape
    T = shape[-1]
    assert T % group_size == 0                                   # L222
    d = data.reshape(-1, T // group_size, group_size)            # L224, L227
    mn = d.min(axis=-1)                                          # L233-235 (_minmax_along_last_dim)
    mx = d.max(axis=-1)
    scale = (mx - mn) / np.float16(2 ** bit - 1)                 # L238
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (d - mn[..., None]) / scale[..., None]               # L239-240
    q = np.clip(q, 0, 2 ** bit - 1)                              # L241: clamp_(0, 2^b-1)
    degenerate = np.broadcast_to((scale == 0)[..., None], q.shape)
    q = np.where(degenerate, 0, np.round(q))                     # .round_(): half to even
    return (q.astype(np.int64).reshape(shape), scale.reshape(shape[:-1] + (T // group_size,)),
            mn.reshape(shape[:-1] + (T // group_size,)), degenerate.reshape(shape))


def kivi_prefill(k, v, bits, G, R):
    """models/llama_kivi.py:L193-220 on one layer's prompt: k, v float16 [n, H, D]. Keys: the
    first n - n mod R tokens, transposed to [H, D, T] (L204) and grouped along T; values: all
    but the last R tokens (L210-219), [H, T, D] grouped along D."""
    n = k.shape[0]
    kq = n - n % R if n >= R else 0                              # L193-202
    vq = n - R if n > R else 0                                   # L210-217
    out = {"kq": kq, "vq": vq}
    if kq:
        kt = np.ascontiguousarray(k[:kq].transpose(1, 2, 0))     # [H, D, kq]
        out["k"] = quantize_along_last_dim(kt, G, bits)          # codes [H, D, kq], scale [H, D, kq/G]
    if vq:
        vt = np.ascontiguousarray(v[:vq].transpose(1, 0, 2))     # [H, vq, D]
        out["v"] = quantize_along_last_dim(vt, G, bits)          # codes [H, vq, D], scale [H, vq, D/G]
    return out


def ours(dump, l, H, D, G):
    """Our dump of layer l in the reference's layouts."""
    def ld(what):
        return np.load(os.path.join(dump, f"kivi_L{l}_{what}.npy"))
    kq_codes = ld("k_codes")
    vq_codes = ld("v_codes")
    nk, nv = kq_codes.shape[0], vq_codes.shape[0]
    r = {"k_in": ld("k_in").astype(np.float16).reshape(-1, H, D),
         "v_in": ld("v_in").astype(np.float16).reshape(-1, H, D), "kq": nk, "vq": nv}
    r["k"] = (kq_codes.reshape(nk, H, D).transpose(1, 2, 0).astype(np.int64),
              ld("k_scale").reshape(-1, H, D).transpose(1, 2, 0).astype(np.float16),
              ld("k_min").reshape(-1, H, D).transpose(1, 2, 0).astype(np.float16))
    r["v"] = (vq_codes.reshape(nv, H, D).transpose(1, 0, 2).astype(np.int64),
              ld("v_scale").reshape(nv, H, D // G).transpose(1, 0, 2).astype(np.float16),
              ld("v_min").reshape(nv, H, D // G).transpose(1, 0, 2).astype(np.float16))
    return r


def compare(ref, mine, G, axis_groups):
    """Per KV head (axis 0): code agreement over non-degenerate groups, the largest
    |dequant(ours) - dequant(ref)| in units of the reference's code step, exact scale/min
    matches, and the degenerate-group count."""
    rc, rs, rm, deg = ref
    mc, ms, mm = mine
    # Expand per-group parameters to per element: groups run along the last axis.
    rs_e = np.repeat(rs.astype(np.float32), G, axis=-1)
    rm_e = np.repeat(rm.astype(np.float32), G, axis=-1)
    ms_e = np.repeat(ms.astype(np.float32), G, axis=-1)
    mm_e = np.repeat(mm.astype(np.float32), G, axis=-1)
    rows = []
    for h in range(rc.shape[0]):
        ok = ~deg[h]
        agree = float((rc[h][ok] == mc[h][ok]).mean()) if ok.any() else 1.0
        deq_r = rc[h] * rs_e[h] + rm_e[h]
        deq_m = mc[h] * ms_e[h] + mm_e[h]
        step = np.where(rs_e[h] > 0, rs_e[h], 1.0)
        steps = float((np.abs(deq_m - deq_r) / step)[ok].max()) if ok.any() else 0.0
        rows.append({"head": h, "agreement": agree, "max_steps": steps,
                     "scale_exact": float((rs[h] == ms[h]).mean()), "min_exact": float((rm[h] == mm[h]).mean()),
                     "degenerate": int(deg[h].sum())})
    return rows


def main():
    ap = common.arg_parser(__doc__, "results/kivi_faith", 40)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--residual", type=int, default=128)
    a = ap.parse_args()
    dump = os.path.join(a.out_dir, f"dump_b{a.bits}")
    n = a.tokens
    meta, command = common.dump_prompt(a, dump, ["--kv-policy", "kivi", "--kv-bits", str(a.bits), "--kv-group", str(a.group),
                                        "--kv-local", str(a.residual)], "kivi_meta.json")
    H, D, G, R, L = meta["n_kv_heads"], meta["head_dim"], meta["group"], meta["residual"], meta["n_layers"]
    table = []
    for l in range(L):
        m = ours(dump, l, H, D, G)
        ref = kivi_prefill(m["k_in"], m["v_in"], a.bits, G, R)
        assert (ref["kq"], ref["vq"]) == (m["kq"], m["vq"]), (l, ref["kq"], ref["vq"], m["kq"], m["vq"])
        for kind in ("k", "v"):
            if kind in ref:
                for row in compare(ref[kind], m[kind], G, None):
                    table.append({"layer": l, "tensor": kind, **row})
    summary = {}
    for kind in ("k", "v"):
        rs = [r for r in table if r["tensor"] == kind]
        summary[kind] = {"units": len(rs), "agreement_min": min(r["agreement"] for r in rs),
                         "agreement_mean": float(np.mean([r["agreement"] for r in rs])),
                         "max_steps": max(r["max_steps"] for r in rs),
                         "scale_exact_min": min(r["scale_exact"] for r in rs),
                         "min_exact_min": min(r["min_exact"] for r in rs),
                         "degenerate_groups": sum(r["degenerate"] for r in rs)}
    result = {"command": command, "meta": meta, "summary": summary, "per_layer_head": table}
    with open(os.path.join(a.out_dir, f"kivi_faithfulness_b{a.bits}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"KIVI-{a.bits} (G {G}, R {R}, {n} prompt tokens, {L} layers x {H} KV heads):")
    for kind, s in summary.items():
        print(f"  {'keys' if kind == 'k' else 'values'}: code agreement min {s['agreement_min']:.6f} "
              f"mean {s['agreement_mean']:.6f} over {s['units']} (layer, head); max |dequant diff| "
              f"{s['max_steps']:.3f} code steps; scales exact {s['scale_exact_min']:.4f}, mins exact "
              f"{s['min_exact_min']:.4f} (min over units); degenerate groups {s['degenerate_groups']}")
    if a.golden_out:
        os.makedirs(a.golden_out, exist_ok=True)
        T = a.golden_tokens
        gmeta = {"tokens": T, "group": 32, "residual": 32, "n_kv_heads": H, "head_dim": D,
                 "layers": [0, L - 1], "bits": [2, 4],
                 "source": f"{os.path.basename(a.model)}, the first {T} tokens of "
                           f"{os.path.relpath(a.text, ROOT)} (a {n}-token prompt, KIVI dump)"}
        for l in gmeta["layers"]:
            m = ours(dump, l, H, D, G)
            k, v = m["k_in"][:T], m["v_in"][:T]
            np.save(os.path.join(a.golden_out, f"L{l}_k_in.npy"), k.reshape(T, H * D))
            np.save(os.path.join(a.golden_out, f"L{l}_v_in.npy"), v.reshape(T, H * D))
            for b in gmeta["bits"]:
                ref = kivi_prefill(k, v, b, 32, 32)
                kc, ks, km, _ = ref["k"]   # [H, D, kq], [H, D, groups]
                vc, vs, vm, _ = ref["v"]   # [H, vq, D], [H, vq, D/G]
                # Saved in the cache's export layouts: [token][head][dim], [group][head][dim],
                # [token][head][D/G].
                np.save(os.path.join(a.golden_out, f"L{l}_b{b}_k_codes.npy"), kc.transpose(2, 0, 1).astype(np.uint8))
                np.save(os.path.join(a.golden_out, f"L{l}_b{b}_k_scale.npy"), ks.transpose(2, 0, 1))
                np.save(os.path.join(a.golden_out, f"L{l}_b{b}_k_min.npy"), km.transpose(2, 0, 1))
                np.save(os.path.join(a.golden_out, f"L{l}_b{b}_v_codes.npy"), vc.transpose(1, 0, 2).astype(np.uint8))
                np.save(os.path.join(a.golden_out, f"L{l}_b{b}_v_scale.npy"), vs.transpose(1, 0, 2))
                np.save(os.path.join(a.golden_out, f"L{l}_b{b}_v_min.npy"), vm.transpose(1, 0, 2))
        with open(os.path.join(a.golden_out, "meta.json"), "w") as f:
            json.dump(gmeta, f, indent=1)
        print(f"golden data for the CTest: {a.golden_out}")


if __name__ == "__main__":
    main()
