// KVQuant's rule (Hooper et al., NeurIPS 2024, arXiv 2401.18079; SqueezeAILab/KVQuant@57a2383,
// quant/kvquant/simquant_module_quantizer.py and quant/llama_simquant.py): non-uniform 3-bit
// keys and values with dense-and-sparse outliers, every token kept.
//
// Calibration, offline, per layer (SimQuant.quantize, L411-530), on a calibration text:
//   keys (k_proj output, so pre-RoPE), per channel: thresholds u / l = the t and 1 − t
//     percentiles over the calibration tokens (numpy.percentile, linear), t = 1 − (1 − s)/2 for
//     the sparsity threshold s (0.99: t = 0.995); normalized x̂ = (x − (u+l)/2) / ((u−l)/2);
//     stored in f16, as QuantLinearSim holds them (L612-613);
//   values (v_proj output), per token: the same over the token's channels (all KV heads);
//   the levels ("NUQ LUT", one for the keys and one for the values of a layer): 2^b centroids
//     of the normalized values inside [−1, 1] (outliers and the first `first_fp16` tokens
//     excluded, L491-495), 1-D k-means, 50 iterations.
//   Deviations: sklearn's KMeans starts from k-means++ (random_state 0) and the reference
//     weights the points by Fisher information (gradients of the model, which a CPU inference
//     engine does not have); here the k-means is unweighted and starts at the 2^b quantiles
//     (deterministic), so the levels differ slightly from the reference's on the same data.
//     Q-Norm (the reference's option, mainly for 2 bits) is not built.
// Quantization, online (QuantLinearSim.forward and quant_fn_nuq_recon, include_sparse):
//   keys: the calibrated u / l of each channel (f16); an element above u or below l is an
//     outlier (get_outliers, strict) and kept exactly in a sparse list; the others get the index
//     of the nearest level of (x − offset) / range (the first on a tie; offset and range in f16
//     arithmetic, L318-319) and decode to level · range + offset;
//   values: per token, u / l = torch.quantile of the token's channels at t and 1 − t; an element
//     ≥ u or ≤ l is an outlier (get_outliers_dynamic, non-strict: every token has at least two);
//     the outliers are replaced by the token's median (torch.median: the lower middle value) and
//     offset / range (f32) come from the min / max of the result; then as the keys; offset
//     and range are stored in f16 and decoding uses those.
//   The first `first_fp16` tokens stay in 16 bits (--first_few_fp16, the attention sink).
// Storage (the deployment's layout, deployment/transformers/.../modeling_llama.py:L392-406):
// codes packed at b bits per element; per token the values' offset and range (f16); the outliers
// as (channel: u16, value: f16) pairs with a per-token count. The parameters of the keys and the
// levels are per layer (f32), negligible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace qevict {

struct KvQuantConfig {
  int bits = 3;            // --abits (2, 3 or 4)
  double sparsity = 0.99;  // --sparsity-threshold: ~1 % outliers
  int first_fp16 = 1;      // --first_few_fp16 (the DBRX recipe's 1; the README's example is 5)

  Status validate() const;
  // t = 1 − (1 − s) / 2: the upper percentile (as a fraction) of the outlier thresholds.
  double upper_fraction() const { return 1.0 - (1.0 - sparsity) / 2.0; }
};

// One layer's calibration. Keys are pre-RoPE.
struct KvQuantLayerCalib {
  std::vector<float> k_upper, k_lower;  // f32 [kv_width]
  std::vector<float> k_lut, v_lut;      // f32 [2^bits], ascending
  // Each key channel's offset and range from its thresholds (kvq_key_offset_range), computed
  // once by kvq_set_key_offsets rather than on every token: f32 [kv_width].
  std::vector<float> k_offset, k_range;
};

// numpy.percentile(x, 100·f) with linear interpolation (f in [0, 1]) on f32 data, rounded as
// numpy 2 computes it: q = f32(100·f) / f32(100), index (n − 1)·q and the two-sided lerp
// (numpy's _lerp) in f32; x is reordered.
float kvq_percentile(float* x, int64_t n, double f);
// torch.quantile(x, q) (linear) on f32 data, rounded as torch computes it (2.9, checked on the
// engine's values): rank q·(n − 1) in f32, the interpolation rounded once; x is reordered.
float kvq_torch_quantile(float* x, int64_t n, double q);
// torch.median: the lower of the two middle values when n is even; x is reordered.
float kvq_lower_median(float* x, int64_t n);
// 1-D k-means of x into k levels (Lloyd's iterations from the k quantiles, at most max_iter;
// an empty cluster keeps its level), ascending. Fewer than k distinct values: the distinct
// values, then copies of the largest.
std::vector<float> kvq_kmeans_1d(std::vector<float> x, int k, int max_iter = 50);

// Fits one layer from n calibration tokens: k (pre-RoPE keys) and v, f32 [n][kv_width].
KvQuantLayerCalib kvquant_calibrate(const KvQuantConfig& c, const float* k, const float* v,
                                    int64_t n, int kv_width);

// An element kept exactly: its channel and value (f16).
struct KvqOutlier {
  uint16_t channel;
  uint16_t value;
};

// The offset (u + l)/2 and range (u − l)/2 of a key channel with thresholds u, l, computed in
// f16 as the reference does on its f16 thresholds (quant_fn_nuq_recon L318-319).
void kvq_key_offset_range(float u, float l, float* offset, float* range);
// Fills cal->k_offset / k_range from its thresholds (kvquant_calibrate does; a calibration
// assembled by hand must too: the cache factory refuses one without them).
void kvq_set_key_offsets(KvQuantLayerCalib* cal);

// The index of the level nearest to x (the first on a tie).
int kvq_nearest(const std::vector<float>& lut, float x);

// Packs `code` (bits wide) as element i of a row (bit offset i · bits; codes may straddle bytes).
void kvq_put_code(uint8_t* row, int64_t i, int bits, int code);
int kvq_get_code(const uint8_t* row, int64_t i, int bits);
inline size_t kvq_row_bytes(int kv_width, int bits) { return size_t(kv_width * bits + 7) / 8; }

// Quantizes one token's pre-RoPE key row x (f32 [kv_width]) with the layer's thresholds and
// levels: codes into `codes` (kvq_row_bytes, zeroed here), outliers appended to `out`.
void kvquant_quantize_key(const KvQuantConfig& c, const KvQuantLayerCalib& cal, const float* x,
                          int kv_width, uint8_t* codes, std::vector<KvqOutlier>* out);
// The same for a value row with its own thresholds: offset and range (f16) written out.
// `scratch` is working memory (2 · kv_width floats).
void kvquant_quantize_value(const KvQuantConfig& c, const KvQuantLayerCalib& cal, const float* x,
                            int kv_width, uint8_t* codes, uint16_t* offset, uint16_t* range,
                            std::vector<KvqOutlier>* out, std::vector<float>* scratch);
// Decodes a row: level · range + offset per channel (keys: the channel's calibrated offset and
// range; values: the token's), then the outliers' exact values. out: f32 [kv_width].
void kvquant_dequantize_key(const KvQuantConfig& c, const KvQuantLayerCalib& cal,
                            const uint8_t* codes, const KvqOutlier* outliers, int n_outliers,
                            int kv_width, float* out);
void kvquant_dequantize_value(const KvQuantConfig& c, const KvQuantLayerCalib& cal,
                              const uint8_t* codes, uint16_t offset, uint16_t range,
                              const KvqOutlier* outliers, int n_outliers, int kv_width, float* out);

// Bytes of one layer holding n tokens with `outliers` outliers (keys and values together):
// the first tokens in f16, the others' codes, value offset/range, outlier pairs and a u16
// outlier count per token and tensor.
size_t kvquant_layer_bytes(const KvQuantConfig& c, int64_t n, int64_t outliers, int kv_width);

}  // namespace qevict
