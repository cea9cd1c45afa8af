// KVQuant's rule (see kvquant_policy.h). Reference path: plain loops, f32 arithmetic (the
// quantiles rounded as numpy and torch round them).
#include "kvcache/quantizers/kvquant_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/f16.h"

namespace qevict {

Status KvQuantConfig::validate() const {
  if (bits < 2 || bits > 4)
    return Status::error(fmt::format("kvquant: --kv-bits must be 2, 3 or 4, got {}", bits));
  if (!(sparsity > 0.5 && sparsity <= 1.0))
    return Status::error(
        fmt::format("kvquant: the sparsity threshold must be in (0.5, 1], got {}", sparsity));
  if (first_fp16 < 0)
    return Status::error(
        fmt::format("kvquant: the 16-bit first tokens must be >= 0, got {}", first_fp16));
  return Status::ok();
}

namespace {

// The order statistics lo and lo + 1 (clamped to n − 1) of x (reordered).
std::pair<float, float> kth_pair(float* x, int64_t n, int64_t lo) {
  std::nth_element(x, x + lo, x + n);
  return {x[lo], lo + 1 < n ? *std::min_element(x + lo + 1, x + n) : x[lo]};
}

}  // namespace

float kvq_percentile(float* x, int64_t n, double f) {
  if (n <= 0) return 0.0f;
  // numpy.percentile divides the percentile by float32(100) for f32 data, then works in f32.
  const float q = float(f * 100.0) / 100.0f;
  const float idx = float(n - 1) * q;
  const int64_t lo = std::min<int64_t>(n - 1, int64_t(std::floor(idx)));
  const auto [a, b] = kth_pair(x, n, lo);
  const float g = idx - float(lo), diff = b - a;
  return g >= 0.5f ? b - diff * (1.0f - g) : a + diff * g;  // numpy's _lerp
}

float kvq_torch_quantile(float* x, int64_t n, double q) {
  if (n <= 0) return 0.0f;
  const float rank = float(q) * float(n - 1);
  const int64_t lo = std::min<int64_t>(n - 1, int64_t(rank));
  const auto [a, b] = kth_pair(x, n, lo);
  const double w = double(rank - float(lo));
  return float(double(a) + w * (double(b) - double(a)));
}

float kvq_lower_median(float* x, int64_t n) {
  if (n <= 0) return 0.0f;
  const int64_t mid = (n - 1) / 2;
  std::nth_element(x, x + mid, x + n);
  return x[mid];
}

std::vector<float> kvq_kmeans_1d(std::vector<float> x, int k, int max_iter) {
  std::vector<float> c(size_t(k), 0.0f);
  if (x.empty()) return c;
  std::sort(x.begin(), x.end());
  const int64_t n = int64_t(x.size());
  for (int i = 0; i < k; ++i) {  // the k quantiles (i + 0.5) / k
    const int64_t j = std::min<int64_t>(n - 1, int64_t((double(i) + 0.5) / k * double(n)));
    c[size_t(i)] = x[size_t(j)];
  }
  std::vector<double> prefix(size_t(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + double(x[size_t(i)]);
  for (int it = 0; it < max_iter; ++it) {
    // With sorted levels, cluster i holds the points between the midpoints to its neighbours
    // (a point on a midpoint goes to the lower level, as kvq_nearest does).
    std::sort(c.begin(), c.end());
    bool moved = false;
    int64_t begin = 0;
    for (int i = 0; i < k; ++i) {
      int64_t end = n;
      if (i + 1 < k) {
        const float mid = 0.5f * (c[size_t(i)] + c[size_t(i) + 1]);
        end = int64_t(std::upper_bound(x.begin() + begin, x.end(), mid) - x.begin());
      }
      if (end > begin) {
        const float m = float((prefix[size_t(end)] - prefix[size_t(begin)]) / double(end - begin));
        if (m != c[size_t(i)]) moved = true;
        c[size_t(i)] = m;
      }
      begin = end;
    }
    if (!moved) break;
  }
  std::sort(c.begin(), c.end());
  return c;
}

namespace {

float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// Normalized values inside [−1, 1] of x (n values) for thresholds u, l, appended to out.
void collect_normalized(const float* x, int64_t n, int64_t stride, float u, float l,
                        std::vector<float>* out) {
  const float off = 0.5f * (u + l), rng = 0.5f * (u - l);
  if (!(rng > 0.0f)) return;  // a constant channel or token: nothing to fit
  for (int64_t i = 0; i < n; ++i) {
    const float y = (x[i * stride] - off) / rng;
    if (y >= -1.0f && y <= 1.0f) out->push_back(y);
  }
}

}  // namespace

KvQuantLayerCalib kvquant_calibrate(const KvQuantConfig& c, const float* k, const float* v,
                                    int64_t n, int kv_width) {
  KvQuantLayerCalib cal;
  const double t = c.upper_fraction();
  cal.k_upper.resize(size_t(kv_width));
  cal.k_lower.resize(size_t(kv_width));
  std::vector<float> col(static_cast<size_t>(n)), kn, vn;
  kn.reserve(size_t(n) * kv_width);
  vn.reserve(size_t(n) * kv_width);
  // The first tokens (kept in f16 when quantizing) take part in the thresholds but not in the
  // levels (SimQuant.quantize, L465 vs L491-495).
  const int64_t skip = std::min<int64_t>(n, std::max(0, c.first_fp16));
  for (int ch = 0; ch < kv_width; ++ch) {  // keys: per channel over the tokens
    for (int64_t i = 0; i < n; ++i) col[size_t(i)] = k[i * kv_width + ch];
    const float u = kvq_percentile(col.data(), n, t);
    const float l = kvq_percentile(col.data(), n, 1.0 - t);
    // Quantization uses the thresholds in f16 (QuantLinearSim.__init__, L612-613); the levels
    // are fitted with them as computed (L477-488).
    cal.k_upper[size_t(ch)] = round_f16(u);
    cal.k_lower[size_t(ch)] = round_f16(l);
    collect_normalized(k + skip * kv_width + ch, n - skip, kv_width, u, l, &kn);
  }
  std::vector<float> row(static_cast<size_t>(kv_width));
  for (int64_t i = skip; i < n; ++i) {  // values: per token over the channels
    const float* r = v + i * kv_width;
    std::copy(r, r + kv_width, row.begin());
    const float u = kvq_percentile(row.data(), kv_width, t);
    const float l = kvq_percentile(row.data(), kv_width, 1.0 - t);
    collect_normalized(r, kv_width, 1, u, l, &vn);
  }
  cal.k_lut = kvq_kmeans_1d(std::move(kn), 1 << c.bits);
  cal.v_lut = kvq_kmeans_1d(std::move(vn), 1 << c.bits);
  kvq_set_key_offsets(&cal);
  return cal;
}

void kvq_key_offset_range(float u, float l, float* offset, float* range) {
  *offset = round_f16(round_f16(u + l) * 0.5f);
  *range = round_f16(round_f16(u - l) * 0.5f);
}

void kvq_set_key_offsets(KvQuantLayerCalib* cal) {
  const size_t n = cal->k_upper.size();
  cal->k_offset.resize(n);
  cal->k_range.resize(n);
  for (size_t ch = 0; ch < n; ++ch)
    kvq_key_offset_range(cal->k_upper[ch], cal->k_lower[ch], &cal->k_offset[ch], &cal->k_range[ch]);
}

int kvq_nearest(const std::vector<float>& lut, float x) {
  int best = 0;
  float bd = std::fabs(x - lut[0]);
  for (int i = 1; i < int(lut.size()); ++i) {
    const float d = std::fabs(x - lut[size_t(i)]);
    if (d < bd) bd = d, best = i;
  }
  return best;
}

void kvq_put_code(uint8_t* row, int64_t i, int bits, int code) {
  const int64_t bit = i * bits;
  const int sh = int(bit & 7);
  const unsigned v = unsigned(code) << sh;  // at most 4 + 7 bits: two bytes
  row[bit >> 3] |= uint8_t(v);
  if (sh + bits > 8) row[(bit >> 3) + 1] |= uint8_t(v >> 8);
}

int kvq_get_code(const uint8_t* row, int64_t i, int bits) {
  const int64_t bit = i * bits;
  const int sh = int(bit & 7);
  unsigned v = row[bit >> 3];
  if (sh + bits > 8) v |= unsigned(row[(bit >> 3) + 1]) << 8;
  return int((v >> sh) & ((1u << bits) - 1));
}

void kvquant_quantize_key(const KvQuantConfig& c, const KvQuantLayerCalib& cal, const float* x,
                          int kv_width, uint8_t* codes, std::vector<KvqOutlier>* out) {
  std::fill(codes, codes + kvq_row_bytes(kv_width, c.bits), uint8_t(0));
  const int zero = kvq_nearest(cal.k_lut, 0.0f);  // an outlier's place holds 0 (reference)
  for (int ch = 0; ch < kv_width; ++ch) {
    const float u = cal.k_upper[size_t(ch)], l = cal.k_lower[size_t(ch)];
    const float off = cal.k_offset[size_t(ch)], rng = cal.k_range[size_t(ch)];
    if (x[ch] > u || x[ch] < l) {
      out->push_back({uint16_t(ch), f32_to_f16(x[ch])});
      kvq_put_code(codes, ch, c.bits, zero);
    } else {
      kvq_put_code(codes, ch, c.bits,
                   rng > 0.0f ? kvq_nearest(cal.k_lut, (x[ch] - off) / rng) : zero);
    }
  }
}

void kvquant_quantize_value(const KvQuantConfig& c, const KvQuantLayerCalib& cal, const float* x,
                            int kv_width, uint8_t* codes, uint16_t* offset, uint16_t* range,
                            std::vector<KvqOutlier>* out, std::vector<float>* scratch) {
  std::fill(codes, codes + kvq_row_bytes(kv_width, c.bits), uint8_t(0));
  scratch->resize(size_t(kv_width) * 2);
  float* s = scratch->data();
  const double t = c.upper_fraction();
  std::copy(x, x + kv_width, s);
  const float u = kvq_torch_quantile(s, kv_width, t);
  const float l = kvq_torch_quantile(s, kv_width, 1.0 - t);
  const float med = kvq_lower_median(s, kv_width);
  // Outliers (non-strict) become the median; offset and range from the min / max of the rest.
  float mx = -INFINITY, mn = INFINITY;
  for (int ch = 0; ch < kv_width; ++ch) {
    const float y = (x[ch] >= u || x[ch] <= l) ? med : x[ch];
    mx = std::max(mx, y);
    mn = std::min(mn, y);
  }
  // The codes are chosen with the f32 offset and range, as the reference (quant_fn_nuq_recon,
  // L318-336); they are stored in f16 (the deployment's layout) and decoded with those.
  const float off = 0.5f * (mx + mn), rng = 0.5f * (mx - mn);
  *offset = f32_to_f16(off);
  *range = f32_to_f16(rng);
  const int zero = kvq_nearest(cal.v_lut, 0.0f);
  for (int ch = 0; ch < kv_width; ++ch) {
    if (x[ch] >= u || x[ch] <= l) {
      out->push_back({uint16_t(ch), f32_to_f16(x[ch])});
      kvq_put_code(codes, ch, c.bits, zero);
    } else {
      kvq_put_code(codes, ch, c.bits,
                   rng > 0.0f ? kvq_nearest(cal.v_lut, (x[ch] - off) / rng) : zero);
    }
  }
}

void kvquant_dequantize_key(const KvQuantConfig& c, const KvQuantLayerCalib& cal,
                            const uint8_t* codes, const KvqOutlier* outliers, int n_outliers,
                            int kv_width, float* out) {
  for (int ch = 0; ch < kv_width; ++ch)
    out[ch] = cal.k_lut[size_t(kvq_get_code(codes, ch, c.bits))] * cal.k_range[size_t(ch)] +
              cal.k_offset[size_t(ch)];
  for (int j = 0; j < n_outliers; ++j) out[outliers[j].channel] = f16_to_f32(outliers[j].value);
}

void kvquant_dequantize_value(const KvQuantConfig& c, const KvQuantLayerCalib& cal,
                              const uint8_t* codes, uint16_t offset, uint16_t range,
                              const KvqOutlier* outliers, int n_outliers, int kv_width,
                              float* out) {
  const float off = f16_to_f32(offset), rng = f16_to_f32(range);
  for (int ch = 0; ch < kv_width; ++ch)
    out[ch] = cal.v_lut[size_t(kvq_get_code(codes, ch, c.bits))] * rng + off;
  for (int j = 0; j < n_outliers; ++j) out[outliers[j].channel] = f16_to_f32(outliers[j].value);
}

size_t kvquant_layer_bytes(const KvQuantConfig& c, int64_t n, int64_t outliers, int kv_width) {
  const int64_t first = std::min<int64_t>(n, c.first_fp16), m = n - first;
  return size_t(first) * kv_width * 2 * sizeof(uint16_t) +   // K and V in f16
         size_t(m) * (2 * kvq_row_bytes(kv_width, c.bits) +  // K and V codes
                      2 * sizeof(uint16_t) +                 // V offset, range
                      2 * sizeof(uint16_t)) +                // outlier counts
         size_t(outliers) * sizeof(KvqOutlier);
}

}  // namespace qevict
