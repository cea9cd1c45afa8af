// SIMD low-bit window decoding (kernels/lowbit.h) against the scalar references
// (ref/lowbit_ref.h): INT2/INT4, head dims that are not a multiple of the SIMD width, value
// groups smaller than a vector, both RoPE styles, partial rotation (n_rot < head_dim),
// windows of 1..32 tokens, partial windows; sentinels after every output row.
#include "kernels/lowbit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/f16.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"
#include "kernels/ref/lowbit_ref.h"
#include "kernels/ref/ops_ref.h"

namespace qevict {
namespace {

struct LbShape {
  int bits, d, window, group, n_rot;
  RopeStyle style;
  int vbits = 0;   // the values' bits (0: bits)
  int kmeta = 16;  // the key scales' and zeros' bits (16: f16, 8: codes)
};

constexpr float kSentinel = 12345.0f;

class LowbitDecode : public ::testing::TestWithParam<LbShape> {};

TEST_P(LowbitDecode, MatchesScalarReference) {
  const LbShape sh = GetParam();
  const int H = 3, h = 2, d = sh.d, W = sh.window;
  QuantLayout L{sh.bits, H, d, W, sh.group, sh.vbits, sh.kmeta};
  ASSERT_TRUE(L.validate().is_ok());
  RopeParams rp;
  rp.style = sh.style;
  rp.n_rot = sh.n_rot;
  rp.freq_base = 10000.0f;
  const RopeTable rope(rp, d, 1 << 17);
  std::mt19937 rng(1234);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> k(size_t(W) * H * d), v(k.size());
  for (auto& x : k) x = 3.0f * dist(rng);
  for (auto& x : v) x = dist(rng);
  // row0: the in-window rotation, one starting deep in the table's first level (a window
  // there crosses into the composed rows past 256), one past it.
  for (int row0 : {0, 249, 700})
    for (int n : {W, (W + 1) / 2, 1}) {
      std::vector<uint8_t> win(L.window_bytes() + 1);  // +1: misaligned start
      quantize_window(L, k.data(), v.data(), n, win.data() + 1);
      const uint8_t* w = win.data() + 1;
      const int64_t ld = d + 3;
      std::vector<float> gk(size_t(n) * ld, kSentinel), gv(gk.size(), kSentinel);
      std::vector<float> rk(size_t(n) * ld, 0.0f), rv(rk.size(), 0.0f);
      qwin_keys(L, w, h, n, rope, row0, gk.data(), ld);
      qwin_values(L, w, h, n, gv.data(), ld);
      ref::qwin_keys(L, w, h, n, rp, row0, rk.data(), ld);
      ref::qwin_values(L, w, h, n, rv.data(), ld);
      for (int t = 0; t < n; ++t) {
        for (int c = d; c < ld; ++c) {
          ASSERT_EQ(gk[t * ld + c], kSentinel) << "key row " << t << " written past head_dim";
          ASSERT_EQ(gv[t * ld + c], kSentinel) << "value row " << t << " written past head_dim";
        }
        // Values: one multiply-add of exact codes, the same rounding as the reference except
        // for FMA contraction: within one rounding of |s·code| + |z|.
        for (int c = 0; c < d; ++c) {
          const float a = gv[t * ld + c], b = rv[t * ld + c];
          ASSERT_NEAR(a, b, 2e-7f * (std::fabs(b) + 4.0f)) << "value t " << t << " c " << c;
        }
        // Keys: decode (one rounding) then a rotation with float cos/sin from the table vs
        // double-computed ones (a few roundings each): |error| <= 8·2^-24·(|k_a| + |k_b|) per
        // output, bounded here with the row's max |k|.
        float kmax = 0;
        for (int c = 0; c < d; ++c) kmax = std::max(kmax, std::fabs(rk[t * ld + c]));
        const float tol = 8.0f * std::ldexp(1.0f, -24) * 2.0f * (kmax + 1.0f);
        int worst = 0;
        float err = 0;
        for (int c = 0; c < d; ++c) {
          const float e = std::fabs(gk[t * ld + c] - rk[t * ld + c]);
          if (e > err) err = e, worst = c;
        }
        ASSERT_LE(err, tol) << "key t " << t << " channel " << worst << ": " << gk[t * ld + worst]
                            << " vs reference " << rk[t * ld + worst] << " (n " << n << ", row0 "
                            << row0 << ")";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LowbitDecode,
    ::testing::Values(
        LbShape{2, 64, 8, 0, 64, RopeStyle::kNormal}, LbShape{4, 64, 8, 0, 64, RopeStyle::kNormal},
        LbShape{2, 64, 8, 0, 64, RopeStyle::kNeox}, LbShape{4, 128, 32, 32, 128, RopeStyle::kNeox},
        LbShape{2, 40, 8, 0, 40, RopeStyle::kNormal}, LbShape{4, 72, 8, 8, 72, RopeStyle::kNormal},
        LbShape{2, 72, 1, 0, 48, RopeStyle::kNormal}, LbShape{4, 40, 32, 4, 40, RopeStyle::kNeox},
        LbShape{2, 8, 8, 4, 8, RopeStyle::kNormal},
        LbShape{2, 16, 300, 0, 16, RopeStyle::kNormal},  // ω > one table level
        LbShape{4, 16, 2, 0, 8, RopeStyle::kNeox},
        // keys and values at different bits
        LbShape{4, 64, 8, 0, 64, RopeStyle::kNormal, 2},
        LbShape{2, 40, 32, 4, 40, RopeStyle::kNeox, 4},
        LbShape{4, 72, 1, 8, 48, RopeStyle::kNormal, 2},
        // one-byte key scales and zeros (kmeta 8): the engine's layouts, a head dim that is not
        // a multiple of the vector, a partial rotation
        LbShape{4, 64, 8, 0, 64, RopeStyle::kNormal, 2, 8},
        LbShape{2, 64, 8, 0, 64, RopeStyle::kNeox, 0, 8},
        LbShape{4, 40, 8, 0, 40, RopeStyle::kNeox, 2, 8},
        LbShape{2, 72, 13, 8, 48, RopeStyle::kNormal, 4, 8}));

// qwin_pv_accumulate (P·V from the codes) against decoded values summed in double: INT2 and
// INT4, 1..8 query heads, partial windows, value groups of one or more vectors, head dims
// of 1..5 vectors, a misaligned window, output rows with a stride and sentinels after them;
// layouts it does not take (groups smaller than a vector) are reported as unsupported.
TEST(LowbitPv, MatchesDecodedValuesSummedInDouble) {
  const int N = 16;  // the widest SIMD target's lanes; narrower targets divide it
  int checked = 0;
  for (int kbits : {2, 4})  // the keys' bits move the value codes' offset
    for (int bits : {2, 4})
      for (int d : {16, 64, 80})
        for (int group : {0, 16, 32})
          for (int W : {8, 13})
            for (int g : {1, 3, 8}) {
              QuantLayout L{kbits, 2, d, W, group, bits};
              if (!L.validate().is_ok()) continue;
              if (!qwin_pv_supported(L, g)) {
                ASSERT_NE(L.g() % N, 0) << "d " << d << " group " << group << " g " << g;
                continue;
              }
              std::mt19937 rng(bits * 1000 + d * 10 + g);
              std::normal_distribution<float> dist(0.0f, 1.0f);
              std::uniform_real_distribution<float> prob(0.0f, 1.0f);
              std::vector<float> k(size_t(W) * 2 * d), v(k.size());
              for (auto& x : k) x = dist(rng);
              for (auto& x : v) x = 2.0f * dist(rng) + 0.5f;
              std::vector<uint8_t> win(L.window_bytes() + 3);
              quantize_window(L, k.data(), v.data(), W, win.data() + 3);
              for (int n : {W, W / 2 + 1, 1}) {
                const int64_t ldp = W + 2, ldo = d + 5;
                std::vector<float> p(size_t(g) * ldp);
                for (auto& x : p) x = prob(rng);
                std::vector<float> got(size_t(g) * ldo, kSentinel), want(got.size(), kSentinel);
                for (int j = 0; j < g; ++j)
                  for (int c = 0; c < d; ++c) got[j * ldo + c] = want[j * ldo + c] = 0.25f * c;
                qwin_pv_accumulate(L, win.data() + 3, 1, n, p.data(), ldp, g, got.data(), ldo);
                ref::qwin_pv_accumulate(L, win.data() + 3, 1, n, p.data(), ldp, g, want.data(),
                                        ldo);
                for (int j = 0; j < g; ++j) {
                  for (int c = d; c < ldo; ++c) ASSERT_EQ(got[j * ldo + c], kSentinel);
                  for (int c = 0; c < d; ++c) {
                    // n terms of |p·v| ≤ |p|(|s·code| + |z|), each rounded a few times.
                    const float b = want[j * ldo + c];
                    ASSERT_NEAR(got[j * ldo + c], b, 1e-5f * (std::fabs(b) + 8.0f * n))
                        << "bits " << kbits << "/" << bits << " d " << d << " group " << group
                        << " W " << W << " g " << g << " n " << n << " head " << j << " channel "
                        << c;
                  }
                }
                ++checked;
              }
            }
  EXPECT_GT(checked, 50);
}

// qwin_pv_accumulate_i8 (P·V with 8-bit weights, VNNI) against its scalar reference bit for
// bit, and against decoded values summed in double within the weights' rounding: head dims 64
// and 128, 1..16 query heads, partial windows, a misaligned window, strided rows with
// sentinels after them, weights with zeros, negative ones, one head of weights too small to
// round against, all-zero weights.
TEST(LowbitPvI8, MatchesScalarReferenceAndDecodedValues) {
  EXPECT_FALSE(qwin_pv_i8_layout(QuantLayout{2, 2, 64, 8, 0, 4}, 3));   // INT4 values
  EXPECT_FALSE(qwin_pv_i8_layout(QuantLayout{2, 2, 64, 8, 32, 2}, 3));  // two groups a row
  EXPECT_FALSE(qwin_pv_i8_layout(QuantLayout{2, 2, 80, 8, 0, 2}, 3));   // head_dim 80
  EXPECT_FALSE(qwin_pv_i8_layout(QuantLayout{2, 2, 64, 16, 0, 2}, 3));  // 16-token windows
  EXPECT_FALSE(qwin_pv_i8_layout(QuantLayout{2, 2, 64, 8, 0, 2}, 17));  // 17 query heads
  EXPECT_TRUE(qwin_pv_i8_layout(QuantLayout{4, 2, 128, 8, 0, 2}, 7));
  set_qwin_pv_i8_enabled(true);  // on by default; the environment is read in tools/ only
  if (!qwin_pv_i8_supported(QuantLayout{4, 2, 64, 8, 0, 2}, 3))
    GTEST_SKIP() << "no AVX-512 VNNI + VBMI on this CPU";
  set_qwin_pv_i8_enabled(false);
  EXPECT_FALSE(qwin_pv_i8_supported(QuantLayout{4, 2, 64, 8, 0, 2}, 3));
  set_qwin_pv_i8_enabled(true);
  int checked = 0;
  for (int kbits : {2, 4})
    for (int d : {64, 128})
      for (int g : {1, 3, 7, 16}) {
        QuantLayout L{kbits, 2, d, 8, 0, 2};
        ASSERT_TRUE(L.validate().is_ok());
        ASSERT_TRUE(qwin_pv_i8_supported(L, g));
        std::mt19937 rng(kbits * 1000 + d * 10 + g);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::uniform_real_distribution<float> prob(0.0f, 1.0f);
        std::vector<float> k(size_t(8) * 2 * d), v(k.size());
        for (auto& x : k) x = dist(rng);
        for (auto& x : v) x = 2.0f * dist(rng) + 0.5f;
        std::vector<uint8_t> win(L.window_bytes() + 3);
        quantize_window(L, k.data(), v.data(), 8, win.data() + 3);
        for (int n : {8, 5, 1}) {
          const int64_t ldp = 11, ldo = d + 5;
          std::vector<float> p(size_t(g) * ldp);
          for (auto& x : p) x = prob(rng);
          p[0] = 0.0f;                        // a zero weight
          if (g > 1) p[ldp + n - 1] = -0.5f;  // a negative one
          if (g > 2)                          // a head below kPvI8MinWeight
            for (int t = 0; t < n; ++t) p[2 * ldp + t] = 1e-38f;
          if (g > 3)  // a head of zeros
            for (int t = 0; t < n; ++t) p[3 * ldp + t] = 0.0f;
          std::vector<float> got(size_t(g) * ldo, kSentinel), want(got.size(), kSentinel),
              dbl(got.size(), kSentinel);
          for (int j = 0; j < g; ++j)
            for (int c = 0; c < d; ++c)
              got[j * ldo + c] = want[j * ldo + c] = dbl[j * ldo + c] = 0.25f * c;
          qwin_pv_accumulate_i8(L, win.data() + 3, 1, n, p.data(), ldp, g, got.data(), ldo);
          ref::qwin_pv_accumulate_i8(L, win.data() + 3, 1, n, p.data(), ldp, g, want.data(), ldo);
          ref::qwin_pv_accumulate(L, win.data() + 3, 1, n, p.data(), ldp, g, dbl.data(), ldo);
          std::vector<float> vd(size_t(n) * d);
          dequantize_window_head(L, win.data() + 3, 1, n, nullptr, vd.data());
          for (int j = 0; j < g; ++j) {
            // Each weight moves by ≤ wmax/254 on codes ≤ 3 (times the token's scale, in w).
            float wmax = 0.0f;
            for (int t = 0; t < n; ++t) {
              const float s = f16_to_f32(load_f16_bits(win.data() + 3 + L.v_scale_off(1), t));
              wmax = std::max(wmax, std::fabs(p[j * ldp + t] * s));
            }
            for (int c = d; c < ldo; ++c) ASSERT_EQ(got[j * ldo + c], kSentinel);
            for (int c = 0; c < d; ++c) {
              ASSERT_EQ(got[j * ldo + c], want[j * ldo + c])
                  << "bits " << kbits << " d " << d << " g " << g << " n " << n << " head " << j
                  << " channel " << c;
              const float b = dbl[j * ldo + c];
              ASSERT_NEAR(got[j * ldo + c], b,
                          n * 3.0f * wmax / 254.0f + 1e-5f * (std::fabs(b) + 8.0f * n))
                  << "d " << d << " g " << g << " n " << n << " head " << j << " channel " << c;
            }
          }
          ++checked;
        }
      }
  EXPECT_EQ(checked, 2 * 2 * 4 * 3);
}

// qwin_scores (scores straight from the key codes, the decode kernel's path) against the two
// calls it stands for (and against itself with the query prepared once, bit for bit): qwin_keys
// then qk_scores_f32 (INT4 keys in nibble order: within a few ulps of Σ|q·k|, the channels summed
// in another order) — and against keys decoded by the scalar reference and dotted in double. INT2
// and INT4 keys, both RoPE styles, head dims of 1..8 vectors, windows of 1..64 tokens (partial
// 8-token folds), partial windows, 1..16 query heads, a misaligned window, score rows with a stride
// and sentinels after them, rotations starting at table row 0 and at the last rows of the first
// level. Layouts it does not take are reported unsupported, and the engine's own (head_dim 64,
// 8-token windows) are taken on any x86-64 with AVX2.
TEST(QwinScores, BitForBitKeysThenScoresAndNearReference) {
  int checked = 0, nibble_checked = 0;
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox})
    for (int bits : {2, 4})
      for (int d : {16, 48, 64, 128, 40})
        for (int W : {8, 13, 64, 1})
          for (int g : {1, 3, 6, 7, 16})  // 3, 6, 7: the unrolled head counts
            for (int kmeta : {16, 8}) {   // f16 key scales and zeros, or one-byte codes
              QuantLayout L{bits, 2, d, W, 0, 2, kmeta};
              if (!L.validate().is_ok()) continue;
              RopeParams rp;
              rp.style = style;
              rp.n_rot = d;
              rp.freq_base = 10000.0f;
              const RopeTable rope(rp, d, int64_t(1) << 16);
              if (!qwin_scores_supported(L, rope, g)) {
#if defined(__x86_64__)
                if (__builtin_cpu_supports("avx2")) {
                  ASSERT_FALSE(d == 64 && W == 8 && g <= 16)
                      << "the engine's layout must take the fused path";
                }
#endif
                continue;
              }
              std::mt19937 rng(bits * 1000 + d * 10 + g + W);
              std::normal_distribution<float> dist(0.0f, 1.0f);
              std::vector<float> k(size_t(W) * 2 * d), v(k.size());
              for (auto& x : k) x = 3.0f * dist(rng) + 0.5f;
              for (auto& x : v) x = dist(rng);
              std::vector<uint8_t> win(L.window_bytes() + 3);
              quantize_window(L, k.data(), v.data(), W, win.data() + 3);
              const uint8_t* w = win.data() + 3;
              // row0: the in-window rotation, and the last rows of the table's first level.
              for (int row0 : {0, RopeTable::kLevelRows - W})
                for (int n : {W, W / 2 + 1, 1}) {
                  const int64_t ldq = d + 1, lds = n + 2;
                  std::vector<float> q(size_t(g) * ldq);
                  for (auto& x : q) x = dist(rng);
                  const float scale = 0.125f;
                  std::vector<float> got(size_t(g) * lds, kSentinel), two(got.size(), kSentinel);
                  const bool nibbles = qwin_scores_by_nibbles(L, rope);
                  qwin_scores(L, w, 1, n, rope, row0, q.data(), ldq, g, scale, got.data(), lds);
                  {  // in two steps (the query prepared once, as the decode does): bit for bit
                    std::vector<float> qp(size_t(g) * d + 1), two_step(got.size(), kSentinel);
                    qwin_scores_query(L, rope, q.data(), ldq, g, qp.data() + 1);
                    qwin_scores_prepared(L, w, 1, n, rope, row0, qp.data() + 1, g, scale,
                                         two_step.data(), lds);
                    for (size_t i = 0; i < got.size(); ++i)
                      ASSERT_EQ(two_step[i], got[i])
                          << "prepared query, bits " << bits << " d " << d << " g " << g << " n "
                          << n << " at " << i;
                  }
                  std::vector<float> kd(size_t(n) * d), kr(size_t(n) * d);
                  qwin_keys(L, w, 1, n, rope, row0, kd.data(), d);
                  qk_scores_f32(q.data(), ldq, g, kd.data(), d, n, d, scale, two.data(), lds);
                  ref::qwin_keys(L, w, 1, n, rp, row0, kr.data(), d);
                  for (int j = 0; j < g; ++j) {
                    for (int64_t t = n; t < lds; ++t) ASSERT_EQ(got[j * lds + t], kSentinel);
                    for (int t = 0; t < n; ++t) {
                      double dot = 0.0, mag = 0.0;
                      for (int c = 0; c < d; ++c) {
                        dot += double(q[j * ldq + c]) * kr[t * d + c];
                        mag += std::fabs(double(q[j * ldq + c]) * kr[t * d + c]);
                      }
                      // INT4 keys in nibble order (RopeTable pair rows, head_dim a multiple of
                      // two vectors, of four for kNeox): the same rotated keys, the channels
                      // summed in another order; else bit for bit.
                      if (nibbles) {
                        ++nibble_checked;
                        ASSERT_NEAR(got[j * lds + t], two[j * lds + t], scale * d * 1.2e-7 * mag)
                            << "bits " << bits << " d " << d << " W " << W << " g " << g;
                      } else {
                        ASSERT_EQ(got[j * lds + t], two[j * lds + t])
                            << "bits " << bits << " d " << d << " W " << W << " g " << g << " n "
                            << n << " head " << j << " token " << t << " style " << int(style)
                            << " row0 " << row0;
                      }
                      // Keys within a few roundings of the reference (LowbitDecode), then d
                      // products summed in another order.
                      ASSERT_NEAR(got[j * lds + t], scale * dot,
                                  scale * (d + 16) * 6e-8 * (mag + 1.0))
                          << "bits " << bits << " d " << d << " W " << W << " g " << g << " n "
                          << n;
                    }
                  }
                  ++checked;
                }
            }
  EXPECT_GT(checked, 100);
#if defined(__x86_64__)
  // The engine's INT4 layout (head_dim 64) takes the nibble path on AVX2 and AVX-512, both
  // RoPE styles.
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_GT(nibble_checked, 1000);
  }
#endif
}

// rope_rows with the table's expanded rows against double angles, forward and inverse.
TEST(RopeRows, MatchesDoubleAnglesBothWays) {
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    for (int d : {8, 40, 64, 72}) {
      RopeParams rp;
      rp.style = style;
      rp.n_rot = d == 72 ? 64 : d;
      const RopeTable rope(rp, d, int64_t(1) << 20);
      std::mt19937 rng(d);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      const int n = 3;
      std::vector<float> x(size_t(n) * d);
      std::vector<float> cx(static_cast<size_t>(d)), sx(static_cast<size_t>(d));
      for (auto& e : x) e = dist(rng);
      for (int64_t pos : {int64_t(0), int64_t(77), int64_t(65541), int64_t(999999)}) {
        rope.expanded(pos, cx.data(), sx.data());
        for (bool inv : {false, true}) {
          std::vector<float> got(size_t(n) * (d + 1), kSentinel), want(size_t(n) * d);
          rope_rows(rp, d, cx.data(), sx.data(), inv, x.data(), d, n, got.data(), d + 1);
          ref::rope_rows(rp, d, pos, inv, x.data(), d, n, want.data(), d);
          for (int r = 0; r < n; ++r) {
            ASSERT_EQ(got[r * (d + 1) + d], kSentinel);
            for (int c = 0; c < d; ++c)
              ASSERT_NEAR(got[r * (d + 1) + c], want[r * d + c], 3e-6f)
                  << "d " << d << " pos " << pos << " inverse " << inv << " row " << r << " c "
                  << c;
          }
        }
      }
    }
  }
}

// qk_scores_f32 (folded horizontal sums over up to 8 tokens) against the scalar reference:
// token counts 0..2×8+1 (partial folds), head dims with a scalar tail, 1..9 heads,
// misaligned rows, sentinels after each head's scores. Tolerance: a dot of d products
// rounded in a different order, |error| <= d·2^-23·Σ|q_c k_c|.
TEST(QkScoresF32, FoldedSumsMatchReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int d : {8, 16, 40, 64, 72}) {
    for (int g : {1, 3, 9}) {
      for (int n = 0; n <= 17; ++n) {
        const int64_t ldq = d + 1, ldk = d + 3, lds = n + 2;
        std::vector<float> q(size_t(g) * ldq + 1), k(size_t(n) * ldk + 1);
        for (auto& x : q) x = dist(rng);
        for (auto& x : k) x = 2.0f * dist(rng);
        std::vector<float> got(size_t(g) * lds, kSentinel), want(got.size(), kSentinel);
        qk_scores_f32(q.data() + 1, ldq, g, k.data() + 1, ldk, n, d, 0.125f, got.data(), lds);
        ref::qk_scores_f32(q.data() + 1, ldq, g, k.data() + 1, ldk, n, d, 0.125f, want.data(), lds);
        for (int h = 0; h < g; ++h) {
          for (int j = n; j < lds; ++j) ASSERT_EQ(got[h * lds + j], kSentinel);
          for (int j = 0; j < n; ++j) {
            double mag = 0;
            for (int c = 0; c < d; ++c)
              mag += std::fabs(q[1 + h * ldq + c] * k[1 + j * ldk + c]) * 0.125;
            ASSERT_NEAR(got[h * lds + j], want[h * lds + j], d * std::ldexp(1.0, -23) * mag)
                << "d " << d << " g " << g << " n " << n << " head " << h << " token " << j;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace qevict
