// KVQuant's rule (kvcache/policies/kvquant_policy.*) against a plain model written from the
// reference's description: percentiles by full sort, nearest levels by a scan, outliers and
// parameters as simquant_module_quantizer.py defines them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/f16.h"
#include "core/thread_pool.h"
#include "kernels/rope.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/kvquant_cache.h"
#include "kvcache/quantizers/kvquant_policy.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

// numpy.percentile(x, 100 f), linear, by sorting.
double np_percentile(std::vector<float> x, double f) {
  std::sort(x.begin(), x.end());
  const double idx = f * double(x.size() - 1);
  const size_t lo = size_t(std::floor(idx)), hi = std::min(lo + 1, x.size() - 1);
  return double(x[lo]) + (double(x[hi]) - double(x[lo])) * (idx - double(lo));
}

// The same as numpy 2 rounds it on f32 data: q = f32(100 f) / f32(100), the index (n − 1) q and
// the two-sided lerp (numpy's _lerp) in f32.
float np_percentile_f32(std::vector<float> x, double f) {
  std::sort(x.begin(), x.end());
  const float q = float(f * 100.0) / 100.0f, idx = float(x.size() - 1) * q;
  const size_t lo = size_t(std::floor(idx)), hi = std::min(lo + 1, x.size() - 1);
  const float g = idx - float(lo), a = x[lo], b = x[hi], d = b - a;
  return g >= 0.5f ? b - d * (1.0f - g) : a + d * g;
}

// torch.quantile(x, q), linear, as torch rounds it on f32 data: rank q (n − 1) in f32, one
// rounding of the interpolation.
float torch_quantile_f32(std::vector<float> x, double q) {
  std::sort(x.begin(), x.end());
  const float rank = float(q) * float(x.size() - 1);
  const size_t lo = size_t(rank), hi = std::min(lo + 1, x.size() - 1);
  return float(double(x[lo]) + double(rank - float(lo)) * (double(x[hi]) - double(x[lo])));
}

float f16r(float x) { return f16_to_f32(f32_to_f16(x)); }

// Heavy-tailed rows (Laplace) with per-channel scale and shift, as keys have.
std::vector<float> laplace_rows(int64_t n, int w, uint32_t seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<float> e(1.0f);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> x(static_cast<size_t>(n) * w);
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < w; ++c)
      x[size_t(i) * w + c] = (sign(rng) ? 1.0f : -1.0f) * e(rng) * (0.5f + 0.1f * float(c % 7)) +
                             0.3f * float(c % 5) - 0.6f;
  return x;
}

TEST(KvQuant, PercentileAndMedianMatchSortedDefinitions) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  for (int n : {1, 2, 3, 10, 193, 1000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = g(rng);
    for (double f : {0.0, 0.005, 0.25, 0.5, 0.995, 1.0}) {
      std::vector<float> y = x;
      const double want = np_percentile(x, f);  // in f64; the rank's f32 rounding moves it a bit
      EXPECT_NEAR(kvq_percentile(y.data(), n, f), want, 1e-5 * (1 + std::fabs(want)))
          << n << " " << f;
      y = x;
      EXPECT_EQ(kvq_percentile(y.data(), n, f), np_percentile_f32(x, f)) << n << " " << f;
      y = x;
      EXPECT_EQ(kvq_torch_quantile(y.data(), n, f), torch_quantile_f32(x, f)) << n << " " << f;
    }
    std::vector<float> s = x, y = x;
    std::sort(s.begin(), s.end());
    EXPECT_EQ(kvq_lower_median(y.data(), n), s[size_t((n - 1) / 2)]) << n;  // torch.median
  }
}

TEST(KvQuant, CodesPackAcrossByteBoundaries) {
  for (int bits : {2, 3, 4})
    for (int w : {1, 5, 13, 37, 64}) {
      std::vector<uint8_t> row(kvq_row_bytes(w, bits), 0);
      std::vector<int> want(static_cast<size_t>(w));
      for (int i = 0; i < w; ++i) {
        want[size_t(i)] = (i * 5 + 3) % (1 << bits);
        kvq_put_code(row.data(), i, bits, want[size_t(i)]);
      }
      for (int i = 0; i < w; ++i)
        ASSERT_EQ(kvq_get_code(row.data(), i, bits), want[size_t(i)])
            << bits << " " << w << " " << i;
    }
}

TEST(KvQuant, KMeansIsALloydFixedPointAndFindsSeparatedClusters) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 0.01f);
  std::vector<float> x;
  for (float m : {-0.8f, 0.1f, 0.7f})
    for (int i = 0; i < 300; ++i) x.push_back(m + g(rng));
  const std::vector<float> c3 = kvq_kmeans_1d(x, 3);
  EXPECT_NEAR(c3[0], -0.8f, 0.01f);
  EXPECT_NEAR(c3[1], 0.1f, 0.01f);
  EXPECT_NEAR(c3[2], 0.7f, 0.01f);
  // On spread data: ascending, and each level the mean of the points nearest to it.
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> y(5000);
  for (auto& v : y) v = u(rng) * std::fabs(u(rng));
  const std::vector<float> c = kvq_kmeans_1d(y, 8);
  ASSERT_EQ(c.size(), 8u);
  EXPECT_TRUE(std::is_sorted(c.begin(), c.end()));
  std::vector<double> sum(8, 0.0);
  std::vector<int> cnt(8, 0);
  for (float v : y) {
    const int j = kvq_nearest(c, v);
    sum[size_t(j)] += v;
    ++cnt[size_t(j)];
  }
  for (int j = 0; j < 8; ++j) {
    ASSERT_GT(cnt[size_t(j)], 0);
    EXPECT_NEAR(c[size_t(j)], sum[size_t(j)] / cnt[size_t(j)], 1e-3) << j;
  }
  // Fewer distinct values than levels: every value is a level.
  const std::vector<float> few = kvq_kmeans_1d({0.5f, 0.5f, -0.25f, 0.5f}, 8);
  EXPECT_EQ(few.front(), -0.25f);
  EXPECT_EQ(few.back(), 0.5f);
}

TEST(KvQuant, CalibrationThresholdsArePercentilesAndOutliersAreAboutOnePercent) {
  const int64_t n = 600;
  const int w = 24;
  const auto k = laplace_rows(n, w, 11), v = laplace_rows(n, w, 12);
  KvQuantConfig c;
  const KvQuantLayerCalib cal = kvquant_calibrate(c, k.data(), v.data(), n, w);
  ASSERT_EQ(cal.k_lut.size(), 8u);
  ASSERT_EQ(cal.v_lut.size(), 8u);
  EXPECT_TRUE(std::is_sorted(cal.k_lut.begin(), cal.k_lut.end()));
  for (float l : cal.k_lut) EXPECT_TRUE(l >= -1.0f && l <= 1.0f);
  int64_t outl = 0;
  for (int ch = 0; ch < w; ++ch) {
    std::vector<float> col(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) col[size_t(i)] = k[size_t(i) * w + ch];
    // In f16, as the reference quantizes with them.
    EXPECT_EQ(cal.k_upper[size_t(ch)], f16r(np_percentile_f32(col, c.upper_fraction())));
    EXPECT_EQ(cal.k_lower[size_t(ch)], f16r(np_percentile_f32(col, 1.0 - c.upper_fraction())));
    for (float x : col) outl += x > cal.k_upper[size_t(ch)] || x < cal.k_lower[size_t(ch)];
  }
  // 0.5 % above and 0.5 % below each channel's thresholds on the calibration data itself.
  EXPECT_NEAR(double(outl) / double(n * w), 0.01, 0.003);
}

TEST(KvQuant, LevelsLeaveOutTheFirstTokensButThresholdsDoNot) {
  // SimQuant.quantize (L465 vs L491-495): the first_few_fp16 tokens count in the percentiles,
  // not in the k-means. Row 0 here is far off, as a BOS token's activations are.
  const int64_t n = 400;
  const int w = 6;
  auto k = laplace_rows(n, w, 31), v = laplace_rows(n, w, 32);
  for (int ch = 0; ch < w; ++ch) k[size_t(ch)] = v[size_t(ch)] = 50.0f;
  for (int first : {0, 1, 3}) {
    KvQuantConfig c;
    c.first_fp16 = first;
    const KvQuantLayerCalib cal = kvquant_calibrate(c, k.data(), v.data(), n, w);
    std::vector<float> kn, vn;
    for (int ch = 0; ch < w; ++ch) {
      std::vector<float> col;
      for (int64_t i = 0; i < n; ++i) col.push_back(k[size_t(i) * w + ch]);
      const float u = np_percentile_f32(col, c.upper_fraction());
      const float l = np_percentile_f32(col, 1.0 - c.upper_fraction());
      EXPECT_EQ(cal.k_upper[size_t(ch)], f16r(u));
      for (int64_t i = first; i < n; ++i) {
        const float y = (col[size_t(i)] - 0.5f * (u + l)) / (0.5f * (u - l));
        if (y >= -1.0f && y <= 1.0f) kn.push_back(y);
      }
    }
    for (int64_t i = first; i < n; ++i) {
      const std::vector<float> row(v.begin() + i * w, v.begin() + (i + 1) * w);
      const float u = np_percentile_f32(row, c.upper_fraction());
      const float l = np_percentile_f32(row, 1.0 - c.upper_fraction());
      for (float x : row) {
        const float y = (x - 0.5f * (u + l)) / (0.5f * (u - l));
        if (y >= -1.0f && y <= 1.0f) vn.push_back(y);
      }
    }
    EXPECT_EQ(cal.k_lut, kvq_kmeans_1d(kn, 8)) << "first " << first;
    EXPECT_EQ(cal.v_lut, kvq_kmeans_1d(vn, 8)) << "first " << first;
  }
}

TEST(KvQuant, KeysAndValuesMatchThePlainRule) {
  const int64_t n = 300;
  for (int bits : {2, 3, 4})
    for (int w : {8, 21}) {
      KvQuantConfig c;
      c.bits = bits;
      const auto ck = laplace_rows(n, w, 21), cv = laplace_rows(n, w, 22);
      const KvQuantLayerCalib cal = kvquant_calibrate(c, ck.data(), cv.data(), n, w);
      const auto k = laplace_rows(40, w, 23), v = laplace_rows(40, w, 24);
      std::vector<uint8_t> codes(kvq_row_bytes(w, bits));
      std::vector<float> out(static_cast<size_t>(w)), scratch;
      auto nearest = [](const std::vector<float>& lut, float y) {  // the first on a tie
        size_t best = 0;
        for (size_t i = 1; i < lut.size(); ++i)
          if (std::fabs(y - lut[i]) < std::fabs(y - lut[best])) best = i;
        return lut[best];
      };
      for (int64_t t = 0; t < 40; ++t) {
        // Keys: the calibrated thresholds of each channel; strict outliers.
        const float* x = k.data() + t * w;
        std::vector<KvqOutlier> ol;
        kvquant_quantize_key(c, cal, x, w, codes.data(), &ol);
        kvquant_dequantize_key(c, cal, codes.data(), ol.data(), int(ol.size()), w, out.data());
        for (int ch = 0; ch < w; ++ch) {
          const float u = cal.k_upper[size_t(ch)], l = cal.k_lower[size_t(ch)];
          const float off = f16r(u + l) / 2, rng = f16r(u - l) / 2;  // f16 arithmetic
          const float want = (x[ch] > u || x[ch] < l)
                                 ? f16_to_f32(f32_to_f16(x[ch]))
                                 : nearest(cal.k_lut, (x[ch] - off) / rng) * rng + off;
          ASSERT_NEAR(out[size_t(ch)], want, 1e-5f * (1 + std::fabs(want)))
              << "key bits " << bits << " w " << w << " t " << t << " ch " << ch;
        }
        // Values: the token's own quantiles (non-strict), median-replaced outliers.
        const float* y = v.data() + t * w;
        std::vector<float> row(y, y + w), sorted = row;
        std::sort(sorted.begin(), sorted.end());
        const double tq = c.upper_fraction();
        const float vu = torch_quantile_f32(row, tq), vl = torch_quantile_f32(row, 1 - tq);
        const float med = sorted[size_t((w - 1) / 2)];
        float mx = -INFINITY, mn = INFINITY;
        int n_out = 0;
        for (float e : row) {
          const bool o = e >= vu || e <= vl;
          n_out += o;
          mx = std::max(mx, o ? med : e);
          mn = std::min(mn, o ? med : e);
        }
        EXPECT_GE(n_out, 2);  // the token's max and min at least
        // Codes from the f32 offset and range (the reference's), decoded with their f16.
        const float off32 = (mx + mn) / 2, rng32 = (mx - mn) / 2;
        const float off = f16r(off32), rng = f16r(rng32);
        std::vector<KvqOutlier> vo;
        uint16_t o16 = 0, r16 = 0;
        kvquant_quantize_value(c, cal, y, w, codes.data(), &o16, &r16, &vo, &scratch);
        EXPECT_EQ(int(vo.size()), n_out);
        EXPECT_EQ(f16_to_f32(o16), off);
        EXPECT_EQ(f16_to_f32(r16), rng);
        kvquant_dequantize_value(c, cal, codes.data(), o16, r16, vo.data(), int(vo.size()), w,
                                 out.data());
        for (int ch = 0; ch < w; ++ch) {
          const bool o = y[ch] >= vu || y[ch] <= vl;
          const float want = o ? f16_to_f32(f32_to_f16(y[ch]))
                               : nearest(cal.v_lut, (y[ch] - off32) / rng32) * rng + off;
          ASSERT_NEAR(out[size_t(ch)], want, 1e-5f * (1 + std::fabs(want)))
              << "value bits " << bits << " w " << w << " t " << t << " ch " << ch;
        }
      }
    }
}

TEST(KvQuant, AConstantTokenIsAllOutliersAndDecodesExactly) {
  KvQuantConfig c;
  const int w = 16;
  const auto ck = laplace_rows(100, w, 31);
  const KvQuantLayerCalib cal = kvquant_calibrate(c, ck.data(), ck.data(), 100, w);
  std::vector<float> x(static_cast<size_t>(w), 0.75f), out(static_cast<size_t>(w)), scratch;
  std::vector<uint8_t> codes(kvq_row_bytes(w, c.bits));
  std::vector<KvqOutlier> vo;
  uint16_t o16, r16;
  kvquant_quantize_value(c, cal, x.data(), w, codes.data(), &o16, &r16, &vo, &scratch);
  EXPECT_EQ(int(vo.size()), w);  // every element is both >= u and <= l
  kvquant_dequantize_value(c, cal, codes.data(), o16, r16, vo.data(), int(vo.size()), w,
                           out.data());
  for (float e : out) EXPECT_EQ(e, 0.75f);
}

TEST(KvQuant, LayerBytesCountWhatIsStored) {
  KvQuantConfig c;  // 3 bits, first token in f16
  const int w = 192;
  // 1 token f16 (192 · 2 · 2 B); 99 tokens: 2 · 72 B codes + 4 B params + 4 B counts; 50 pairs.
  EXPECT_EQ(kvquant_layer_bytes(c, 100, 50, w), size_t(768 + 99 * (144 + 4 + 4) + 50 * 4));
  EXPECT_EQ(kvquant_layer_bytes(c, 0, 0, w), 0u);
  EXPECT_TRUE(c.validate().is_ok());
  c.bits = 5;
  EXPECT_FALSE(c.validate().is_ok());
}

}  // namespace
}  // namespace qevict

// ---- The cache (kvcache/quantizers/kvquant_cache.h) ----

namespace qevict {
namespace {

struct KvqCacheFixture {
  KvShape s;
  KvCacheParams p;
  KvQuantConfig c;
  KvqCacheFixture() {
    s.n_layers = 2;
    s.n_kv_heads = 2;
    s.n_q_heads = 4;
    s.head_dim = 16;
    s.rope.n_rot = 16;
    s.rope.freq_base = 10000.0f;
    p.policy = "kvquant";
    EXPECT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
    c.bits = p.quant.bits;
    c.sparsity = 1.0 - p.quant.outlier_share;
    c.first_fp16 = p.quant.f16_first;
    auto cal = std::make_shared<std::vector<KvQuantLayerCalib>>();
    for (int l = 0; l < s.n_layers; ++l) {
      const auto k = laplace_rows(200, s.kv_width(), 40 + l),
                 v = laplace_rows(200, s.kv_width(), 50 + l);
      cal->push_back(kvquant_calibrate(c, k.data(), v.data(), 200, s.kv_width()));
    }
    p.quant.kvquant_calib = cal;
  }
};

TEST(KvQuantCache, StoresPreRopeCodesAndDecodesEachKeyAtItsPosition) {
  KvqCacheFixture f;
  EXPECT_EQ(f.c.bits, 3);  // the registry's defaults: 3 bits, 1 % outliers, first token f16
  EXPECT_EQ(f.c.first_fp16, 1);
  auto made = make_kv_cache(f.s, 64, f.p);
  ASSERT_TRUE(made.has_value()) << made.error();
  auto* cache = dynamic_cast<KvQuantCache*>(made->get());
  ASSERT_NE(cache, nullptr);
  ThreadPool pool(1);
  const int kvw = f.s.kv_width(), qw = f.s.q_width(), d = f.s.head_dim;
  std::mt19937 rng(7);
  std::normal_distribution<float> g;
  std::vector<std::vector<float>> K(2), V(2);  // what the model gave, post-RoPE keys
  for (int64_t n : {10, 1, 1, 5}) {
    ASSERT_TRUE(cache->begin(n).is_ok());
    for (int l = 0; l < 2; ++l) {
      std::vector<float> q(size_t(n) * qw), k(size_t(n) * kvw), v(size_t(n) * kvw), out(q.size());
      for (auto* x : {&q, &k, &v})
        for (float& e : *x) e = g(rng);
      cache->attend(l, q.data(), k.data(), v.data(), out.data(), pool);
      for (float e : out) ASSERT_TRUE(std::isfinite(e));
      K[size_t(l)].insert(K[size_t(l)].end(), k.begin(), k.end());
      V[size_t(l)].insert(V[size_t(l)].end(), v.begin(), v.end());
    }
    ASSERT_TRUE(cache->commit().is_ok());
  }
  const int64_t n = cache->n_past();
  ASSERT_EQ(n, 17);
  const int half = d / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half)),
      row(static_cast<size_t>(kvw)), dq(static_cast<size_t>(kvw)), scratch;
  std::vector<uint8_t> codes(kvq_row_bytes(kvw, f.c.bits));
  for (int l = 0; l < 2; ++l) {
    const KvQuantLayerCalib& cal = (*f.p.quant.kvquant_calib)[size_t(l)];
    std::vector<float> ek, ev;
    cache->export_layer(l, &ek, &ev);
    ASSERT_EQ(int64_t(ek.size()), n * kvw);
    for (int64_t t = 0; t < n; ++t) {
      const float* k = K[size_t(l)].data() + t * kvw;
      const float* v = V[size_t(l)].data() + t * kvw;
      if (t < f.c.first_fp16) {  // 16 bits, as given
        for (int c = 0; c < kvw; ++c) {
          ASSERT_EQ(ek[size_t(t * kvw + c)], f16_to_f32(f32_to_f16(k[c])));
          ASSERT_EQ(ev[size_t(t * kvw + c)], f16_to_f32(f32_to_f16(v[c])));
        }
        continue;
      }
      // Expected key: rotate back (direct cos/sin), quantize, decode, rotate forward.
      rope_cos_sin(f.s.rope, t, cs.data(), sn.data());
      std::copy(k, k + kvw, row.begin());
      rope_apply(f.s.rope, cs.data(), sn.data(), row.data(), f.s.n_kv_heads, d, d, true);
      std::vector<KvqOutlier> ol;
      kvquant_quantize_key(f.c, cal, row.data(), kvw, codes.data(), &ol);
      kvquant_dequantize_key(f.c, cal, codes.data(), ol.data(), int(ol.size()), kvw, dq.data());
      rope_apply(f.s.rope, cs.data(), sn.data(), dq.data(), f.s.n_kv_heads, d, d);
      for (int c = 0; c < kvw; ++c)
        ASSERT_NEAR(ek[size_t(t * kvw + c)], dq[size_t(c)], 2e-3f * (1 + std::fabs(dq[size_t(c)])))
            << "layer " << l << " token " << t << " channel " << c;
      std::vector<KvqOutlier> vo;
      uint16_t o16, r16;
      kvquant_quantize_value(f.c, cal, v, kvw, codes.data(), &o16, &r16, &vo, &scratch);
      kvquant_dequantize_value(f.c, cal, codes.data(), o16, r16, vo.data(), int(vo.size()), kvw,
                               dq.data());
      for (int c = 0; c < kvw; ++c)
        ASSERT_NEAR(ev[size_t(t * kvw + c)], dq[size_t(c)], 1e-3f * (1 + std::fabs(dq[size_t(c)])));
    }
    // Bytes: what the layer stores is exactly the formula's count.
    EXPECT_EQ(cache->layer_bytes(l), kvquant_layer_bytes(f.c, n, cache->layer_outliers(l), kvw));
  }
  KvReport r;
  cache->report(&r, ReportDetail::kSummary);
  EXPECT_EQ(r.policy, "kvquant");
  EXPECT_EQ(r.layers[0].windows_quant, n - 1);
  EXPECT_GE(r.bytes_held, cache->layer_bytes(0) + cache->layer_bytes(1));
  cache->clear();
  EXPECT_EQ(cache->n_past(), 0);
  EXPECT_EQ(cache->layer_bytes(0), 0u);
}

TEST(KvQuantCache, NeedsAFittingCalibrationAndRefusesOtherPoliciesFlags) {
  KvqCacheFixture f;
  KvCacheParams p = f.p;
  p.quant.kvquant_calib.reset();
  auto m = make_kv_cache(f.s, 64, p);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().find("calibration"), std::string::npos) << m.error();
  KvShape other = f.s;
  other.n_layers = 3;
  m = make_kv_cache(other, 64, f.p);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().find("3"), std::string::npos) << m.error();
  p = f.p;
  p.quant.bits = 4;  // levels fitted for 3 bits
  m = make_kv_cache(f.s, 64, p);
  ASSERT_FALSE(m.has_value());
  // A calibration assembled by hand without kvq_set_key_offsets.
  auto bare = std::make_shared<std::vector<KvQuantLayerCalib>>(*f.p.quant.kvquant_calib);
  for (KvQuantLayerCalib& l : *bare) l.k_offset.clear();
  p = f.p;
  p.quant.kvquant_calib = bare;
  m = make_kv_cache(f.s, 64, p);
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().find("calibration"), std::string::npos) << m.error();
  KvCacheParams q;
  q.policy = "kvquant";
  KvParamsGiven given;
  given.window = true;
  EXPECT_FALSE(apply_policy_defaults(&q, given).is_ok());
  q = KvCacheParams{};
  q.policy = "qevict";
  q.bits = 3;
  q.budget_fraction = 0.2;
  EXPECT_FALSE(q.validate().is_ok());  // 3 bits are kvquant's only
}

}  // namespace
}  // namespace qevict
