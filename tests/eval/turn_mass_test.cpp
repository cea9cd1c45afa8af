// Attention mass by tier during a turn (eval/turn_mass.h) on hand-made attention rows with
// hand-computed shares: FullKV's rows split by caches whose tier maps are per layer and per
// (layer, KV head), prompt calls apart from decode steps; a tiered cache's own masses; the
// JSON of a turn's masses.
#include "eval/turn_mass.h"

#include <gtest/gtest.h>

#include <vector>

#include "eval/eval_protocol.h"

namespace qevict::eval {
namespace {

constexpr Tier L = Tier::kLocal, F = Tier::kFull, Q = Tier::kQuant, E = Tier::kEvicted;

void expect_mass(const TierMass& m, double l, double f, double q, double e, const char* what) {
  EXPECT_NEAR(m.local, l, 1e-6) << what;
  EXPECT_NEAR(m.full, f, 1e-6) << what;
  EXPECT_NEAR(m.quant, q, 1e-6) << what;
  EXPECT_NEAR(m.evicted, e, 1e-6) << what;
}

// 2 layers, 2 KV heads, 3 positions of the text in each map (a 4th and 5th position, the
// turn's own tokens, count as local). Cache 0 maps layers, cache 1 (layer, KV head) units,
// cache 2 three units (neither layout: no result).
TEST(TurnMass, FullKvAttentionByEachCachesTiers) {
  std::vector<std::vector<std::vector<Tier>>> tiers = {
      {{F, Q, E}, {L, F, F}},
      {{F, F, F}, {E, E, E}, {Q, Q, Q}, {F, E, Q}},
      {{F, F, F}, {F, F, F}, {F, F, F}},
  };
  FullKvTurnMass m(2, 2, /*prompt_end=*/4, tiers);
  // The prompt: 2 queries over 4 keys (each KV head's row sums to 2).
  const std::vector<float> p0 = {0.5f, 0.5f, 0.5f, 0.5f, 1.0f, 0.0f, 0.5f, 0.5f};
  const std::vector<float> p1 = {0.2f, 0.4f, 0.6f, 0.8f, 0.0f, 0.0f, 1.0f, 1.0f};
  m.on_attention(0, 4, p0.data());
  m.on_attention(1, 4, p1.data());
  // One decode step over 5 keys.
  const std::vector<float> d0 = {0, 0, 0, 0, 1, 0.25f, 0.25f, 0.25f, 0.25f, 0};
  const std::vector<float> d1 = {1, 0, 0, 0, 0, 0, 1, 0, 0, 0};
  m.on_attention(0, 5, d0.data());
  m.on_attention(1, 5, d1.data());

  // Cache 0, per layer (heads summed). Prompt: layer 0 [1.5, 0.5, 1, 1] → F 1.5, Q 0.5, E 1,
  // L 1 of 4; layer 1 [0.2, 0.4, 1.6, 1.8] → L 2, F 2 of 4. Decode: layer 0 [.25 .25 .25 .25
  // 1] → F, Q, E 0.25, L 1.25 of 2; layer 1 [1 1 0 0 0] → L 1, F 1 of 2. The turn: F 4.75,
  // Q 0.75, E 1.25, L 5.25 of 12.
  auto r0 = m.result(0);
  ASSERT_TRUE(r0.has_value());
  expect_mass(r0->prompt, 0.375, 0.4375, 0.0625, 0.125, "cache 0, prompt");
  expect_mass(r0->turn, 5.25 / 12, 4.75 / 12, 0.75 / 12, 1.25 / 12, "cache 0, turn");
  // Cache 1, per (layer, KV head). Prompt: F 1.5 (l0h0), E 1.5 (l0h1), Q 1.2 (l1h0) + 1
  // (l1h1), L the rest, 2.8 of 8. Decode: l0h0 L 1, l0h1 E 0.75 L 0.25, l1h0 Q 1, l1h1 E 1.
  auto r1 = m.result(1);
  ASSERT_TRUE(r1.has_value());
  expect_mass(r1->prompt, 2.8 / 8, 1.5 / 8, 2.2 / 8, 1.5 / 8, "cache 1, prompt");
  expect_mass(r1->turn, 4.05 / 12, 1.5 / 12, 3.2 / 12, 3.25 / 12, "cache 1, turn");
  EXPECT_FALSE(m.result(2).has_value()) << "3 units: neither layers nor (layer, KV head)";
  EXPECT_FALSE(m.result(3).has_value()) << "no such cache";

  // No prompt call seen: no result.
  FullKvTurnMass late(2, 2, 4, tiers);
  late.on_attention(0, 5, d0.data());
  EXPECT_FALSE(late.result(0).has_value());
}

// FullKV's own map (every text position in F): its shares have no Q and no E, F + L = 1.
TEST(TurnMass, FullKvOwnMapHasNoQuantNorEvicted) {
  FullKvTurnMass m(1, 2, 3, {{{F, F}}});
  const std::vector<float> p = {0.1f, 0.2f, 0.7f, 0.3f, 0.3f, 0.4f};
  m.on_attention(0, 3, p.data());
  auto r = m.result(0);
  ASSERT_TRUE(r.has_value());
  expect_mass(r->prompt, 1.1 / 2, 0.9 / 2, 0, 0, "FullKV");
  expect_mass(r->turn, 1.1 / 2, 0.9 / 2, 0, 0, "FullKV, no decode step");
}

TEST(TurnMass, TieredCachesOwnMassByTier) {
  OwnTurnMass m(/*prompt_end=*/10);
  EXPECT_FALSE(m.result().has_value());
  const double l0[4] = {1.0, 0.5, 0.5, 0.0};  // L, F, Q, E: 2 queries
  const double l1[4] = {0.5, 1.5, 0.0, 0.0};
  const double step[4] = {0.0, 1.0, 0.0, 0.0};  // a decode step (11 keys)
  m.on_tier_mass(0, 8, l0);
  m.on_tier_mass(1, 8, l1);
  m.on_tier_mass(0, 11, step);
  auto r = m.result();
  ASSERT_TRUE(r.has_value());
  expect_mass(r->prompt, 1.5 / 4, 2.0 / 4, 0.5 / 4, 0, "prompt");
  expect_mass(r->turn, 1.5 / 5, 3.0 / 5, 0.5 / 5, 0, "turn");
}

TEST(TurnMass, JsonRoundsToSixDecimals) {
  TurnMass t;
  t.prompt = TierMass{1.0 / 3, 0.0, 2.0 / 3, 0.0};  // full, quant, evicted, local
  t.turn = TierMass{0.25, 0.25, 0.25, 0.25};
  const nlohmann::json j = turn_mass_json(t);
  EXPECT_DOUBLE_EQ(j["prompt"]["F"].get<double>(), 0.333333);
  EXPECT_DOUBLE_EQ(j["prompt"]["E"].get<double>(), 0.666667);
  EXPECT_DOUBLE_EQ(j["prompt"]["Q"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["turn"]["L"].get<double>(), 0.25);

  // In a turn's diagnostics only when known.
  TurnDiagnostics d;
  EXPECT_FALSE(turn_diagnostics_json(d).contains("fullkv_mass"));
  EXPECT_FALSE(turn_diagnostics_json(d).contains("own_mass"));
  d.fullkv_mass = t;
  const nlohmann::json dj = turn_diagnostics_json(d);
  EXPECT_EQ(dj["fullkv_mass"], j);
  EXPECT_FALSE(dj.contains("own_mass"));
}

}  // namespace
}  // namespace qevict::eval
