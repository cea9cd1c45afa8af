// kl_divergence_logits on hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/perplexity.h"

namespace qevict {
namespace {

TEST(KlDivergenceLogits, HandComputed) {
  // P = softmax(0, 0) = (1/2, 1/2), Q = softmax(0, ln 3) = (1/4, 3/4):
  // KL = 1/2 ln((1/2)/(1/4)) + 1/2 ln((1/2)/(3/4)) = 1/2 ln(4/3).
  const float p[2] = {0.0f, 0.0f}, q[2] = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(kl_divergence_logits(p, q, 2), 0.5 * std::log(4.0 / 3.0), 1e-7);
  // Shifting logits changes nothing; identical distributions give 0.
  const float p_shift[2] = {5.0f, 5.0f};
  EXPECT_NEAR(kl_divergence_logits(p_shift, q, 2), 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_EQ(kl_divergence_logits(p, p_shift, 2), 0.0);
  // Large logits do not overflow.
  const float big[3] = {1000.0f, 999.0f, -1000.0f};
  EXPECT_EQ(kl_divergence_logits(big, big, 3), 0.0);
}

}  // namespace
}  // namespace qevict
