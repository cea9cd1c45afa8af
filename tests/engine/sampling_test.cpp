// Sampler against a brute-force model of its rule (top-k → top-p → min-p → temperature),
// plus determinism by seed and parameter validation.
#include "engine/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

namespace qevict {
namespace {

// The distribution the sampler must draw from, computed the slow, obvious way.
std::map<int32_t, double> brute_force(const std::vector<float>& z, const SamplingParams& p) {
  std::vector<int32_t> ids(z.size());
  for (size_t i = 0; i < z.size(); ++i) ids[i] = int32_t(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
  if (p.top_k > 0 && size_t(p.top_k) < ids.size()) ids.resize(size_t(p.top_k));
  std::vector<double> pr;
  double s = 0;
  for (int32_t id : ids) s += std::exp(double(z[id]) - z[ids[0]]);
  for (int32_t id : ids) pr.push_back(std::exp(double(z[id]) - z[ids[0]]) / s);
  size_t n = ids.size();
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += pr[i];
      if (cum >= p.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  size_t m = 1;
  while (m < n && pr[m] >= p.min_p * pr[0]) ++m;
  if (p.min_p > 0) n = m;
  std::map<int32_t, double> out;
  double t = 0;
  for (size_t i = 0; i < n; ++i) t += std::exp((double(z[ids[i]]) - z[ids[0]]) / p.temperature);
  for (size_t i = 0; i < n; ++i)
    out[ids[i]] = std::exp((double(z[ids[i]]) - z[ids[0]]) / p.temperature) / t;
  return out;
}

std::vector<float> logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> z(n);
  for (auto& x : z) x = d(rng);
  return z;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  std::vector<float> z = {1.0f, 3.0f, 3.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p);
  EXPECT_EQ(s.sample(z.data(), 4), 1);
  EXPECT_EQ(argmax(z.data(), 4), 1);
}

struct Case {
  float temp;
  int top_k;
  float top_p, min_p;
};

class SamplerRule : public ::testing::TestWithParam<Case> {};

TEST_P(SamplerRule, DrawsOnlyAllowedTokensWithTheRightFrequencies) {
  const Case c = GetParam();
  const auto z = logits(50, 3);
  SamplingParams p;
  p.temperature = c.temp;
  p.top_k = c.top_k;
  p.top_p = c.top_p;
  p.min_p = c.min_p;
  p.seed = 1234;
  ASSERT_TRUE(p.validate().is_ok());
  const auto want = brute_force(z, p);
  Sampler s(p);
  std::map<int32_t, int> count;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++count[s.sample(z.data(), int32_t(z.size()))];
  for (const auto& [id, k] : count)
    EXPECT_TRUE(want.count(id)) << "token " << id << " is outside the allowed set";
  for (const auto& [id, pw] : want) {
    const double got = double(count[id]) / draws;
    // 5 binomial standard deviations (fixed seed: deterministic, not flaky).
    EXPECT_NEAR(got, pw, 5 * std::sqrt(pw * (1 - pw) / draws) + 1e-4) << "token " << id;
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, SamplerRule,
                         ::testing::Values(Case{1.0f, 0, 1.0f, 0.0f}, Case{0.7f, 5, 1.0f, 0.0f},
                                           Case{1.0f, 0, 0.8f, 0.0f}, Case{1.3f, 0, 1.0f, 0.1f},
                                           Case{0.8f, 40, 0.95f, 0.05f},
                                           Case{2.0f, 3, 0.5f, 0.0f}));

TEST(Sampler, SameSeedSameTokens) {
  const auto z = logits(1000, 9);
  SamplingParams p;
  p.seed = 77;
  Sampler a(p), b(p);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(a.sample(z.data(), 1000), b.sample(z.data(), 1000));
}

TEST(Sampler, ValidateRejectsBadValues) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_FALSE(p.validate().is_ok());
  p = SamplingParams();
  p.min_p = 1.5f;
  EXPECT_FALSE(p.validate().is_ok());
  p = SamplingParams();
  p.temperature = NAN;
  EXPECT_FALSE(p.validate().is_ok());
}

}  // namespace
}  // namespace qevict
