// Fast kernels/ops.h against the scalar references in kernels/ref, on awkward sizes
// (0..2x lanes, odd), misaligned pointers and both half formats; sentinels catch overruns.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/f16.h"
#include "kernels/ref/ops_ref.h"

namespace qevict {
namespace {

constexpr float kSentinel = -12345.0f;

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<uint16_t> random_halfs(HalfType t, size_t n, uint32_t seed) {
  auto f = random_floats(n, seed);
  std::vector<uint16_t> h(n);
  ref::f32_to_half(t, f.data(), h.data(), static_cast<int64_t>(n));
  return h;
}

// Worst relative error of got vs want, relative to `scale` per element; prints the worst.
void expect_close(const float* got, const float* want, const std::vector<double>& scale, int64_t n,
                  double rel, const char* what) {
  double worst = 0.0;
  int64_t wi = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double err = std::fabs(double(got[i]) - want[i]) / std::max(scale[i], 1e-30);
    if (!(err <= worst) || std::isnan(got[i])) {
      worst = std::isnan(got[i]) ? INFINITY : err;
      wi = i;
    }
  }
  EXPECT_LE(worst, rel) << what << ": worst index " << wi << " got " << (wi >= 0 ? got[wi] : 0)
                        << " want " << (wi >= 0 ? want[wi] : 0);
}

class OpsSizes : public ::testing::TestWithParam<int> {};

TEST_P(OpsSizes, RmsNormMatchesReference) {
  const int n = GetParam();
  if (n == 0) return;  // RMSNorm of an empty vector is undefined
  auto x = random_floats(n + 1, 1), w = random_floats(n + 1, 2);
  std::vector<float> got(n + 2, kSentinel), want(n, 0.0f);
  rmsnorm(x.data() + 1, w.data() + 1, got.data() + 1, n, 1e-5f);  // misaligned
  ref::rmsnorm(x.data() + 1, w.data() + 1, want.data(), n, 1e-5f);
  std::vector<double> scale(n);
  for (int i = 0; i < n; ++i) scale[i] = std::fabs(want[i]) + 1e-6;
  expect_close(got.data() + 1, want.data(), scale, n, 1e-5, "rmsnorm");
  EXPECT_EQ(got[0], kSentinel);
  EXPECT_EQ(got[n + 1], kSentinel);
}

TEST_P(OpsSizes, SwigluMatchesReference) {
  const int n = GetParam();
  auto g = random_floats(n + 1, 3, -20.0f, 20.0f), u = random_floats(n + 1, 4);
  std::vector<float> got(n + 2, kSentinel), want(n, 0.0f);
  swiglu(g.data() + 1, u.data() + 1, got.data() + 1, n);
  ref::swiglu(g.data() + 1, u.data() + 1, want.data(), n);
  std::vector<double> scale(n);
  for (int i = 0; i < n; ++i) scale[i] = std::fabs(want[i]) + 1e-6;
  expect_close(got.data() + 1, want.data(), scale, n, 1e-5, "swiglu");
  EXPECT_EQ(got[0], kSentinel);
  EXPECT_EQ(got[n + 1], kSentinel);
}

TEST_P(OpsSizes, SoftmaxMatchesReference) {
  const int n = GetParam();
  auto x = random_floats(n + 1, 5, -30.0f, 30.0f);
  std::vector<float> got(x), want(x);
  const float m1 = softmax_inplace(got.data() + 1, n);
  const float m2 = ref::softmax_inplace(want.data() + 1, n);
  EXPECT_EQ(m1, m2);
  std::vector<double> scale(n, 1.0);
  expect_close(got.data() + 1, want.data() + 1, scale, n, 1e-6, "softmax");
  EXPECT_EQ(got[0], x[0]);
}

TEST_P(OpsSizes, HalfConversionsRoundTrip) {
  const int n = GetParam();
  for (HalfType t : {HalfType::kF16, HalfType::kBF16}) {
    auto h = random_halfs(t, n + 1, 6);
    std::vector<float> got(n + 2, kSentinel), want(n);
    half_to_f32(t, h.data() + 1, got.data() + 1, n);
    ref::half_to_f32(t, h.data() + 1, want.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[i + 1], want[i]) << "index " << i;
    EXPECT_EQ(got[n + 1], kSentinel);
    std::vector<uint16_t> back(n);
    f32_to_half(t, want.data(), back.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(back[i], h[i + 1]) << "index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, OpsSizes,
                         ::testing::Values(0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65,
                                           576, 1001));

struct AttnShape {
  int g, d;
  int64_t n;
};

class AttnShapes : public ::testing::TestWithParam<AttnShape> {};

TEST_P(AttnShapes, QkScoresAndPvMatchReference) {
  const auto [g, d, n] = GetParam();
  for (HalfType t : {HalfType::kF16, HalfType::kBF16}) {
    const int64_t ldq = d + 3, ldk = d + 5, lds = n + 2, ldo = d + 1;
    auto q = random_floats(g * ldq + 1, 7);
    auto k = random_halfs(t, n * ldk + 1, 8);
    std::vector<float> got(g * lds + 2, kSentinel), want(g * lds, 0.0f);
    qk_scores(t, q.data() + 1, ldq, g, k.data() + 1, ldk, n, d, 0.125f, got.data() + 1, lds);
    ref::qk_scores(t, q.data() + 1, ldq, g, k.data() + 1, ldk, n, d, 0.125f, want.data(), lds);
    // error bound: f32 accumulation of d products, relative to sum |q||k|.
    auto qk_scale = [&](int h) {
      std::vector<double> scale(n);
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int c = 0; c < d; ++c)
          s += std::fabs(q[1 + h * ldq + c] * ref::half_to_float(t, k[1 + j * ldk + c]));
        scale[j] = 0.125 * s + 1e-30;
      }
      return scale;
    };
    for (int h = 0; h < g; ++h) {
      const std::vector<double> scale = qk_scale(h);
      expect_close(got.data() + 1 + h * lds, want.data() + h * lds, scale, n, 4.0 * d * 1.2e-7,
                   "qk_scores");
    }
    EXPECT_EQ(got[0], kSentinel);
    EXPECT_EQ(got[g * lds + 1], kSentinel);
    // The same scores, bit for bit, from the rows converted to f32 first (what a prefill run
    // does once for all its queries).
    std::vector<float> kf(size_t(n) * d + 1), conv(g * lds + 2, kSentinel);
    for (int64_t j = 0; j < n; ++j) half_to_f32(t, k.data() + 1 + j * ldk, kf.data() + j * d, d);
    qk_scores_f32(q.data() + 1, ldq, g, kf.data(), d, n, d, 0.125f, conv.data() + 1, lds);
    for (int h = 0; h < g; ++h)
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(f32_to_bits(conv[1 + h * lds + j]), f32_to_bits(got[1 + h * lds + j]))
            << "head " << h << " key " << j;

    auto p = random_floats(g * lds + 1, 9, 0.0f, 1.0f);
    auto v = random_halfs(t, n * ldk + 1, 10);
    auto out0 = random_floats(g * ldo + 2, 11);
    std::vector<float> o1(out0), o2(out0);
    pv_accumulate(t, p.data() + 1, lds, g, v.data() + 1, ldk, n, d, o1.data() + 1, ldo);
    ref::pv_accumulate(t, p.data() + 1, lds, g, v.data() + 1, ldk, n, d, o2.data() + 1, ldo);
    for (int h = 0; h < g; ++h) {
      std::vector<double> scale(d);
      for (int c = 0; c < d; ++c) {
        double s = std::fabs(out0[1 + h * ldo + c]);
        for (int64_t j = 0; j < n; ++j)
          s += std::fabs(p[1 + h * lds + j] * ref::half_to_float(t, v[1 + j * ldk + c]));
        scale[c] = s + 1e-30;
      }
      expect_close(o1.data() + 1 + h * ldo, o2.data() + 1 + h * ldo, scale, d,
                   4.0 * (n + 1) * 1.2e-7, "pv_accumulate");
    }
    EXPECT_EQ(o1[0], out0[0]);
    EXPECT_EQ(o1[g * ldo + 1], out0[g * ldo + 1]);

    // The many-row kernels (a prefill run's (query, head) rows, here the g heads): scores
    // within the same bound of the reference, nothing written outside the rows; value sums
    // bit for bit pv_accumulate's.
    // Rows by pointer, and a null row (a zero key) past them.
    std::vector<const uint16_t*> kp(n + 1, nullptr), vp(n, nullptr);
    for (int64_t j = 0; j < n; ++j) kp[j] = k.data() + 1 + j * ldk;
    std::vector<float> rows(g * lds + 2, kSentinel);
    qk_scores_rows(t, q.data() + 1, ldq, g, kp.data(), n + 1, d, 0.125f, rows.data() + 1, lds);
    for (int h = 0; h < g; ++h) {
      const std::vector<double> scale = qk_scale(h);
      expect_close(rows.data() + 1 + h * lds, want.data() + h * lds, scale, n, 4.0 * d * 1.2e-7,
                   "qk_scores_rows");
      ASSERT_EQ(rows[1 + h * lds + n], 0.0f) << "the null row scores 0, head " << h;
      ASSERT_EQ(rows[1 + h * lds + n + 1], kSentinel) << "head " << h;
    }
    EXPECT_EQ(rows[0], kSentinel);
    std::vector<float> o3(out0);
    for (int64_t j = 0; j < n; ++j) vp[j] = v.data() + 1 + j * ldk;
    pv_accumulate_rows(t, p.data() + 1, lds, g, vp.data(), n, d, o3.data() + 1, ldo);
    for (size_t i = 0; i < o3.size(); ++i)
      ASSERT_EQ(f32_to_bits(o3[i]), f32_to_bits(o1[i])) << "pv_accumulate_rows index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttnShapes,
                         ::testing::Values(AttnShape{1, 64, 1}, AttnShape{3, 64, 54},
                                           AttnShape{3, 64, 97}, AttnShape{9, 64, 13},
                                           AttnShape{2, 17, 5}, AttnShape{4, 128, 33},
                                           AttnShape{1, 1, 1}, AttnShape{5, 80, 0},
                                           AttnShape{8, 33, 64}, AttnShape{7, 64, 300},
                                           AttnShape{14, 256, 9}, AttnShape{3, 300, 10},
                                           AttnShape{2, 8, 7}));

TEST(OpsDispatch, ReportsATarget) { EXPECT_NE(std::string(simd_target_name()), ""); }

}  // namespace
}  // namespace qevict

namespace qevict {
namespace {

TEST(OpsOnline, MaxAndExpSubSumMatchReference) {
  for (int n : {1, 2, 7, 16, 17, 33, 100, 257}) {
    auto x = random_floats(n + 1, 12 + n, -40.0f, 40.0f);
    EXPECT_EQ(max_of(x.data() + 1, n), ref::max_of(x.data() + 1, n)) << "n=" << n;
    std::vector<float> a(x), b(x);
    const float m = ref::max_of(x.data() + 1, n);
    const float sa = exp_sub_sum(a.data() + 1, n, m);
    const float sb = ref::exp_sub_sum(b.data() + 1, n, m);
    EXPECT_NEAR(sa, sb, 1e-5 * sb) << "n=" << n;
    std::vector<double> scale(n, 1.0);
    expect_close(a.data() + 1, b.data() + 1, scale, n, 2e-6, "exp_sub_sum");
    EXPECT_EQ(a[0], x[0]);
  }
}

// exp_sub_sum8's exp: within 3e-7 relative of std::exp (in double) over the whole normal
// range of a softmax's x − m ≤ 0, exactly 1 at 0, exactly 0 below −87.33 and for a masked
// −1e30, NaN for NaN.
TEST(OpsOnline, ExpSubSum8ExpIsAccurateAndEndsInZero) {
  std::vector<float> x;
  for (float v = 0.0f; v >= -87.3f; v -= 0.0137f) x.push_back(v);
  for (float v : {-0.0f, -1e-30f, -1e-7f, -0.34657f, -0.34658f, -87.32f, -87.329f}) x.push_back(v);
  const size_t normal = x.size();
  for (float v : {-87.34f, -87.5f, -100.0f, -104.5f, -1e30f}) x.push_back(v);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  for (size_t len : {x.size(), size_t(7)}) {  // vector lanes and the scalar tail
    std::vector<float> y(x.begin(), x.begin() + len), sums((len + 7) / 8);
    exp_sub_sum8(y.data(), int64_t(len), 0.0f, sums.data());
    for (size_t i = 0; i < len; ++i) {
      if (len == 7) {  // the tail uses std::exp
        EXPECT_EQ(y[i], std::exp(x[i])) << x[i];
      } else if (i < normal) {
        const double want = std::exp(double(x[i]));
        ASSERT_NEAR(y[i], want, 3e-7 * want) << "x=" << x[i];
      } else if (i + 1 < len) {
        EXPECT_EQ(y[i], 0.0f) << "x=" << x[i];
      } else {
        EXPECT_TRUE(std::isnan(y[i]));
      }
    }
    EXPECT_EQ(y[0], 1.0f);
  }
}

// exp_sub_sum8: values and total within 3e-7 of exp_sub_sum's, and group sums in the
// reference's order over its own values, bit for bit — on lengths around the vector tree's
// 8·N chunk (N up to 16) and partial last groups; sums past ceil(n/8) untouched.
TEST(OpsOnline, ExpSubSum8AgreesWithExpSubSumAndGroupOrder) {
  for (int n : {1, 7, 8, 9, 24, 63, 64, 65, 127, 128, 129, 136, 255, 256, 257, 300, 512}) {
    auto x = random_floats(n + 1, 90 + n, -30.0f, 30.0f);
    if (n > 3) x[3] = -1e30f;  // a masked token: exactly 0 after the exp
    std::vector<float> a(x), b(x);
    const float m = ref::max_of(x.data() + 1, n);
    const int groups = (n + 7) / 8;
    std::vector<float> sums(groups + 2, -7.0f), want(groups);
    const float sa = exp_sub_sum8(a.data() + 1, n, m, sums.data());
    const float sb = exp_sub_sum(b.data() + 1, n, m);
    EXPECT_NEAR(sa, sb, 3e-7 * sb) << "n=" << n;
    EXPECT_EQ(a[0], b[0]);
    for (int i = 1; i <= n; ++i) ASSERT_NEAR(a[i], b[i], 3e-7 * b[i]) << "n=" << n << " i=" << i;
    if (n > 3) {
      EXPECT_EQ(a[3], 0.0f);
    }
    ref::sum8_groups(a.data() + 1, n, want.data());
    for (int k = 0; k < groups; ++k) ASSERT_EQ(sums[k], want[k]) << "n=" << n << " k=" << k;
    EXPECT_EQ(sums[groups], -7.0f) << "n=" << n;
    EXPECT_EQ(sums[groups + 1], -7.0f) << "n=" << n;
  }
}

}  // namespace
}  // namespace qevict
