// ZipCache's rule (He et al., NeurIPS 2024, arXiv 2405.14256; ThisisBillhe/ZipCache@b6932b9):
// mixed-precision quantization by normalized attention saliency, every token kept.
//
// Saliency (zipcache/models/modeling_llama.py:L775-797): at the end of the prompt (n tokens),
// probe queries are the last 5 % of the prompt, [int(n − 0.05 n), n), plus 5 % drawn at random
// from the rest; their causal softmax (f32) is summed over the query heads of each KV head and
// over the probes, and token t's sum is divided by n − t, the number of queries that can see it.
// Per KV head, the int(0.4 n) tokens of least saliency are "unimportant" (k_unimportant_ratio;
// values reuse the keys' choice). Deviation: the reference draws int(0.05 n) random probes with
// replacement; a cache that reads the prompt in chunks cannot keep every query until the prompt
// ends, so each earlier position is a probe with probability 0.05 / 0.95 (the same expected
// count), decided by a hash of (layer, position) and its query row kept when it is read.
//
// Quantizers (CompressUtils/compress_function.py), each set (important / unimportant) of a layer
// on its own, the set's tokens of KV head h taken in the set's order (important: by position;
// unimportant: by ascending saliency, as topk returns them) so that "row j" pairs the j-th
// token of every KV head (the reference gathers [H, m, D] and reshapes to [m, H·D]):
//   keys, mixed_channelwiseQ (L232-259): per column (h, channel) over the set's rows,
//     asymmetric min/max: step = (max − min) / (2^b − 1), code = round((x − min) / step);
//   values, channel_separate_mixed_tokenwiseQ (L645-686, L1434-1458): per column a scale
//     c = sqrt(max |x|) over every token of the layer (both sets: the reference divides the
//     whole value tensor by it before splitting it, L653-660); then per row of a set over all
//     H·D columns, min/max of x / c: code = round((x / c − min) / step),
//     x̂ = (code · step + min) · c.
// Important tokens get 4 bits, unimportant 2 (zipcache_generation_demo.py:L8-18). Parameters
// are kept in f16 and every step is rounded to f16, as the reference's float16 tensors do
// (inputs are f16: the cache's buffer and dequantized scratch), so codes match its codes.
//
// Decode (modeling_llama.py:L801-813, compress_class.py:L730-764, stream=True): new tokens
// wait in an f16 buffer; when `gap` (streaming_gap, 100) of them have come, the current query's
// softmax (unnormalized, summed over the group) marks the int(0.4 gap) least salient of them
// unimportant, and the whole cache is dequantized and quantized again with the sets extended.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace qevict {

struct ZipCacheConfig {
  int hi_bits = 4;                 // important tokens
  int lo_bits = 2;                 // unimportant tokens (--kv-bits)
  double unimportant_ratio = 0.4;  // k_unimportant_ratio = v_unimportant_ratio (--kv-q)
  double probe_ratio = 0.05;       // last 5 % + 5 % random probes
  int gap = 100;                   // streaming_gap (--kv-route-every)

  Status validate() const;
  // Unimportant tokens among m new ones: int(ratio · m) (python's int of a product).
  int64_t unimportant_count(int64_t m) const { return int64_t(unimportant_ratio * double(m)); }
  // The first of the last-5 % probes of an m-token prompt: int(m − 0.05 m).
  int64_t recent_probe_start(int64_t m) const {
    return int64_t(double(m) - probe_ratio * double(m));
  }
  // Whether position `pos` (an offset into the prompt) of `layer` is a random probe (used when
  // it lies before recent_probe_start).
  bool is_random_probe(int layer, int64_t pos) const;
};

// Indices of the k smallest scores, in ascending score order (ties: lower index first), the
// order torch.topk(largest=False) gives its indices.
std::vector<int32_t> zip_bottom_k(const float* score, int32_t n, int32_t k);

// One quantized set of one layer: m rows (row j holds the j-th token of the set of every KV
// head), kv_width columns, `bits`-bit codes packed per row (column c at bit c · bits).
struct ZipSet {
  int bits = 0;
  int64_t rows = 0;
  int cols = 0;
  std::vector<uint8_t> codes;      // rows · cols · bits / 8
  std::vector<uint16_t> col_a;     // keys: min per column (f16); values: unused
  std::vector<uint16_t> col_b;     // keys: step per column (f16); values: unused
  std::vector<uint16_t> row_min;   // values: min per row (f16)
  std::vector<uint16_t> row_step;  // values: step per row (f16)
  size_t bytes() const {
    return codes.size() + (col_a.size() + col_b.size() + row_min.size() + row_step.size()) * 2;
  }
};

// The values' column scales: f16 sqrt(max_j |x[j][c]|) over x (rows × cols f32, row-major: every
// token of the layer), into scale[cols].
void zip_value_scale(const float* x, int64_t rows, int cols, uint16_t* scale);
// Quantizes x (rows × cols f32, row-major) as ZipCache's keys (per column min/max) or values
// (divided by the layer's column scales `scale`, then per row min/max).
ZipSet zip_quantize_keys(const float* x, int64_t rows, int cols, int bits);
ZipSet zip_quantize_values(const float* x, int64_t rows, int cols, int bits, const uint16_t* scale);
// The code of element i (row j, column c: i = j · cols + c).
int zip_code(const ZipSet& s, int64_t i);
// x̂ of row j, column c.
float zip_dequant_key(const ZipSet& s, int64_t j, int c);
float zip_dequant_value(const ZipSet& s, const uint16_t* scale, int64_t j, int c);

// The bytes one layer holds after the rule with n_imp / n_unimp tokens per KV head quantized
// and `buffered` f16 tokens: codes, f16 parameters (the values' column scales once per layer),
// the per-head token lists (int32, what the reference keeps as index tensors) and the buffer.
size_t zipcache_layer_bytes(const ZipCacheConfig& c, int64_t n_imp, int64_t n_unimp,
                            int64_t buffered, int n_kv_heads, int head_dim);

}  // namespace qevict
