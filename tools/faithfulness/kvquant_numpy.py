#!/usr/bin/env python3
"""KVQuant faithfulness: a NumPy (and scikit-learn) transcription of the reference's simulated
quantization (SqueezeAILab/KVQuant@57a2383, quant/kvquant/simquant_module_quantizer.py, cited
below as SQ:Lnnn, and quant/llama_simquant.py, LS:Lnnn), run on the keys/values qevict's engine
computed, compared with what qevict's KVQuant cache stored.

    python=$(tools/venv.sh)   # numpy, scikit-learn (tools/requirements.txt)
    OMP_NUM_THREADS=1 $python tools/faithfulness/kvquant_numpy.py --qevict build-kvq/tools/qevict \\
        --model ~/.cache/qevict/models/SmolLM2-135M-Instruct.Q4_1.gguf --out-dir results/kvquant_faith
    ... --golden-out tests/golden/kvquant   # also regenerate the CTest data

1. Runs `qevict perplexity --kv-policy kvquant --kv-trace DIR` on the first --tokens tokens of a
   committed text. The calibration dumps its activations (pre-RoPE K, V of the calibration text
   per layer); at the end of the prompt the cache dumps, per layer, its inputs (pre-RoPE keys,
   values, f32), its calibration, codes, value offsets/ranges and outliers.
2. Checks, per (layer, KV head):
   (a) our key thresholds against the reference's np.percentile on the same activations;
   (b) with OUR calibration, the reference's rule on the prompt: code agreement (on the sorted
       levels; at an outlier both hold the level nearest 0), outlier-set Jaccard, dequantized
       difference in code steps — isolates the quantization rule;
   (c) with the REFERENCE's calibration (its thresholds and its sklearn KMeans levels): how far
       our levels are from its (in units of its mean level spacing) and how far our dequantized
       prompt is from the reference's, in code steps (at each element: the wider gap from the
       reference's level to its neighbours, times the range; the levels are not even).
3. With --golden-out: the first --golden-tokens tokens of layers 0 and L-1 with the reference's
   calibration and the transcription's codes/offsets/ranges/outliers, for the CTest
   KvQuantFaithfulness (tests/kvcache/kvquant_faithfulness_test.cpp).

Fisher information (the reference's --fisher, LS:L431-450) needs the model's gradients, which a
CPU inference engine does not compute; the reference's own path without --fisher (SQ:L520-528,
unweighted KMeans) is what is transcribed here. The reference calibrates on 16 wikitext samples
of 2,048 tokens (LS:L312); here both sides use qevict's one committed calibration sample.
"""
import json
import os

import numpy as np

import common
from common import ROOT


# ---------------------------------------------------------------- the reference, transcribed

def calibrate(data, bits, sparsity, qchannel, first_few_fp16, kmeans=True):
    """SimQuant.quantize (SQ:L400-552) with include_sparse, nuq, fisher None, norm False,
    cap_outliers False (keys: qchannel 0, per channel; values: qchannel -1, per token,
    LS:L220-234). data: f32 [tokens][kv_width], one calibration sample. Returns (upper, lower,
    levels as the reference stores them: KMeans order, not sorted; the points KMeans fitted)."""
    t = 1 - ((1 - sparsity) / 2)                                  # SQ:L413
    upper = np.percentile(data, t * 100, axis=qchannel)           # SQ:L465
    lower = np.percentile(data, (1 - t) * 100, axis=qchannel)     # SQ:L466
    up = np.expand_dims(upper, qchannel)                          # SQ:L473-474
    lo = np.expand_dims(lower, qchannel)
    rangeval = (up - lo) / 2                                      # SQ:L477
    zeropoint = (up + lo) / 2                                     # SQ:L478
    normalized = (data - zeropoint) / rangeval                    # SQ:L481-484
    outlier_mask = np.logical_or(normalized > 1, normalized < -1)  # SQ:L488
    if first_few_fp16 > -1:                                       # SQ:L491-495 (one sample:
        outlier_mask[0:first_few_fp16, :] = True                  #   nsamples = 1)
    if not kmeans:
        return upper, lower, None, None
    from sklearn.cluster import KMeans
    x = normalized.flatten()[~outlier_mask.flatten()]             # SQ:L499-504
    x = x.astype(np.float32).reshape(-1, 1)                       # SQ:L505 (.float())
    km = KMeans(n_clusters=2 ** bits, random_state=0, n_init="auto", max_iter=50).fit(x)  # SQ:L521-528
    return upper, lower, km.cluster_centers_.astype(np.float32)[:, 0], x[:, 0]  # SQ:L530


def nearest_pole(w, poles):
    """round_to_nearest_pole_sim (SQ:L10-28): the index of the pole nearest each element, the
    first in the poles' order on a tie (argmin)."""
    diff = np.stack([np.abs(w - np.float32(c)) for c in poles])  # SQ:L18-21
    return diff.argmin(axis=0)                                    # SQ:L22


def torch_quantile_f32(w, q):
    """torch.quantile(w, q, dim=-1), linear, for f32 w as torch computes it (ATen's quantile:
    ranks = q·(n−1) in the input dtype, below = trunc(ranks), weight = ranks − below, then the
    lerp of the two order statistics, rounded once). Checked equal, element for element, to
    torch 2.9.1 (CPU) on the engine's values of this dump; CUDA's lerp may round differently in
    the last bit."""
    s = np.sort(w, axis=-1)
    n = w.shape[-1]
    ranks = np.float32(q) * np.float32(n - 1)
    below = int(ranks)
    above = min(below + 1, n - 1)
    wt = np.float64(ranks - np.float32(below))
    a, b = s[..., below].astype(np.float64), s[..., above].astype(np.float64)
    return (a + wt * (b - a)).astype(np.float32)


def quantize_keys(y, upper, lower, lut, first_few_fp16):
    """QuantLinearSim.forward for k_proj (SQ:L698-790: perchannel, static thresholds):
    y f32 [tokens][kv_width]. Returns codes (indices into lut), dequantized, outlier mask,
    offset and range per channel."""
    u16 = np.asarray(upper).astype(np.float16)                    # SQ:L612 (.half())
    l16 = np.asarray(lower).astype(np.float16)                    # SQ:L613
    mask = np.logical_or(y < l16.astype(np.float32), y > u16.astype(np.float32))  # SQ:L48-54
    if first_few_fp16 > -1:
        mask[:first_few_fp16, :] = True                           # SQ:L75-76
    offset = ((u16 + l16) / np.float16(2))[None, :]               # SQ:L318, L320 (f16 ops)
    rangeval = ((u16 - l16) / np.float16(2))[None, :]             # SQ:L319, L321
    return _recon(y, mask, offset, rangeval, lut, first_few_fp16)


def quantize_values(y, lut, sparsity, first_few_fp16):
    """QuantLinearSim.forward for v_proj (SQ:L698-790: per token, dynamicquantization):
    get_outliers_dynamic (SQ:L80-113), then quant_fn_nuq_recon's dynamic branch (SQ:L302-312)."""
    t = 1 - ((1 - sparsity) / 2)                                  # SQ:L95
    w = y.astype(np.float32)                                      # SQ:L96
    up = torch_quantile_f32(w, t)[:, None]                        # SQ:L99, L102
    lo = torch_quantile_f32(w, 1 - t)[:, None]                    # SQ:L100, L103
    mask = np.logical_or(w <= lo, w >= up)                        # SQ:L105-108 (non-strict)
    if first_few_fp16 > -1:
        mask[:first_few_fp16, :] = True                           # SQ:L110-111
    outliers = y * mask                                           # SQ:L304
    median = np.sort(y, axis=-1)[:, (y.shape[-1] - 1) // 2][:, None]  # SQ:L305: torch.median (lower)
    tmp = y - outliers + median * mask                            # SQ:L307-310
    mx, mn = tmp.max(axis=-1)[:, None], tmp.min(axis=-1)[:, None]  # SQ:L311-312
    offset = (mx + mn) / np.float32(2)                            # SQ:L318 (f32)
    rangeval = (mx - mn) / np.float32(2)                          # SQ:L319
    return _recon(y, mask, offset, rangeval, lut, first_few_fp16)


def _recon(y, mask, offset, rangeval, lut, first_few_fp16):
    """quant_fn_nuq_recon's rest (SQ:L317-361): shift, drop the outliers, normalize, nearest
    level, un-normalize, outliers back, first tokens exact."""
    inp = (y - offset).astype(np.float32)                         # SQ:L324
    outliers = inp * mask                                         # SQ:L328
    inp = inp - outliers                                          # SQ:L329
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = (inp / rangeval).astype(np.float32)              # SQ:L332
    codes = nearest_pole(scaled, lut)                             # SQ:L335-337
    deq = np.asarray(lut, np.float32)[codes] * rangeval           # SQ:L345
    deq[mask] = 0                                                 # SQ:L349
    deq = deq + outliers + offset                                 # SQ:L350, L353
    deq = np.nan_to_num(deq, nan=0.0, posinf=0.0, neginf=0.0)    # SQ:L354
    deq[:first_few_fp16] = y[:first_few_fp16]                     # SQ:L358-359
    return {"codes": codes, "deq": deq.astype(np.float32), "mask": mask,
            "offset": np.broadcast_to(offset, y.shape), "range": np.broadcast_to(rangeval, y.shape)}


# ---------------------------------------------------------------- our dump

def load_ours(dump, l, n, kvw, first):
    def ld(what):
        return np.load(os.path.join(dump, f"kvquant_L{l}_{what}.npy"))
    o = {w: ld(w) for w in ("k_in", "v_in", "k_codes", "v_codes", "v_par", "k_deq", "v_deq", "calib_k",
                             "calib_lut")}
    for kind in ("k", "v"):
        rows = ld(f"{kind}_out").reshape(-1, 3)
        mask = np.zeros((n, kvw), bool)
        mask[rows[:, 0].astype(int), rows[:, 1].astype(int)] = True
        vals = np.zeros((n, kvw), np.float32)
        vals[rows[:, 0].astype(int), rows[:, 1].astype(int)] = rows[:, 2]
        o[f"{kind}_mask"], o[f"{kind}_outval"] = mask, vals
    m = n - first
    assert o["k_codes"].shape == (m, kvw) and o["k_in"].shape == (n, kvw), (l, o["k_codes"].shape)
    return o


def decode_ours(o, first):
    """Our dequantized prompt as the cache decodes it (kvquant_dequantize_key / _value; keys
    pre-RoPE; the first tokens as stored in f16)."""
    return o["k_deq"], o["v_deq"]


def sorted_codes(codes, lut):
    """Codes as indices into the ascending levels (the reference's KMeans order is arbitrary)."""
    rank = np.empty(len(lut), int)
    rank[np.argsort(lut, kind="stable")] = np.arange(len(lut))
    return rank[codes]


def local_step(lut, codes, rangeval):
    """One code step at each element: the wider of the gaps from its (reference) level to the
    neighbouring levels, times the range (the levels are not evenly spaced)."""
    order = np.argsort(lut, kind="stable")
    ls = np.asarray(lut, np.float64)[order]
    gaps = np.diff(ls)
    lo = np.concatenate([[gaps[0]], gaps])   # gap below level i (the first: its gap above)
    hi = np.concatenate([gaps, [gaps[-1]]])  # gap above level i
    r = sorted_codes(codes, lut)
    return np.maximum(lo[r], hi[r]) * np.abs(rangeval)


def jaccard(a, b):
    u = np.logical_or(a, b).sum()
    return 1.0 if u == 0 else float(np.logical_and(a, b).sum() / u)


def stats(rows, key):
    xs = [r[key] for r in rows]
    return {"min": float(np.min(xs)), "mean": float(np.mean(xs)), "max": float(np.max(xs))}


def main():
    ap = common.arg_parser(__doc__, "results/kvquant_faith", 40)
    ap.add_argument("--bits", type=int, default=3)
    a = ap.parse_args()
    dump = os.path.join(a.out_dir, f"dump_b{a.bits}")
    meta, command = common.dump_prompt(a, dump, ["--kv-policy", "kvquant", "--kv-bits", str(a.bits)], "kvquant_meta.json")
    H, D, L, F = meta["n_kv_heads"], meta["head_dim"], meta["n_layers"], meta["first_fp16"]
    s, bits, n = meta["sparsity"], meta["bits"], meta["n"]
    kvw = H * D
    table, per_layer, ref_cal = [], [], {}
    for l in range(L):
        o = load_ours(dump, l, n, kvw, F)
        ck = np.load(os.path.join(dump, f"kvquant_calib_L{l}_k.npy"))
        cv = np.load(os.path.join(dump, f"kvquant_calib_L{l}_v.npy"))
        ru, rl, rklut, kpts = calibrate(ck, bits, s, 0, F)         # keys: LS:L222-226
        _, _, rvlut, vpts = calibrate(cv, bits, s, -1, F)          # values: LS:L229-234
        ref_cal[l] = (ru, rl, rklut, rvlut)
        ku, kl, klut, vlut = o["calib_k"][0], o["calib_k"][1], o["calib_lut"][0], o["calib_lut"][1]
        # (b) the reference's rule with our calibration.
        rk = quantize_keys(o["k_in"], ku, kl, klut, F)
        rv = quantize_values(o["v_in"], vlut, s, F)
        # (c) the reference's rule with its calibration.
        ck_ = quantize_keys(o["k_in"], ru, rl, rklut, F)
        cv_ = quantize_values(o["v_in"], rvlut, s, F)
        ok, ov = decode_ours(o, F)
        lv = {}
        for kind, ours_lut, ref_lut in (("k", klut, rklut), ("v", vlut, rvlut)):
            rs = np.sort(ref_lut)
            spacing = (rs[-1] - rs[0]) / (len(rs) - 1)
            lv[kind] = float(np.max(np.abs(np.sort(ours_lut) - rs)) / spacing)
            # The k-means objective (sum of squared distances to the nearest level) of our levels
            # over the reference's, on the points the reference fitted: < 1 means ours fit better.
            pts = kpts if kind == "k" else vpts
            sse = [float(np.sum(np.min((pts[:, None].astype(np.float64) - np.asarray(lut, np.float64)[None, :]) ** 2,
                                       axis=1))) for lut in (ours_lut, ref_lut)]
            lv[kind + "_sse"] = sse[0] / sse[1]
        per_layer.append({"layer": l, "k_level_dist_max": lv["k"], "v_level_dist_max": lv["v"],
                          "k_kmeans_sse_ours_over_ref": lv["k_sse"], "v_kmeans_sse_ours_over_ref": lv["v_sse"],
                          "k_levels_ours": np.sort(klut).tolist(), "k_levels_ref": np.sort(rklut).tolist(),
                          "v_levels_ours": np.sort(vlut).tolist(), "v_levels_ref": np.sort(rvlut).tolist()})
        for h in range(H):
            c = slice(h * D, (h + 1) * D)
            row = {"layer": l, "head": h}
            # (a) thresholds: ours vs np.percentile (f32 or f64 as numpy returns it), and vs its
            # f16 rounding (what the reference quantizes with, SQ:L612-613).
            for nm, ours_t, ref_t in (("upper", ku[c], ru[c]), ("lower", kl[c], rl[c])):
                rel = np.abs(ours_t.astype(np.float64) - ref_t) / np.maximum(np.abs(ref_t), 1e-30)
                row[f"thr_{nm}_max_rel"] = float(rel.max())
                row[f"thr_{nm}_exact"] = float((ours_t == ref_t).mean())
                row[f"thr_{nm}_exact_f16"] = float((ours_t == np.float16(ref_t).astype(np.float32)).mean())
            for kind, ref, codes, mask, deq_ours, refc in (
                    ("k", rk, o["k_codes"], o["k_mask"], ok, ck_), ("v", rv, o["v_codes"], o["v_mask"], ov, cv_)):
                lut = klut if kind == "k" else vlut
                rcodes = ref["codes"][F:, c]
                row[f"{kind}_code_agree"] = float((rcodes == codes[:, c].astype(int)).mean())
                row[f"{kind}_jaccard"] = jaccard(ref["mask"][F:, c], mask[F:, c])
                step = local_step(lut, ref["codes"][F:, c], ref["range"][F:, c])
                d = np.abs(deq_ours[F:, c] - ref["deq"][F:, c]) / np.where(step > 0, step, 1)
                row[f"{kind}_deq_steps_max"] = float(d.max())
                # (c) against the reference's calibration.
                rl_ = rklut if kind == "k" else rvlut
                stepc = local_step(rl_, refc["codes"][F:, c], refc["range"][F:, c])
                dc = np.abs(deq_ours[F:, c] - refc["deq"][F:, c]) / np.where(stepc > 0, stepc, 1)
                row[f"{kind}_refcal_steps_max"] = float(dc.max())
                row[f"{kind}_refcal_steps_mean"] = float(dc.mean())
                row[f"{kind}_refcal_within_1"] = float((dc <= 1).mean())
                row[f"{kind}_refcal_code_agree"] = float(
                    (sorted_codes(refc["codes"][F:, c], rl_) == sorted_codes(codes[:, c].astype(int), lut)).mean())
                row[f"{kind}_refcal_jaccard"] = jaccard(refc["mask"][F:, c], mask[F:, c])
                row[f"{kind}_outliers"] = int(mask[F:, c].sum())
            table.append(row)
    keys = [k for k in table[0] if k not in ("layer", "head")]
    summary = {k: stats(table, k) for k in keys}
    summary["k_level_dist_max"] = stats(per_layer, "k_level_dist_max")
    summary["v_level_dist_max"] = stats(per_layer, "v_level_dist_max")
    for k in ("k_kmeans_sse_ours_over_ref", "v_kmeans_sse_ours_over_ref"):
        summary[k] = stats(per_layer, k)
    result = {"command": command, "meta": meta, "reference": "SqueezeAILab/KVQuant@57a2383",
              "sklearn": __import__("sklearn").__version__, "numpy": np.__version__,
              "summary": summary, "per_layer": per_layer, "per_layer_head": table}
    def compact(x):  # 7 significant digits, one row a line: the file stays small
        if isinstance(x, float):
            return float(f"{x:.7g}")
        if isinstance(x, dict):
            return {k: compact(v) for k, v in x.items()}
        if isinstance(x, list):
            return [compact(v) for v in x]
        return x
    with open(os.path.join(a.out_dir, f"kvquant_faithfulness_b{bits}.json"), "w") as f:
        r = compact(result)
        head = {k: v for k, v in r.items() if k not in ("per_layer", "per_layer_head")}
        f.write(json.dumps(head, indent=1)[:-2] + ",\n")
        for k in ("per_layer", "per_layer_head"):
            f.write(f' "{k}": [\n' + ",\n".join("  " + json.dumps(x) for x in r[k]) + "\n ]")
            f.write(",\n" if k == "per_layer" else "\n}\n")
    print(f"KVQuant-{bits} (sparsity {s}, first {F} f16, {n} prompt tokens, {L} layers x {H} KV heads): "
          "min / mean / max over (layer, head)")
    for k in keys + ["k_level_dist_max", "v_level_dist_max", "k_kmeans_sse_ours_over_ref",
                     "v_kmeans_sse_ours_over_ref"]:
        v = summary[k]
        print(f"  {k:26s} {v['min']:.6g} / {v['mean']:.6g} / {v['max']:.6g}")
    if a.golden_out:
        write_golden(a, dump, meta, ref_cal)


def write_golden(a, dump, meta, ref_cal):
    """The first T tokens of layers 0 and L-1 with the reference's calibration (its f16
    thresholds and its KMeans levels, ascending) and the transcription's results on them."""
    os.makedirs(a.golden_out, exist_ok=True)
    H, D, L, F, s, bits = (meta[k] for k in ("n_kv_heads", "head_dim", "n_layers", "first_fp16",
                                             "sparsity", "bits"))
    T = a.golden_tokens
    gmeta = {"tokens": T, "bits": bits, "sparsity": s, "first_fp16": F, "n_kv_heads": H, "head_dim": D,
             "layers": [0, L - 1],
             "source": f"{os.path.basename(a.model)}, the first {T} tokens of "
                       f"{os.path.relpath(a.text, ROOT)} (a {meta['n']}-token prompt, kvquant dump); "
                       "calibration: the reference's (np.percentile, sklearn KMeans) on qevict's "
                       "calibration activations"}
    for l in gmeta["layers"]:
        o = load_ours(dump, l, meta["n"], H * D, F)
        ru, rl, rklut, rvlut = ref_cal[l]
        k, v = o["k_in"][:T], o["v_in"][:T]
        u16, l16 = np.float16(ru).astype(np.float32), np.float16(rl).astype(np.float32)
        ks, vs = np.sort(rklut), np.sort(rvlut)
        rk = quantize_keys(k, u16, l16, ks, F)
        rv = quantize_values(v, vs, s, F)

        def save(what, x):
            np.save(os.path.join(a.golden_out, f"L{l}_{what}.npy"), x)
        save("k_in", k.astype(np.float32))
        save("v_in", v.astype(np.float32))
        save("calib_k", np.stack([u16, l16]).astype(np.float32))
        save("calib_lut", np.stack([ks, vs]).astype(np.float32))
        save("k_codes", rk["codes"][F:].astype(np.uint8))
        save("v_codes", rv["codes"][F:].astype(np.uint8))
        save("v_par", np.stack([rv["offset"][F:, 0], rv["range"][F:, 0]], axis=1).astype(np.float32))
        for kind, r, x in (("k", rk, k), ("v", rv, v)):
            t, ch = np.nonzero(r["mask"][F:])
            save(f"{kind}_out", np.stack([t + F, ch, x[t + F, ch]], axis=1).astype(np.float32).reshape(-1, 3))
    with open(os.path.join(a.golden_out, "meta.json"), "w") as f:
        json.dump(gmeta, f, indent=1)
    print(f"golden data for the CTest: {a.golden_out}")


if __name__ == "__main__":
    main()
