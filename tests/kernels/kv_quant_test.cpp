// KIVI-style window quantization: reconstruction error within half a stored step, exact
// constant channels, sizes that match the documented layout, partial windows.
#include "kernels/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/f16.h"

namespace qevict {
namespace {

struct QCase {
  int bits, heads, dim, window, group;
  int vbits = 0;   // the values' bits (0: bits)
  int kmeta = 16;  // the key scales' and zeros' bits (16: f16, 8: one-byte codes)
};

class KvQuant : public ::testing::TestWithParam<QCase> {};

TEST_P(KvQuant, ReconstructsWithinHalfAStep) {
  const QCase c = GetParam();
  QuantLayout L{c.bits, c.heads, c.dim, c.window, c.group, c.vbits, c.kmeta};
  ASSERT_TRUE(L.validate().is_ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int n_tokens : {c.window, c.window - 1 > 0 ? c.window - 1 : 1, 1}) {
    std::vector<float> k(size_t(c.window) * c.heads * c.dim), v(k.size());
    for (auto& x : k) x = dist(rng);
    for (auto& x : v) x = dist(rng);
    std::vector<uint8_t> win(L.window_bytes() + 1, 0xAB);
    quantize_window(L, k.data(), v.data(), n_tokens, win.data());
    EXPECT_EQ(win.back(), 0xAB) << "wrote past window_bytes()";
    const int k_levels = (1 << L.kb()) - 1, v_levels = (1 << L.vb()) - 1;
    for (int h = 0; h < c.heads; ++h) {
      std::vector<float> kd(size_t(n_tokens) * c.dim), vd(kd.size());
      dequantize_window_head(L, win.data(), h, n_tokens, kd.data(), vd.data());
      for (int ch = 0; ch < c.dim; ++ch) {
        float lo = INFINITY, hi = -INFINITY;
        for (int t = 0; t < n_tokens; ++t) {
          lo = std::min(lo, k[(size_t(t) * c.heads + h) * c.dim + ch]);
          hi = std::max(hi, k[(size_t(t) * c.heads + h) * c.dim + ch]);
        }
        // half a step of the (f16) scale, plus the f16 rounding of the zero-point and scale;
        // kmeta 8: half a step of the stored scale, at most 1/8 above the smallest whose grid
        // (levels + 1 points, the ends within half a step inside lo and hi) covers [lo, hi].
        double tol = (hi - lo) / k_levels * 0.5 * 1.01 + std::fabs(lo) * 1e-3 + 1e-6;
        if (L.kmeta == 8) {
          std::vector<float> s(c.dim), z(c.dim);
          key_params(L, win.data(), h, s.data(), z.data());
          const double bound =
              1.125 * std::max((hi - lo) / (k_levels + 0.5), std::fabs(lo) / 63.0) + 0x1p-19;
          ASSERT_LE(s[ch], bound * (1 + 1e-6)) << "key scale h" << h << " c" << ch;
          tol = s[ch] * 0.5 * (1 + 1e-6) + 1e-7 * std::fabs(lo);
        }
        for (int t = 0; t < n_tokens; ++t) {
          const float want = k[(size_t(t) * c.heads + h) * c.dim + ch],
                      got = kd[size_t(t) * c.dim + ch];
          ASSERT_NEAR(got, want, tol) << "key h" << h << " c" << ch << " t" << t;
        }
      }
      const int g = L.g();
      for (int t = 0; t < n_tokens; ++t)
        for (int g0 = 0; g0 < c.dim; g0 += g) {
          float lo = INFINITY, hi = -INFINITY;
          for (int ch = g0; ch < g0 + g; ++ch)
            lo = std::min(lo, v[(size_t(t) * c.heads + h) * c.dim + ch]),
            hi = std::max(hi, v[(size_t(t) * c.heads + h) * c.dim + ch]);
          const double tol = (hi - lo) / v_levels * 0.5 * 1.01 + std::fabs(lo) * 1e-3 + 1e-6;
          for (int ch = g0; ch < g0 + g; ++ch)
            ASSERT_NEAR(vd[size_t(t) * c.dim + ch], v[(size_t(t) * c.heads + h) * c.dim + ch], tol)
                << "value t" << t << " c" << ch;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvQuant,
                         ::testing::Values(QCase{2, 3, 64, 8, 0}, QCase{4, 3, 64, 8, 0},
                                           QCase{2, 1, 128, 8, 32}, QCase{2, 2, 8, 32, 4},
                                           QCase{4, 5, 12, 4, 6}, QCase{2, 1, 4, 1, 0},
                                           // keys and values at different bits
                                           QCase{4, 3, 64, 8, 0, 2}, QCase{2, 2, 8, 32, 4, 4},
                                           QCase{2, 5, 12, 4, 6, 4}, QCase{4, 1, 4, 1, 0, 2},
                                           // one-byte key scales and zeros
                                           QCase{4, 3, 64, 8, 0, 2, 8}, QCase{2, 3, 64, 8, 0, 2, 8},
                                           QCase{2, 2, 8, 32, 4, 4, 8},
                                           QCase{4, 1, 4, 1, 0, 2, 8}));

TEST(KvQuantLayout, BytesMatchTheDocumentedFormula) {
  QuantLayout L{2, 3, 64, 8, 0};
  // codes: 2 * 3*8*64*2/8 = 768; key params: 2*2*3*64 = 768; value params: 2*2*3*8*1 = 96
  EXPECT_EQ(L.window_bytes(), 768u + 768u + 96u);
  QuantLayout L4{4, 3, 64, 8, 0};
  EXPECT_EQ(L4.window_bytes(), 1536u + 768u + 96u);
  // 4-bit keys, 2-bit values: key codes 3*8*64*4/8 = 768, value codes 384.
  QuantLayout L42{4, 3, 64, 8, 0, 2};
  EXPECT_EQ(L42.window_bytes(), 768u + 384u + 768u + 96u);
  EXPECT_EQ(L42.v_codes_off(1) - L42.k_codes_off(1), 8u * 64 * 4 / 8);
  EXPECT_EQ(L42.k_scale_off(1) - L42.v_codes_off(1), 8u * 64 * 2 / 8);
  EXPECT_EQ((QuantLayout{2, 3, 64, 8, 0, 4}).window_bytes(), L42.window_bytes());
  EXPECT_FALSE((QuantLayout{3, 3, 64, 8, 0}).validate().is_ok());
  EXPECT_FALSE((QuantLayout{2, 3, 64, 8, 0, 3}).validate().is_ok());
  EXPECT_FALSE((QuantLayout{4, 3, 64, 8, 2, 2}).validate().is_ok());  // a group of 2 INT2 codes
  EXPECT_FALSE((QuantLayout{2, 3, 64, 8, 7}).validate().is_ok());
}

// kmeta 8: 128 bytes of key scales and zeros a head of 64 channels instead of 256 (K4V2 at
// head_dim 64 and 8-token windows: 544 bytes a window-head instead of 672; INT2 416).
TEST(KvQuantLayout, OneByteKeyParamsHalveTheirBytes) {
  const QuantLayout k4v2{4, 1, 64, 8, 0, 2}, k4v2m8{4, 1, 64, 8, 0, 2, 8};
  const QuantLayout int2m8{2, 1, 64, 8, 0, 2, 8};
  EXPECT_EQ(k4v2.window_bytes(), 672u);
  EXPECT_EQ(k4v2m8.window_bytes(), 544u);
  EXPECT_EQ(int2m8.window_bytes(), 416u);
  EXPECT_EQ(k4v2m8.k_zero_off(0) - k4v2m8.k_scale_off(0), 64u);
  EXPECT_EQ(k4v2m8.v_scale_off(0) - k4v2m8.k_zero_off(0), 64u);
  EXPECT_FALSE((QuantLayout{4, 1, 64, 8, 0, 2, 12}).validate().is_ok());
}

// The scale codes: 0-7 mean 0, then an 8-bit float increasing with its code from 2^-19 to 3840.
TEST(KvQuant, KeyScaleCodesIncreaseFromTheSmallestToTheLargest) {
  for (int c = 0; c < 8; ++c) EXPECT_EQ(key_scale_of_code(uint8_t(c)), 0.0f);
  EXPECT_EQ(key_scale_of_code(8), std::ldexp(1.0f, -19));
  EXPECT_EQ(key_scale_of_code(255), 3840.0f);
  EXPECT_EQ(key_scale_of_code(20 << 3), 1.0f);
  EXPECT_EQ(key_scale_of_code((20 << 3) | 4), 1.5f);
  for (int c = 9; c < 256; ++c)
    EXPECT_GT(key_scale_of_code(uint8_t(c)), key_scale_of_code(uint8_t(c - 1))) << c;
  EXPECT_EQ(key_zero_of_code(-128, 2.0f), -128.0f);
  EXPECT_EQ(key_zero_of_code(127, 0.5f), 31.75f);
}

// kmeta 8 where a channel is awkward for a one-byte zero: far from 0 against its spread (the
// scale grows to reach it: still within half a step, the step ≤ |lo|/63·1.125), constant, all
// zeros, tiny, and past the largest scale (clamped, finite).
TEST(KvQuant, OneByteKeyParamsOnAwkwardChannels) {
  const int d = 8;
  QuantLayout L{4, 1, d, 8, 0, 2, 8};
  std::vector<float> k(8 * d), v(8 * d, 0.5f);
  for (int t = 0; t < 8; ++t) {
    k[t * d + 0] = 50.0f + 0.1f * t;  // far from zero
    k[t * d + 1] = -50.0f - 0.1f * t;
    k[t * d + 2] = 3.0f;                      // constant
    k[t * d + 3] = 0.0f;                      // zeros
    k[t * d + 4] = 1e-7f * float(t);          // tiny
    k[t * d + 5] = t % 2 ? 1e6f : -1e6f;      // past the largest scale
    k[t * d + 6] = -0.25f + 0.5f * float(t);  // an ordinary one
    k[t * d + 7] = 0.001f * float(t) - 0.0035f;
  }
  std::vector<uint8_t> win(L.window_bytes());
  quantize_window(L, k.data(), v.data(), 8, win.data());
  std::vector<float> kd(8 * d), s(d), z(d);
  dequantize_window_head(L, win.data(), 0, 8, kd.data(), nullptr);
  key_params(L, win.data(), 0, s.data(), z.data());
  for (int c = 0; c < d; ++c) {
    for (int t = 0; t < 8; ++t) {
      EXPECT_TRUE(std::isfinite(kd[t * d + c])) << c;
      if (c == 5) continue;
      EXPECT_NEAR(kd[t * d + c], k[t * d + c], s[c] * 0.5 * (1 + 1e-6) + 1e-12)
          << "c" << c << " t" << t;
    }
  }
  EXPECT_LE(s[0], 50.0 / 63.0 * 1.125);
  EXPECT_LE(s[1], 50.7 / 63.0 * 1.125);
  EXPECT_EQ(s[3], 0.0f);
  EXPECT_EQ(kd[3], 0.0f);
  EXPECT_EQ(s[5], 3840.0f);  // saturated
  EXPECT_LE(s[6], 3.5 / 15.5 * 1.125 + 1e-6);
  EXPECT_GT(s[6], 3.5 / 15.5 * (1 - 1e-6));
}

TEST(KvQuant, ConstantChannelsReconstructExactly) {
  QuantLayout L{2, 1, 8, 8, 0};
  std::vector<float> k(64), v(64);
  for (int t = 0; t < 8; ++t)
    for (int c = 0; c < 8; ++c) {
      k[t * 8 + c] = f16_to_f32(f32_to_f16(0.37f * (c + 1)));  // constant over tokens, f16-exact
      v[t * 8 + c] = f16_to_f32(f32_to_f16(-1.25f * t));       // constant over the group
    }
  std::vector<uint8_t> win(L.window_bytes());
  quantize_window(L, k.data(), v.data(), 8, win.data());
  std::vector<float> kd(64), vd(64);
  dequantize_window_head(L, win.data(), 0, 8, kd.data(), vd.data());
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(kd[i], k[i]) << i;
    EXPECT_EQ(vd[i], v[i]) << i;
    EXPECT_TRUE(std::isfinite(kd[i]) && std::isfinite(vd[i]));
  }
}

TEST(KvQuant, QuantizationIsDeterministic) {
  QuantLayout L{2, 2, 16, 8, 0};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-5, 5);
  std::vector<float> k(256), v(256);
  for (auto& x : k) x = u(rng);
  for (auto& x : v) x = u(rng);
  std::vector<uint8_t> a(L.window_bytes()), b(L.window_bytes());
  quantize_window(L, k.data(), v.data(), 8, a.data());
  quantize_window(L, k.data(), v.data(), 8, b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace qevict
