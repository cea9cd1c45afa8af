#!/usr/bin/env python3
"""ZipCache faithfulness (issue 10 item 2): a NumPy transcription of the reference's prompt rule
(ThisisBillhe/ZipCache@b6932b9: saliency, the per-head unimportant sets, both quantizers), run on
the queries, keys and values qevict's engine computed, compared with what qevict's ZipCache
cache chose and stored.

    python=$(tools/venv.sh)   # numpy only (tools/requirements.txt)
    $python tools/faithfulness/zipcache_numpy.py --model ~/.cache/qevict/models/SmolLM2-135M-Instruct.Q4_1.gguf
    $python tools/faithfulness/zipcache_numpy.py ... --golden-out tests/golden/zipcache   # CTest data

1. Runs `qevict perplexity --kv-policy zipcache --kv-trace DIR` on the first --tokens tokens of a
   committed text (all prefill, one prompt): at the prompt's end the cache dumps, per layer, its
   inputs (post-RoPE keys, values, every query row and the probe positions), the per-head
   token lists and every set's codes and parameters (ZipKvCache::dump_prompt).
2. Saliency and sets: the transcription scores the same probes (the reference draws its random
   probes with torch.randint, with replacement; ours are a fixed hash of (layer, position):
   `is_random_probe` below mirrors it and is checked against the dump) and takes the
   int(0.4 n) least salient tokens per KV head. Reported: the Jaccard index of the unimportant
   sets per (layer, KV head), with the reference's float16 arithmetic and with float32.
3. Quantizers: the transcription quantizes the sets qevict chose (in its row order, so that the
   quantizer alone is compared) and reports, per (layer, KV head, tensor), the share of codes
   equal and the largest |dequantized difference| in code steps; parameters compared exactly.
4. With --golden-out: the first --golden-tokens tokens of layers 0 and L-1 (keys, values and the
   probe query rows, as a 1-layer cache sees them) and the transcription's sets and codes for
   them, as small .npy files for tests/kvcache/zipcache_faithfulness_test.cpp (no Python).

A constant column or row has step 0: the reference divides 0 by 0 there (NaN cast to uint8);
qevict writes code 0. Such elements are left out of the agreement and counted apart.
"""
import json
import os

import numpy as np

import common
from common import ROOT
f16 = np.float16
M64 = (1 << 64) - 1


def is_random_probe(layer, pos, ratio=0.05):
    """ZipCacheConfig::is_random_probe (src/kvcache/policies/zipcache_policy.cpp): splitmix64 of
    (layer, pos); a probe with probability ratio / (1 - ratio)."""
    z = ((layer & 0xFFFFFFFF) << 40) ^ pos ^ 0x9E3779B97F4A7C15
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 11) * 2.0 ** -53 < ratio / (1.0 - ratio)


def probe_positions(layer, n, ratio=0.05):
    """modeling_llama.py:L778-779: the recent probes are [int(n - 0.05 n), n); before them ours
    are the hashed positions (the reference: int(0.05 n) torch.randint draws)."""
    start = int(n - ratio * n)
    return [t for t in range(n) if t >= start or is_random_probe(layer, t, ratio)]


def saliency(q, k, pos, n_q_heads, ratio_unimp, half):
    """modeling_llama.py:L782-796 for one layer: q [P, Hq*D] probe query rows, k [n, Hkv*D]
    post-RoPE keys, pos the probes' positions. Returns (per-head token score [Hkv, n], per-head
    unimportant lists [Hkv, int(ratio n)]). half=True does every step in float16 as the
    reference's float16 model does (matmul and reductions accumulate in float32, each result is
    rounded to float16); half=False keeps float32 throughout (what qevict computes)."""
    n = k.shape[0]
    P = len(pos)
    Hq = n_q_heads
    D = q.shape[1] // Hq
    Hkv = k.shape[1] // D
    G = Hq // Hkv
    dt = f16 if half else np.float32
    qh = q.reshape(P, Hq, D).astype(dt).astype(np.float32)
    kh = k.reshape(n, Hkv, D).astype(dt).astype(np.float32)
    mask = np.arange(n)[None, :] > np.asarray(pos)[:, None]        # causal: key t > probe pos
    score = np.zeros((Hkv, n), np.float32)
    for h in range(Hkv):
        acc = np.zeros((P, n), np.float32)                         # sum over the group (L793)
        for g in range(G):
            lg = qh[:, h * G + g, :] @ kh[:, h, :].T               # L782: matmul ...
            lg = lg.astype(dt).astype(np.float32) / np.float32(np.sqrt(D))  # ... / sqrt(D)
            lg = lg.astype(dt).astype(np.float32)
            lg[mask] = -np.inf                                     # L784-785: + causal mask
            e = np.exp(lg - lg.max(axis=1, keepdims=True))
            p = e / e.sum(axis=1, keepdims=True)                   # L787: softmax in float32
            acc += p.astype(dt).astype(np.float32)                 # .to(float16)
        acc = acc.astype(dt).astype(np.float32)
        s = acc.sum(axis=0).astype(dt).astype(np.float32)          # L794: sum over the probes
        s = (s / np.arange(n, 0, -1, dtype=np.float32)).astype(dt).astype(np.float32)  # L795
        score[h] = s
    k_un = int(ratio_unimp * n)                                    # L796: topk(largest=False)
    unimp = np.stack([np.argsort(score[h], kind="stable")[:k_un] for h in range(Hkv)])
    return score, unimp


def important_lists(unimp, n):
    """compress_class.py:L436-442: per head, every position not unimportant, ascending."""
    out = []
    for u in unimp:
        m = np.ones(n, bool)
        m[u] = False
        out.append(np.nonzero(m)[0])
    return np.stack(out)


def gather(x, lists, D):
    """compress_function.py:L240-248 (torch.gather on [B, H, L, D]) then the permute/reshape of
    L75-79 / L1437-1441: row j holds the j-th listed token of every head: [m, H*D]."""
    H = lists.shape[0]
    xs = x.reshape(x.shape[0], H, D)
    return np.concatenate([xs[lists[h], h, :] for h in range(H)], axis=1)


def quantize_keys(rows, bits):
    """true_channel_wise_quantize (compress_function.py:L72-94), float16: per column min/max
    over the set's rows, scale = (max - min) / (2^b - 1), code = round((x - min) / scale)."""
    x = rows.astype(f16)
    mn = x.min(axis=0)
    mx = x.max(axis=0)
    step = ((mx - mn) / f16(2 ** bits - 1)).astype(f16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = ((x - mn) / step).astype(f16)
    deg = np.broadcast_to(step == 0, x.shape)
    codes = np.where(deg, 0, np.round(q)).astype(np.int64)       # .round_(): half to even
    return codes, mn, step, deg


def value_scale(v):
    """compress_function.py:L656-660: channel_scale = sqrt(max |x|) per column over every token
    of the layer (all of value_states, before the sets are gathered)."""
    return np.sqrt(np.abs(v.astype(f16)).max(axis=0)).astype(f16)


def quantize_values(rows, scale, bits):
    """true_channel_separate_mixedprec_tokenwise_compress (L645-686) on a set's rows already
    divided by the column scale (L661), then true_tokenwise_quantize (L1434-1458): per row
    min/max over all H*D columns."""
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(scale > 0, rows.astype(f16) / scale, f16(0)).astype(f16)
    mn = x.min(axis=1)
    mx = x.max(axis=1)
    step = ((mx - mn) / f16(2 ** bits - 1)).astype(f16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = ((x - mn[:, None]) / step[:, None]).astype(f16)
    deg = np.broadcast_to((step == 0)[:, None], x.shape)
    codes = np.where(deg, 0, np.round(q)).astype(np.int64)
    return codes, mn, step, deg


def reference_layer(k, v, q_probe, pos, n_q_heads, unimp_lists, hi, lo, ratio, D):
    """The whole prompt rule on one layer: sets (from the reference's float16 saliency) and the
    codes of the given sets (`unimp_lists`: qevict's, in its row order, or None for the
    transcription's own)."""
    n = k.shape[0]
    _, un16 = saliency(q_probe, k, pos, n_q_heads, ratio, half=True)
    _, un32 = saliency(q_probe, k, pos, n_q_heads, ratio, half=False)
    un = un16 if unimp_lists is None else unimp_lists
    im = important_lists(un, n)
    sc = value_scale(v)
    out = {"unimp16": un16, "unimp32": un32, "imp": im, "unimp": un, "v_scale": sc}
    for name, lists, bits in (("imp", im, hi), ("unimp", un, lo)):
        out["k_" + name] = quantize_keys(gather(k, lists, D), bits)
        out["v_" + name] = quantize_values(gather(v, lists, D), sc, bits)
    return out


def load_dump(dump, l):
    def ld(what):
        return np.load(os.path.join(dump, f"zip_L{l}_{what}.npy"))
    r = {w: ld(w) for w in ("k_in", "v_in", "probe_pos", "q", "imp", "unimp", "v_scale")}
    for s in ("imp", "unimp"):
        for w in ("k_codes", "v_codes", "k_min", "k_step", "v_rmin", "v_rstep"):
            r[f"{w}_{s}"] = ld(f"{w}_{s}")
    return r


def jaccard(a, b):
    a, b = set(a.tolist()), set(b.tolist())
    return len(a & b) / max(1, len(a | b))


def compare_codes(mine, ref, H, D):
    """Per head: the share of equal codes (non-degenerate elements) and the largest dequantized
    difference in the reference's code steps, from codes and parameters of both sides."""
    mc, m_deq = mine
    rc, r_deq, r_step, deg = ref
    rows = []
    for h in range(H):
        cols = slice(h * D, (h + 1) * D)
        ok = ~deg[:, cols]
        eq = float((mc[:, cols] == rc[:, cols])[ok].mean()) if ok.any() else 1.0
        st = np.broadcast_to(r_step, rc.shape)[:, cols].astype(np.float64)
        diff = np.abs(m_deq[:, cols] - r_deq[:, cols]) / np.where(st > 0, st, 1.0)
        rows.append((eq, float(diff[ok].max()) if ok.any() else 0.0, int((~ok).sum())))
    return rows


def main():
    ap = common.arg_parser(__doc__, "results/zipcache_faith", 48)
    a = ap.parse_args()
    dump = os.path.join(a.out_dir, "dump")
    n = a.tokens
    meta, command = common.dump_prompt(a, dump, ["--kv-policy", "zipcache", "--prefill-route", "end"], "zip_meta.json")
    H, D, Hq, L = meta["n_kv_heads"], meta["head_dim"], meta["n_q_heads"], meta["n_layers"]
    hi, lo, ratio = meta["hi_bits"], meta["lo_bits"], meta["unimportant_ratio"]
    assert meta["n"] == n, meta
    table = []
    for l in range(L):
        m = load_dump(dump, l)
        pos = m["probe_pos"][:, 0].astype(np.int64)
        assert pos.tolist() == probe_positions(l, n), f"layer {l}: probe positions differ from the hash"
        mine_unimp = m["unimp"].astype(np.int64)
        mine_imp = m["imp"].astype(np.int64)
        ref = reference_layer(m["k_in"], m["v_in"], m["q"][pos], pos, Hq, mine_unimp, hi, lo, ratio, D)
        assert (ref["imp"] == mine_imp).all(), f"layer {l}: important lists are not the complement"
        sc_exact = float((ref["v_scale"].astype(np.float32) == m["v_scale"][0]).mean())
        for h in range(H):
            row = {"layer": l, "head": h,
                   "jaccard_unimp_f16": jaccard(ref["unimp16"][h], mine_unimp[h]),
                   "jaccard_unimp_f32": jaccard(ref["unimp32"][h], mine_unimp[h]),
                   "v_scale_exact": sc_exact}
            table.append(row)
        for s in ("imp", "unimp"):
            rk_c, rk_mn, rk_st, rk_deg = ref["k_" + s]
            rv_c, rv_mn, rv_st, rv_deg = ref["v_" + s]
            mk_c, mv_c = m[f"k_codes_{s}"].astype(np.int64), m[f"v_codes_{s}"].astype(np.int64)
            mk_mn, mk_st = m[f"k_min_{s}"][0], m[f"k_step_{s}"][0]
            mv_mn, mv_st = m[f"v_rmin_{s}"][:, 0], m[f"v_rstep_{s}"][:, 0]
            msc = m["v_scale"][0].astype(np.float64)
            rsc = ref["v_scale"].astype(np.float64)
            mk_deq = mk_c * mk_st.astype(np.float64) + mk_mn
            rk_deq = rk_c * rk_st.astype(np.float64) + rk_mn.astype(np.float64)
            mv_deq = (mv_c * mv_st[:, None].astype(np.float64) + mv_mn[:, None]) * msc
            rv_deq = (rv_c * rv_st[:, None].astype(np.float64) + rv_mn[:, None].astype(np.float64)) * rsc
            # Value steps in units of the dequantized value: step_row * scale_column.
            rv_step = rv_st[:, None].astype(np.float64) * rsc[None, :]
            kr = compare_codes((mk_c, mk_deq), (rk_c, rk_deq, rk_st[None, :], rk_deg), H, D)
            vr = compare_codes((mv_c, mv_deq), (rv_c, rv_deq, rv_step, rv_deg), H, D)
            for h in range(H):
                r = table[-H + h]
                r[f"k_{s}_agree"], r[f"k_{s}_steps"], r[f"k_{s}_degenerate"] = kr[h]
                r[f"v_{s}_agree"], r[f"v_{s}_steps"], r[f"v_{s}_degenerate"] = vr[h]
            table[-1][f"k_{s}_params_exact"] = float(((rk_mn.astype(np.float32) == mk_mn).mean() +
                                                      (rk_st.astype(np.float32) == mk_st).mean()) / 2)
            table[-1][f"v_{s}_params_exact"] = float(((rv_mn.astype(np.float32) == mv_mn).mean() +
                                                      (rv_st.astype(np.float32) == mv_st).mean()) / 2)
    keys = list(dict.fromkeys(k for r in table for k in r if k not in ("layer", "head")))
    summary = {}
    for k in keys:
        vals = [r[k] for r in table if k in r]
        summary[k] = {"min": float(min(vals)), "mean": float(np.mean(vals)), "max": float(max(vals))}
    result = {"command": command, "meta": meta, "units": len(table), "summary": summary,
              "per_layer_head": table}
    with open(os.path.join(a.out_dir, "zipcache_faithfulness.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"ZipCache {hi}/{lo} bits, ratio {ratio} ({n} prompt tokens, {L} layers x {H} KV heads):")
    for k, s in summary.items():
        print(f"  {k:24s} min {s['min']:.6f}  mean {s['mean']:.6f}  max {s['max']:.6f}")
    if a.golden_out:
        write_golden(a, dump, L, H, D, Hq, hi, lo, ratio)


def write_golden(a, dump, L, H, D, Hq, hi, lo, ratio):
    """The first T tokens of layers 0 and L-1 as a 1-layer cache sees them: its probes are
    probe_positions(0, T) (the hash of layer 0); the query rows of the other positions are not
    needed (zeros in the test). The transcription's sets and the codes it gives them."""
    os.makedirs(a.golden_out, exist_ok=True)
    T = a.golden_tokens
    pos = probe_positions(0, T)
    gmeta = {"tokens": T, "n_kv_heads": H, "n_q_heads": Hq, "head_dim": D, "hi_bits": hi, "lo_bits": lo,
             "unimportant_ratio": ratio, "layers": [0, L - 1], "probes": len(pos),
             "source": f"{os.path.basename(a.model)}, the first {T} tokens of "
                       f"{os.path.relpath(a.text, ROOT)} ({a.tokens}-token prompt, ZipCache dump)"}
    for l in gmeta["layers"]:
        m = load_dump(dump, l)
        q = m["q"][pos]
        k, v = m["k_in"][:T], m["v_in"][:T]
        # The sets: the float32 saliency's (what qevict computes, so the test can compare the
        # quantizers on equal sets); the float16 ones are saved too (the test checks Jaccard).
        _, un32 = saliency(q, k, pos, Hq, ratio, half=False)
        ref = reference_layer(k, v, q, pos, Hq, un32, hi, lo, ratio, D)
        p = lambda w: os.path.join(a.golden_out, f"L{l}_{w}.npy")
        np.save(p("k_in"), k.astype(f16))
        np.save(p("v_in"), v.astype(f16))
        np.save(p("q_probe"), q.astype(f16))
        np.save(p("unimp"), ref["unimp"].astype(np.int32))
        np.save(p("unimp_f16"), ref["unimp16"].astype(np.int32))
        np.save(p("v_scale"), ref["v_scale"].astype(f16))
        for s in ("imp", "unimp"):
            kc, kmn, kst, _ = ref["k_" + s]
            vc, vmn, vst, _ = ref["v_" + s]
            np.save(p(f"k_codes_{s}"), kc.astype(np.uint8))
            np.save(p(f"k_min_{s}"), kmn.astype(f16))
            np.save(p(f"k_step_{s}"), kst.astype(f16))
            np.save(p(f"v_codes_{s}"), vc.astype(np.uint8))
            np.save(p(f"v_rmin_{s}"), vmn.astype(f16))
            np.save(p(f"v_rstep_{s}"), vst.astype(f16))
    gmeta["probe_positions"] = pos
    with open(os.path.join(a.golden_out, "meta.json"), "w") as f:
        json.dump(gmeta, f, indent=1)
    print(f"golden data for the CTest: {a.golden_out}")


if __name__ == "__main__":
    main()
