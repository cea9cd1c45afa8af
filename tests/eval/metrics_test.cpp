// Diagnostics metrics (eval/metrics.h, QEvict §3) on hand-built traces with hand-computed answers.
#include "eval/metrics.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace qevict::eval {
namespace {

constexpr Tier L = Tier::kLocal, F = Tier::kFull, Q = Tier::kQuant, E = Tier::kEvicted;

// Inputs that are not dyadic (0.1f, ...) are rounded to float (relative error <= 2^-24 each);
// a share is a ratio of sums of at most 4 such values, so a few 2^-24 bound its error.
constexpr double kFloatTol = 8.0 / double(1 << 24);

void expect_mass(const TierMass& m, double full, double quant, double evicted, double local,
                 double tol) {
  EXPECT_NEAR(m.full, full, tol);
  EXPECT_NEAR(m.quant, quant, tol);
  EXPECT_NEAR(m.evicted, evicted, tol);
  EXPECT_NEAR(m.local, local, tol);
}

// ---------------------------------------------------------------------------------------------
// 1. mass_by_tier

TEST(Metrics, MassByTierOneQuery) {
  const std::vector<float> attn = {0.1f, 0.2f, 0.3f, 0.4f};
  // total 1.0: local 0.1, full 0.2, quant 0.3, evicted 0.4
  expect_mass(mass_by_tier(attn.data(), 4, {L, F, Q, E}), 0.2, 0.3, 0.4, 0.1, kFloatTol);
}

TEST(Metrics, MassByTierNormalizesSummedRows) {
  // Two queries' rows summed: q1 {0.5, 0.25, 0.25, 0} + q2 {0, 0.25, 0.25, 0.5}.
  const std::vector<float> attn = {0.5f, 0.5f, 0.5f, 0.5f};
  // total 2: full (0.5 + 0.5) / 2 = 0.5, quant 0.5 / 2 = 0.25, evicted 0.5 / 2 = 0.25
  expect_mass(mass_by_tier(attn.data(), 4, {F, F, Q, E}), 0.5, 0.25, 0.25, 0.0, 0.0);
  // Unnormalized counts {1, 3, 0, 4}, total 8: full (1 + 4) / 8 = 0.625, quant 3 / 8 = 0.375.
  const std::vector<float> counts = {1.0f, 3.0f, 0.0f, 4.0f};
  expect_mass(mass_by_tier(counts.data(), 4, {F, Q, E, F}), 0.625, 0.375, 0.0, 0.0, 0.0);
}

TEST(Metrics, MassByTierTailIsLocal) {
  const std::vector<float> attn = {0.25f, 0.25f, 0.125f, 0.125f, 0.25f};
  // tiers cover positions 0, 1; positions 2..4 are the current call's tokens (local):
  // full 0.25, evicted 0.25, local 0.125 + 0.125 + 0.25 = 0.5
  expect_mass(mass_by_tier(attn.data(), 5, {F, E}), 0.25, 0.0, 0.25, 0.5, 0.0);
  // No tiers at all: everything is local.
  expect_mass(mass_by_tier(attn.data(), 5, {}), 0.0, 0.0, 0.0, 1.0, 0.0);
}

TEST(Metrics, MassByTierZeroRowIsAllZero) {
  const std::vector<float> attn = {0.0f, 0.0f, 0.0f};
  expect_mass(mass_by_tier(attn.data(), 3, {F, Q, E}), 0.0, 0.0, 0.0, 0.0, 0.0);
}

TEST(Metrics, MassByTierEmpty) {
  expect_mass(mass_by_tier(nullptr, 0, {}), 0.0, 0.0, 0.0, 0.0, 0.0);
  const std::vector<float> attn = {1.0f};
  expect_mass(mass_by_tier(attn.data(), 0, {}), 0.0, 0.0, 0.0, 0.0, 0.0);
}

TEST(Metrics, TierMassAccumulateAndScale) {
  TierMass a{0.5, 0.25, 0.125, 0.125};
  a += TierMass{0.25, 0.25, 0.25, 0.25};
  // {0.75, 0.5, 0.375, 0.375} / 2 = {0.375, 0.25, 0.1875, 0.1875}
  expect_mass(a.scaled(0.5), 0.375, 0.25, 0.1875, 0.1875, 0.0);
}

// ---------------------------------------------------------------------------------------------
// 2. Future missed mass (FMM) over decode time: the attention row of each decode step (over
// every position so far, the current token included) against the tier snapshot the cache had
// before the step. FMM = share of the row on evicted positions; the "Q counted as evicted"
// variant adds the quant share.

TEST(Metrics, FutureMissedMassOverDecode) {
  struct Step {
    std::vector<float> attn;
    std::vector<Tier> tiers;
  };
  const std::vector<Step> steps = {
      // step 0, 6 positions; position 2 already evicted, 4..5 local.
      //   full .25 + .25 = .5, quant .125, evicted .125, local .125 + .125 = .25
      {{0.25f, 0.125f, 0.125f, 0.25f, 0.125f, 0.125f}, {F, Q, E, F}},
      // step 1, 7 positions; position 1 went Q -> E, position 4 aged into Q.
      //   full .125 + .125 = .25, quant .125, evicted .125 + .25 = .375, local .25
      {{0.125f, 0.125f, 0.25f, 0.125f, 0.125f, 0.125f, 0.125f}, {F, E, E, F, Q}},
      // step 2, 8 positions, summed over 2 queries (total 2); position 0 went F -> E.
      //   full .25/2 = .125, quant (.25+.25)/2 = .25, evicted (.5+0+.25)/2 = .375,
      //   local (.25+.25)/2 = .25
      {{0.5f, 0.0f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f}, {E, E, E, F, Q, Q}},
      // step 3, 9 positions; position 4 promoted Q -> F, position 6 evicted unseen.
      //   full .5 + .125 = .625, quant .125, evicted 0, local .125 + .125 = .25
      {{0.0f, 0.0f, 0.0f, 0.5f, 0.125f, 0.125f, 0.0f, 0.125f, 0.125f}, {E, E, E, F, F, Q, E}},
  };
  const std::vector<double> fmm = {0.125, 0.375, 0.375, 0.0};
  const std::vector<double> fmm_q = {0.125 + 0.125, 0.375 + 0.125, 0.375 + 0.25, 0.0 + 0.125};
  TierMass sum;
  for (size_t t = 0; t < steps.size(); ++t) {
    const TierMass m =
        mass_by_tier(steps[t].attn.data(), int64_t(steps[t].attn.size()), steps[t].tiers);
    EXPECT_DOUBLE_EQ(m.evicted, fmm[t]) << "step " << t;
    EXPECT_DOUBLE_EQ(m.evicted + m.quant, fmm_q[t]) << "step " << t;
    sum += m;
  }
  const TierMass mean = sum.scaled(1.0 / double(steps.size()));
  // mean FMM = (.125 + .375 + .375 + 0) / 4 = .875 / 4 = .21875
  EXPECT_DOUBLE_EQ(mean.evicted, 0.21875);
  // mean with Q counted = (.25 + .5 + .625 + .125) / 4 = 1.5 / 4 = .375
  EXPECT_DOUBLE_EQ(mean.evicted + mean.quant, 0.375);
  // the other shares: full (.5 + .25 + .125 + .625) / 4 = .375, local (.25 * 4) / 4 = .25
  EXPECT_DOUBLE_EQ(mean.full, 0.375);
  EXPECT_DOUBLE_EQ(mean.local, 0.25);
}

// ---------------------------------------------------------------------------------------------
// 3. window_tiers

TEST(Metrics, WindowTiersSinkAndOmega) {
  // sink 2, ω 3: windows start at 2, 5, 8 -> F, Q, E (the last window is partial: position 8
  // is its only arrived position).
  EXPECT_EQ(window_tiers({L, L, F, F, F, Q, Q, Q, E}, 2, 3), (std::vector<Tier>{F, Q, E}));
}

TEST(Metrics, WindowTiersPartialLastWindow) {
  // sink 1, ω 4, 10 positions: windows start at 1, 5, 9; the last holds only position 9.
  EXPECT_EQ(window_tiers({L, F, F, F, F, E, E, E, E, Q}, 1, 4), (std::vector<Tier>{F, E, Q}));
  // 9 positions: window 2 (starting at 9) has not arrived, so there are two windows.
  EXPECT_EQ(window_tiers({L, F, F, F, F, E, E, E, E}, 1, 4), (std::vector<Tier>{F, E}));
}

TEST(Metrics, WindowTiersTakeFirstPosition) {
  // sink 0, ω 2: windows [0,2) [2,4) take the tier of positions 0 and 2.
  EXPECT_EQ(window_tiers({F, Q, E, F}, 0, 2), (std::vector<Tier>{F, E}));
}

TEST(Metrics, WindowTiersOmegaOne) {
  EXPECT_EQ(window_tiers({L, F, Q, E, L}, 1, 1), (std::vector<Tier>{F, Q, E, L}));
}

TEST(Metrics, WindowTiersSinkBeyondSize) {
  EXPECT_TRUE(window_tiers({L, L, L}, 5, 2).empty());
  EXPECT_TRUE(window_tiers({L, L, L}, 3, 2).empty());  // sink == size
  EXPECT_TRUE(window_tiers({}, 0, 4).empty());
}

// ---------------------------------------------------------------------------------------------
// 4. jaccard_distance

TEST(Metrics, JaccardHandSets) {
  // window:           0  1  2  3  4  5  6
  const std::vector<Tier> a = {F, Q, Q, E, F, L};  // shorter: 6 is not present (L)
  const std::vector<Tier> b = {F, F, E, Q, Q, F, F};
  // kFull, all windows: A = {0,4}, B = {0,1,5,6}; ∩ = {0}, ∪ = {0,1,4,5,6}: 1 - 1/5 = 0.8
  EXPECT_DOUBLE_EQ(jaccard_distance(a, b, KeepSet::kFull, false), 0.8);
  // kFull, common (windows 0..4; 5 and 6 are L in a): A = {0,4}, B = {0,1}; 1 - 1/3
  EXPECT_DOUBLE_EQ(jaccard_distance(a, b, KeepSet::kFull, true), 1.0 - 1.0 / 3.0);
  // kFullOrQuant, all: A = {0,1,2,4}, B = {0,1,3,4,5,6}; ∩ = {0,1,4}, ∪ = 0..6: 1 - 3/7
  EXPECT_DOUBLE_EQ(jaccard_distance(a, b, KeepSet::kFullOrQuant, false), 1.0 - 3.0 / 7.0);
  // kFullOrQuant, common: A = {0,1,2,4}, B = {0,1,3,4}; ∩ = {0,1,4}, ∪ = {0..4}: 1 - 3/5
  EXPECT_DOUBLE_EQ(jaccard_distance(a, b, KeepSet::kFullOrQuant, true), 0.4);
  // symmetric
  EXPECT_DOUBLE_EQ(jaccard_distance(b, a, KeepSet::kFull, false), 0.8);
  EXPECT_DOUBLE_EQ(jaccard_distance(b, a, KeepSet::kFullOrQuant, true), 0.4);
}

TEST(Metrics, JaccardLocalThenFullCountsOnlyWhenNotCommon) {
  // Window 1 is local in the first snapshot and F in the second (it aged in between).
  const std::vector<Tier> a = {F, L}, b = {F, F};
  // common_only: only window 0 takes part: {0} vs {0} -> 0
  EXPECT_DOUBLE_EQ(jaccard_distance(a, b, KeepSet::kFull, true), 0.0);
  // all windows: {0} vs {0,1} -> 1 - 1/2
  EXPECT_DOUBLE_EQ(jaccard_distance(a, b, KeepSet::kFull, false), 0.5);
  // Same with a window that is new in the second snapshot (different lengths).
  EXPECT_DOUBLE_EQ(jaccard_distance({F}, {F, F}, KeepSet::kFull, true), 0.0);
  EXPECT_DOUBLE_EQ(jaccard_distance({F}, {F, F}, KeepSet::kFull, false), 0.5);
}

TEST(Metrics, JaccardEmptyUnion) {
  EXPECT_DOUBLE_EQ(jaccard_distance({}, {}, KeepSet::kFull, false), -1.0);
  EXPECT_DOUBLE_EQ(jaccard_distance({E, Q}, {E, E}, KeepSet::kFull, false), -1.0);
  // Q is kept by kFullOrQuant: {1} vs {} -> 1 - 0/1
  EXPECT_DOUBLE_EQ(jaccard_distance({E, Q}, {E, E}, KeepSet::kFullOrQuant, false), 1.0);
  // common_only with no window routed in both
  EXPECT_DOUBLE_EQ(jaccard_distance({L, L}, {F, F}, KeepSet::kFull, true), -1.0);
}

TEST(Metrics, JaccardIdenticalIsZero) {
  const std::vector<Tier> a = {F, Q, E, F, L};
  for (KeepSet k : {KeepSet::kFull, KeepSet::kFullOrQuant})
    for (bool common : {false, true}) EXPECT_DOUBLE_EQ(jaccard_distance(a, a, k, common), 0.0);
}

TEST(Metrics, JaccardDisjointIsOne) {
  EXPECT_DOUBLE_EQ(jaccard_distance({F, Q}, {Q, F}, KeepSet::kFull, true), 1.0);
}

// ---------------------------------------------------------------------------------------------
// 5. lir_counts

LirCounts one_window(const std::vector<uint8_t>& history) {
  std::vector<std::vector<uint8_t>> rows;
  for (uint8_t x : history) rows.push_back({x});
  return lir_counts(rows);
}

void expect_lir(const LirCounts& c, int64_t windows, int64_t left, int64_t returned) {
  EXPECT_EQ(c.windows, windows);
  EXPECT_EQ(c.left, left);
  EXPECT_EQ(c.returned, returned);
}

TEST(Metrics, LirSingleWindowPatterns) {
  expect_lir(one_window({0, 0, 0, 0}), 0, 0, 0);           // never in F
  expect_lir(one_window({1, 1, 1, 1}), 1, 0, 0);           // in F throughout
  expect_lir(one_window({1, 0, 0, 0}), 1, 1, 0);           // F -> out
  expect_lir(one_window({1, 0, 0, 1}), 1, 1, 1);           // F -> out -> F
  expect_lir(one_window({0, 0, 1, 1}), 1, 0, 0);           // enters later: not a return
  expect_lir(one_window({0, 1, 0, 1, 0, 1, 0}), 1, 1, 1);  // oscillates: counted once
  expect_lir(one_window({1, 0, 1, 0}), 1, 1, 1);           // returned, then left again
}

TEST(Metrics, LirHandHistory) {
  // events e0..e5 (rows), windows w0..w7 (columns); "-" = window not yet present.
  //   w0 never          0 0 0 0 0 0
  //   w1 throughout     1 1 1 1 1 1
  //   w2 F -> out       1 0 0 0 0 0   left
  //   w3 F -> out -> F  1 0 0 1 1 1   left, returned
  //   w4 enters later   0 0 0 1 1 1
  //   w5 oscillates     1 0 1 0 1 0   left, returned (once)
  //   w6 appears at e2  - - 1 1 0 0   left
  //   w7 appears at e4  - - - - 0 1
  const std::vector<std::vector<uint8_t>> in_full = {
      {0, 1, 1, 1, 0, 1},        // e0
      {0, 1, 0, 0, 0, 0},        // e1
      {0, 1, 0, 0, 0, 1, 1},     // e2: w6 appears
      {0, 1, 0, 1, 1, 0, 1},     // e3
      {0, 1, 0, 1, 1, 1, 0, 0},  // e4: w7 appears
      {0, 1, 0, 1, 1, 0, 0, 1},  // e5
  };
  const LirCounts c = lir_counts(in_full);
  // windows seen in F: w1..w7 = 7; left: w2, w3, w5, w6 = 4; returned: w3, w5 = 2
  expect_lir(c, 7, 4, 2);
  EXPECT_DOUBLE_EQ(c.lir(), 0.5);  // 2 / 4
}

TEST(Metrics, LirNothingLeft) {
  const LirCounts c = lir_counts({{1, 0}, {1, 1}, {1, 1, 0}});
  expect_lir(c, 2, 0, 0);
  EXPECT_DOUBLE_EQ(c.lir(), -1.0);
  const LirCounts none = lir_counts({});
  expect_lir(none, 0, 0, 0);
  EXPECT_DOUBLE_EQ(none.lir(), -1.0);
}

TEST(Metrics, LirCountsAccumulate) {
  LirCounts a;
  a.windows = 5;
  a.left = 3;
  a.returned = 1;
  LirCounts b;
  b.windows = 2;
  b.left = 1;
  b.returned = 1;
  a += b;
  expect_lir(a, 7, 4, 2);
  EXPECT_DOUBLE_EQ(a.lir(), 0.5);  // 2 / 4
}

// ---------------------------------------------------------------------------------------------
// 6. top_k_membership

TEST(Metrics, TopKTiesGoToOlderWindow) {
  const std::vector<double> s = {0.5, 0.9, 0.5, 0.1, 0.9};
  // k = 2: the two 0.9s (windows 1 and 4)
  EXPECT_EQ(top_k_membership(s, 5, 2), (std::vector<uint8_t>{0, 1, 0, 0, 1}));
  // k = 3: then the 0.5 tie between windows 0 and 2 goes to window 0
  EXPECT_EQ(top_k_membership(s, 5, 3), (std::vector<uint8_t>{1, 1, 0, 0, 1}));
  // k = 1: the 0.9 tie between 1 and 4 goes to window 1
  EXPECT_EQ(top_k_membership(s, 5, 1), (std::vector<uint8_t>{0, 1, 0, 0, 0}));
  // all equal: the oldest k
  EXPECT_EQ(top_k_membership({1.0, 1.0, 1.0, 1.0}, 4, 2), (std::vector<uint8_t>{1, 1, 0, 0}));
}

TEST(Metrics, TopKZeroAndAll) {
  const std::vector<double> s = {0.5, 0.9, 0.5, 0.1, 0.9};
  EXPECT_EQ(top_k_membership(s, 5, 0), (std::vector<uint8_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(top_k_membership(s, 5, 5), (std::vector<uint8_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(top_k_membership(s, 5, 9), (std::vector<uint8_t>{1, 1, 1, 1, 1}));
  EXPECT_TRUE(top_k_membership({}, 0, 3).empty());
}

TEST(Metrics, TopKFewerCandidates) {
  const std::vector<double> s = {0.5, 0.9, 0.5, 0.1, 0.9};
  // candidates {0.5, 0.9, 0.5}: top 2 = window 1, then window 0 (tie with 2, older wins);
  // window 4's 0.9 is not a candidate.
  EXPECT_EQ(top_k_membership(s, 3, 2), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(top_k_membership(s, 3, 5), (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_TRUE(top_k_membership(s, 0, 2).empty());
  // more candidates than scores: clamped to the scores
  EXPECT_EQ(top_k_membership(s, 8, 2), (std::vector<uint8_t>{0, 1, 0, 0, 1}));
}

// ---------------------------------------------------------------------------------------------
// 7. cosine

TEST(Metrics, CosineHandCases) {
  // {1,2,3}·{2,4,6} = 28, |a|²|b|² = 14·56 = 784 = 28²
  EXPECT_DOUBLE_EQ(cosine({1, 2, 3}, {2, 4, 6}), 1.0);
  EXPECT_DOUBLE_EQ(cosine({1, 0}, {0, 1}), 0.0);
  EXPECT_DOUBLE_EQ(cosine({1, 2, 3}, {-1, -2, -3}), -1.0);
  // |{1,2,2}| = 3, |{0,3,4}| = 5, dot = 0 + 6 + 8 = 14 -> 14 / 15
  EXPECT_DOUBLE_EQ(cosine({1, 2, 2}, {0, 3, 4}), 14.0 / 15.0);
  // |{3,0,-4}| = 5, dot = 3 + 0 - 8 = -5 -> -5 / 15
  EXPECT_DOUBLE_EQ(cosine({1, 2, 2}, {3, 0, -4}), -1.0 / 3.0);
}

TEST(Metrics, CosineDegenerate) {
  EXPECT_DOUBLE_EQ(cosine({0, 0, 0}, {1, 2, 3}), -2.0);
  EXPECT_DOUBLE_EQ(cosine({1, 2, 3}, {0, 0, 0}), -2.0);
  EXPECT_DOUBLE_EQ(cosine({}, {}), -2.0);
  EXPECT_DOUBLE_EQ(cosine({1, 2}, {1, 2, 3}), -2.0);
}

}  // namespace
}  // namespace qevict::eval
