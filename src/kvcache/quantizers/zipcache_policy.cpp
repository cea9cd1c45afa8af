// ZipCache's rule (see zipcache_policy.h).
#include "kvcache/quantizers/zipcache_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/f16.h"

namespace qevict {

namespace {

// round() of torch: half to even.
float round_even(float x) { return std::nearbyint(x); }

// One float16 operation of the reference: the f32 result rounded to f16 (exact for + − × ÷ and
// sqrt of f16 operands: f32 carries more than twice f16's precision).
float h(float x) { return f16_to_f32(f32_to_f16(x)); }

void put_code(std::vector<uint8_t>& packed, int64_t i, int bits, uint8_t code) {
  const int64_t bit = i * bits;
  packed[size_t(bit >> 3)] |= uint8_t(code << (bit & 7));
}

uint8_t get_code(const std::vector<uint8_t>& packed, int64_t i, int bits) {
  const int64_t bit = i * bits;
  return uint8_t((packed[size_t(bit >> 3)] >> (bit & 7)) & ((1 << bits) - 1));
}

uint8_t quantize_code(float x, float mn, float step, int bits) {
  if (!(step > 0.0f)) return 0;  // a constant column/row: the reference divides 0 by 0
  const float q = round_even(h(h(x - mn) / step));
  return uint8_t(std::clamp(q, 0.0f, float((1 << bits) - 1)));
}

size_t packed_bytes(int64_t n, int bits) { return size_t((n * bits + 7) / 8); }

}  // namespace

Status ZipCacheConfig::validate() const {
  if (lo_bits != 2 && lo_bits != 4)
    return Status::error(
        fmt::format("zipcache: --kv-bits (low bits) must be 2 or 4, got {}", lo_bits));
  if (!(unimportant_ratio >= 0.0 && unimportant_ratio <= 1.0))
    return Status::error(fmt::format(
        "zipcache: the unimportant ratio (--kv-q) must be in [0, 1], got {}", unimportant_ratio));
  if (gap < 1)
    return Status::error(fmt::format(
        "zipcache: the streaming gap (--kv-route-every) must be positive, got {}", gap));
  return Status::ok();
}

bool ZipCacheConfig::is_random_probe(int layer, int64_t pos) const {
  // splitmix64 of (layer, pos): a fixed pseudo-random choice, the same in every run.
  uint64_t z = (uint64_t(uint32_t(layer)) << 40) ^ uint64_t(pos) ^ 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = double(z >> 11) * 0x1.0p-53;
  return u < probe_ratio / (1.0 - probe_ratio);
}

std::vector<int32_t> zip_bottom_k(const float* score, int32_t n, int32_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  k = std::clamp(k, 0, n);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return score[a] < score[b] || (score[a] == score[b] && a < b);
  });
  idx.resize(size_t(k));
  return idx;
}

ZipSet zip_quantize_keys(const float* x, int64_t rows, int cols, int bits) {
  ZipSet s;
  s.bits = bits;
  s.rows = rows;
  s.cols = cols;
  if (rows == 0) return s;  // an empty set holds nothing (no parameters either)
  s.codes.assign(packed_bytes(rows * cols, bits), 0);
  s.col_a.resize(size_t(cols));
  s.col_b.resize(size_t(cols));
  for (int c = 0; c < cols; ++c) {
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t j = 0; j < rows; ++j) {
      mn = std::min(mn, x[j * cols + c]);
      mx = std::max(mx, x[j * cols + c]);
    }
    const uint16_t mn16 = f32_to_f16(mn);
    const uint16_t step16 = f32_to_f16(h(mx - mn) / float((1 << bits) - 1));
    s.col_a[size_t(c)] = mn16;
    s.col_b[size_t(c)] = step16;
    const float mnf = f16_to_f32(mn16), stepf = f16_to_f32(step16);
    for (int64_t j = 0; j < rows; ++j)
      put_code(s.codes, j * cols + c, bits, quantize_code(x[j * cols + c], mnf, stepf, bits));
  }
  return s;
}

void zip_value_scale(const float* x, int64_t rows, int cols, uint16_t* scale) {
  for (int c = 0; c < cols; ++c) {
    float m = 0.0f;
    for (int64_t j = 0; j < rows; ++j) m = std::max(m, std::fabs(x[j * cols + c]));
    scale[c] = f32_to_f16(std::sqrt(m));
  }
}

ZipSet zip_quantize_values(const float* x, int64_t rows, int cols, int bits,
                           const uint16_t* scale) {
  ZipSet s;
  s.bits = bits;
  s.rows = rows;
  s.cols = cols;
  if (rows == 0) return s;
  s.codes.assign(packed_bytes(rows * cols, bits), 0);
  s.row_min.resize(size_t(rows));
  s.row_step.resize(size_t(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t j = 0; j < rows; ++j) {
    float mn = INFINITY, mx = -INFINITY;
    for (int c = 0; c < cols; ++c) {
      // A column of zeros has scale 0: its values are 0 (the reference's 0 / 0 is NaN).
      const float sc = f16_to_f32(scale[c]);
      row[size_t(c)] = sc > 0.0f ? h(x[j * cols + c] / sc) : 0.0f;
      mn = std::min(mn, row[size_t(c)]);
      mx = std::max(mx, row[size_t(c)]);
    }
    s.row_min[size_t(j)] = f32_to_f16(mn);
    s.row_step[size_t(j)] = f32_to_f16(h(mx - mn) / float((1 << bits) - 1));
    const float mnf = f16_to_f32(s.row_min[size_t(j)]);
    const float stepf = f16_to_f32(s.row_step[size_t(j)]);
    for (int c = 0; c < cols; ++c)
      put_code(s.codes, j * cols + c, bits, quantize_code(row[size_t(c)], mnf, stepf, bits));
  }
  return s;
}

int zip_code(const ZipSet& s, int64_t i) { return get_code(s.codes, i, s.bits); }

float zip_dequant_key(const ZipSet& s, int64_t j, int c) {
  return float(get_code(s.codes, j * s.cols + c, s.bits)) * f16_to_f32(s.col_b[size_t(c)]) +
         f16_to_f32(s.col_a[size_t(c)]);
}

float zip_dequant_value(const ZipSet& s, const uint16_t* scale, int64_t j, int c) {
  const float x =
      float(get_code(s.codes, j * s.cols + c, s.bits)) * f16_to_f32(s.row_step[size_t(j)]) +
      f16_to_f32(s.row_min[size_t(j)]);
  return x * f16_to_f32(scale[c]);
}

size_t zipcache_layer_bytes(const ZipCacheConfig& c, int64_t n_imp, int64_t n_unimp,
                            int64_t buffered, int n_kv_heads, int head_dim) {
  const int64_t cols = int64_t(n_kv_heads) * head_dim;
  size_t b = 0;
  for (auto [rows, bits] : {std::pair{n_imp, c.hi_bits}, std::pair{n_unimp, c.lo_bits}}) {
    if (rows == 0) continue;
    b += 2 * packed_bytes(rows * cols, bits);  // key and value codes
    b += size_t(cols) * 2 * 2;                 // key min and step per column
    b += size_t(rows) * 2 * 2;                 // value min and step per row
  }
  if (n_imp + n_unimp > 0) b += size_t(cols) * 2;               // the values' column scales
  b += size_t(n_imp + n_unimp) * n_kv_heads * sizeof(int32_t);  // the token lists
  b += size_t(buffered) * cols * 2 * 2;                         // f16 keys and values
  return b;
}

}  // namespace qevict
