// TieredKvCache invariants (issue: tiered KV cache): bytes within budget after every routing
// event, a budget >= the full cache behaves as FullKV, ledger codes survive demote/promote
// cycles bit for bit, promoted keys equal RoPE(dequantized pre-RoPE keys), score
// conservation, and QEvictPolicy against a brute-force model of its rule.
#include "kvcache/tiered_cache.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/kv_shape.h"
#include "core/f16.h"
#include "kernels/kv_quant.h"
#include "kvcache/budget.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/options.h"
#include "kvcache/params.h"
#include "kvcache/policies/qevict_policy.h"

namespace qevict {
namespace {

KvShape test_shape() { return test::rope_shape(2, 6, 2, 16); }

struct Driver {
  KvShape shape = test_shape();
  std::mt19937 rng{1234};
  std::normal_distribution<float> dist{0.0f, 1.0f};
  // One forward call of n tokens through every layer; returns the attention outputs.
  std::vector<std::vector<float>> step(SequenceKvCache& c, int64_t n, ThreadPool& pool,
                                       uint32_t seed) {
    std::mt19937 r(seed);
    std::vector<std::vector<float>> outs;
    EXPECT_TRUE(c.begin(n).is_ok());
    for (int l = 0; l < shape.n_layers; ++l) {
      std::vector<float> q(n * shape.q_width()), k(n * shape.kv_width()), v(k.size()), o(q.size());
      for (auto& x : q) x = 2.0f * dist(r);
      for (auto& x : k) x = 2.0f * dist(r);
      for (auto& x : v) x = dist(r);
      c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
      outs.push_back(o);
    }
    EXPECT_TRUE(c.commit().is_ok());
    return outs;
  }
};

std::unique_ptr<SequenceKvCache> make(const KvShape& s, int64_t n_ctx, KvCacheParams p) {
  auto c = make_kv_cache(s, n_ctx, p);
  EXPECT_TRUE(c.has_value()) << c.error();
  return c.has_value() ? std::move(*c) : nullptr;
}

TEST(TieredKvCache, BytesStayWithinBudgetAfterEveryRoutingEvent) {
  Driver d;
  ThreadPool pool(2);
  for (double q : {0.7, 0.0, 1.0}) {
    for (bool strict : {false, true}) {
      KvCacheParams p;
      p.policy = "qevict";
      p.budget_fraction = 0.2;
      p.q = q;
      p.strict_ledger = strict;
      // ≤ budget after every prefill chunk is --prefill-route chunk's invariant (SPEC §3);
      // end holds the whole prompt until it routes once (prefill_route_test.cpp).
      p.prefill_route = PrefillRoute::kChunk;
      const int64_t n_ctx = 1200;
      auto c = make(d.shape, n_ctx, p);
      ASSERT_NE(c, nullptr);
      int64_t pos = 0;
      uint32_t seed = 1;
      for (int64_t chunk : {int64_t(300), int64_t(64), int64_t(200)}) {
        d.step(*c, chunk, pool, seed++);
        pos += chunk;
        const KvReport r = report_of(*c);
        for (int l = 0; l < d.shape.n_layers; ++l)
          ASSERT_LE(r.layers[l].bytes_budgeted, r.budget.total)
              << "after a prefill chunk at " << pos;
      }
      while (pos < n_ctx) {
        d.step(*c, 1, pool, seed++);
        ++pos;
        const KvReport r = report_of(*c);
        for (int l = 0; l < d.shape.n_layers; ++l)
          ASSERT_LE(r.layers[l].bytes_budgeted, r.budget.total)
              << "decode at " << pos << " (windows aging between events are reserved)";
      }
      const KvReport s = report_of(*c);
      EXPECT_GT(s.routing_events, 75);  // 3 chunks + 636 decode steps / Ω
      EXPECT_GT(s.layers[0].evictions, 0);
      if (q > 0.0 && q < 1.0) {
        EXPECT_GT(s.layers[0].windows_quant, 0);
      }
      if (q == 0.0) {
        EXPECT_EQ(s.layers[0].windows_quant, 0);
      }
    }
  }
}

// Token granularity (ω = 1, the R1 variant) and long windows (ω = 32, R4) use the same
// storage and kernel: the budget holds and attention stays finite.
TEST(TieredKvCache, OtherWindowSizesKeepTheBudget) {
  Driver d;
  ThreadPool pool(2);
  for (int window : {1, 32}) {
    for (double q : {0.0, 0.7}) {
      KvCacheParams p;
      p.policy = "qevict";
      p.budget_fraction = 0.3;
      p.window = window;
      p.q = q;
      p.prefill_route = PrefillRoute::kChunk;  // the bound after each prefill chunk is chunk's
      auto c = make(d.shape, 500, p);
      ASSERT_NE(c, nullptr);
      int64_t pos = 0;
      uint32_t seed = 100;
      for (int64_t n : {int64_t(200), int64_t(1), int64_t(1), int64_t(150)}) {
        const auto outs = d.step(*c, n, pool, seed++);
        pos += n;
        for (const auto& o : outs)
          for (float x : o) ASSERT_TRUE(std::isfinite(x));
        const KvReport r = report_of(*c);
        for (int l = 0; l < d.shape.n_layers; ++l)
          ASSERT_LE(r.layers[l].bytes_budgeted, r.budget.total)
              << "window " << window << " q " << q << " at " << pos;
      }
      EXPECT_GT(report_of(*c).layers[0].evictions, 0) << "window " << window;
    }
  }
}

TEST(TieredKvCache, BudgetCoveringTheFullCacheMatchesFullKv) {
  Driver d;
  ThreadPool pool(2);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 1.5;
  auto tiered = make(d.shape, 700, p);
  FullKvCache full(d.shape, 700);
  uint32_t seed = 7;
  double worst = 0;
  for (int64_t n :
       {int64_t(100), int64_t(1), int64_t(37), int64_t(1), int64_t(1), int64_t(300), int64_t(1)}) {
    auto a = d.step(*tiered, n, pool, seed);
    auto b = d.step(full, n, pool, seed);
    ++seed;
    for (size_t l = 0; l < a.size(); ++l)
      for (size_t i = 0; i < a[l].size(); ++i)
        worst = std::max(worst, double(std::fabs(a[l][i] - b[l][i])));
  }
  // Same f16 keys/values; only the order of floating-point sums differs (8-token blocks vs
  // 256-token pages).
  EXPECT_LT(worst, 2e-6);
  const KvReport s = report_of(*tiered);
  EXPECT_EQ(s.layers[0].evictions, 0);
  EXPECT_EQ(s.layers[0].demotions, 0);
}

TEST(TieredKvCache, LedgerCodesSurviveTenDemotePromoteCycles) {
  Driver d;
  ThreadPool pool(1);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 2.0;  // nothing is routed away; we drive tiers by hand
  auto c = TieredKvCacheTestPeer::make(d.shape, 200, p);
  TieredKvCacheTestPeer t(*c);
  d.step(*c, 120, pool, 3);
  const int32_t w = 2;
  ASSERT_EQ(t.store().window(0, w).tier, Tier::kFull);
  ASSERT_TRUE(t.force_tier(0, w, Tier::kQuant).is_ok());
  const std::vector<uint8_t> codes = t.ledger(0, w);
  ASSERT_FALSE(codes.empty());
  std::vector<uint16_t> first_promoted;
  for (int cycle = 0; cycle < 10; ++cycle) {
    ASSERT_TRUE(t.force_tier(0, w, Tier::kFull).is_ok());
    const auto keys = t.full_keys(0, w);
    if (cycle == 0) first_promoted = keys;
    EXPECT_EQ(keys, first_promoted) << "cycle " << cycle;
    EXPECT_EQ(t.ledger(0, w), codes) << "ledger changed while promoted, cycle " << cycle;
    ASSERT_TRUE(t.force_tier(0, w, Tier::kQuant).is_ok());
    EXPECT_EQ(t.ledger(0, w), codes) << "cycle " << cycle;
  }
  EXPECT_EQ(report_of(*c).layers[0].quantizations, 1);
}

// add_scores (decode's one walk over a layer's window table) must add exactly what
// add_score adds window by window, with evicted windows (no block, an entry kept one event)
// and dropped entries (neither) between the blocks' ids.
TEST(TieredKvCache, AddScoresEqualsAddScoreWindowByWindow) {
  Driver d;
  ThreadPool pool(1);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 2.0;  // nothing is routed away; we drive tiers by hand
  auto c = TieredKvCacheTestPeer::make(d.shape, 300, p);
  TieredKvCacheTestPeer t(*c);
  d.step(*c, 200, pool, 11);
  ASSERT_TRUE(t.force_tier(0, 1, Tier::kEvicted).is_ok());
  ASSERT_TRUE(t.force_tier(0, 6, Tier::kEvicted).is_ok());  // drops window 1's entry
  ASSERT_TRUE(t.force_tier(0, 9, Tier::kQuant).is_ok());
  WindowStore& s = t.mutable_store();
  std::vector<KvBlockRef> blocks;
  std::vector<int32_t> ids;
  s.attention_blocks(0, 200, &blocks, &ids);
  ASSERT_EQ(ids.front(), -1);  // the sink
  ASSERT_EQ(std::count(ids.begin(), ids.end(), 1), 0);
  ASSERT_EQ(std::count(ids.begin(), ids.end(), 6), 0);
  const int32_t n_win = s.n_windows(0);
  std::vector<double> before(static_cast<size_t>(n_win)), mass(ids.size());
  for (int32_t w = 0; w < n_win; ++w) before[w] = s.window(0, w).score;
  for (size_t b = 0; b < ids.size(); ++b) mass[b] = 0.125 * double(b + 1) + 1.0 / 3.0;
  s.add_scores(0, ids.data(), mass.data(), int64_t(ids.size()), 0.7);
  std::vector<double> want = before;
  for (size_t b = 0; b < ids.size(); ++b)
    if (ids[b] >= 0) want[ids[b]] += mass[b] * 0.7;
  for (int32_t w = 0; w < n_win; ++w) EXPECT_EQ(s.window(0, w).score, want[w]) << "window " << w;
  EXPECT_EQ(s.window(0, 6).score, before[6]) << "an evicted window's entry took mass";
}

// apply() walks the plan's entries in id order (the order candidates() gives); a plan whose
// entries come in another order must still move each window to its own tier.
TEST(TieredKvCache, ApplyTakesAPlanInAnyOrder) {
  Driver d;
  ThreadPool pool(1);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 2.0;  // nothing is routed away; the plans below set the tiers
  // By id mod 4: round 0 Q E F Q, round 1 F - Q Q (a promotion, a demotion, a stay).
  const Tier cycle[2][4] = {{Tier::kQuant, Tier::kEvicted, Tier::kFull, Tier::kQuant},
                            {Tier::kFull, Tier::kEvicted, Tier::kQuant, Tier::kQuant}};
  std::vector<std::vector<Tier>> tiers;
  for (bool reversed : {false, true}) {
    auto c = TieredKvCacheTestPeer::make(d.shape, 300, p);
    TieredKvCacheTestPeer t(*c);
    d.step(*c, 200, pool, 13);
    WindowStore& s = t.mutable_store();
    for (int round = 0; round < 2; ++round) {  // the second promotes what the first demoted
      RoutingRequest req;
      s.candidates(0, 200, &req);
      ASSERT_GT(req.candidates.size(), 6u);
      if (reversed) std::reverse(req.candidates.begin(), req.candidates.end());
      RoutingPlan plan;
      plan.reset(req);
      for (size_t i = 0; i < req.candidates.size(); ++i)
        plan.set(i, cycle[round][req.candidates[i].id % 4]);
      ASSERT_TRUE(s.apply(0, req, plan).is_ok());
    }
    std::vector<Tier> got;
    for (int32_t w = 0; w < s.n_windows(0); ++w) got.push_back(s.window(0, w).tier);
    tiers.push_back(got);
  }
  ASSERT_EQ(tiers[0].size(), tiers[1].size());
  for (size_t w = 0; w < tiers[0].size(); ++w)
    EXPECT_EQ(tier_char(tiers[0][w]), tier_char(tiers[1][w])) << "window " << w;
  EXPECT_NE(std::count(tiers[0].begin(), tiers[0].end(), Tier::kQuant), 0);
  EXPECT_NE(std::count(tiers[0].begin(), tiers[0].end(), Tier::kFull), 0);
  EXPECT_NE(std::count(tiers[0].begin(), tiers[0].end(), Tier::kEvicted), 0);
}

TEST(TieredKvCache, PromotedKeysEqualRopeOfDequantizedPreRopeKeys) {
  Driver d;
  ThreadPool pool(1);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 2.0;
  auto c = TieredKvCacheTestPeer::make(d.shape, 200, p);
  TieredKvCacheTestPeer t(*c);
  d.step(*c, 150, pool, 5);
  const int32_t w = 4;
  const auto before = t.full_keys(0, w);  // post-RoPE f16 keys as stored
  ASSERT_TRUE(t.force_tier(0, w, Tier::kQuant).is_ok());
  ASSERT_TRUE(t.force_tier(0, w, Tier::kFull).is_ok());
  const auto after = t.full_keys(0, w);
  const auto ledger = t.ledger(0, w);
  const QuantLayout& ql = t.quant_layout();
  const int H = d.shape.n_kv_heads, D = d.shape.head_dim, W = 8;
  const int64_t pos0 = 5 + int64_t(w) * W;
  std::vector<float> c_(D / 2), s_(D / 2);
  double worst_q = 0;
  for (int h = 0; h < H; ++h) {
    std::vector<float> kpre(size_t(W) * D);
    dequantize_window_head(ql, ledger.data(), h, W, kpre.data(), nullptr);
    for (int tok = 0; tok < W; ++tok) {
      // Independent re-rotation in double.
      for (int i = 0; i < D / 2; ++i) {
        const double th = double(pos0 + tok) * std::pow(10000.0, -2.0 * i / D);
        const double x0 = kpre[tok * D + 2 * i], x1 = kpre[tok * D + 2 * i + 1];
        const double y0 = x0 * std::cos(th) - x1 * std::sin(th),
                     y1 = x0 * std::sin(th) + x1 * std::cos(th);
        for (int j = 0; j < 2; ++j) {
          const double want = j ? y1 : y0;
          const float got = f16_to_f32(after[(size_t(h) * W + tok) * D + 2 * i + j]);
          // within f16 rounding (half an ulp at the value, plus float noise of the rotation)
          const double ulp =
              std::max(std::ldexp(1.0, std::ilogb(std::max(std::fabs(want), 6.1e-5)) - 10), 6e-8);
          EXPECT_LE(std::fabs(got - want), 0.5 * ulp + 1e-5 * std::fabs(want) + 1e-6)
              << "h" << h << " t" << tok;
          worst_q = std::max(
              worst_q,
              (double)std::fabs(got - f16_to_f32(before[(size_t(h) * W + tok) * D + 2 * i + j])));
        }
      }
    }
  }
  EXPECT_GT(worst_q, 0.0) << "INT2 must change something";
}

// --kv-score age ranks by attention per query token that has seen the window: an old window
// with 3.0 over 300 steps (0.01/step) ranks below a young one with 0.5 over 10 (0.05/step).
TEST(TieredKvCache, AgeNormalisedRankScore) {
  auto cand = [](double score, int64_t pos0) {
    RoutingCandidate c;
    c.score = score;
    c.pos0 = pos0;
    return c;
  };
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kSum, cand(3.0, 700), 1000), 3.0);
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kAge, cand(3.0, 700), 1000), 0.01);
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kAge, cand(0.5, 990), 1000), 0.05);
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kAge, cand(0.5, 1000), 1000), 0.5);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  KvParamsGiven given;  // a score is typed where it is parsed: a wrong name never reaches p
  EXPECT_FALSE(set_kv_option(&p, &given, "score", "mean").is_ok());
  p.score = ScoreMode::kAge;
  EXPECT_TRUE(p.validate().is_ok());
  p.policy = "streaming";  // ranks by recency: a score option would be silently ignored
  EXPECT_FALSE(p.validate().is_ok());
}

TEST(TieredKvCache, ScoresConserveOneUnitOfMassPerQueryToken) {
  Driver d;
  ThreadPool pool(2);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 2.0;
  auto c = make(d.shape, 400, p);
  int64_t tokens = 0;
  uint32_t seed = 9;
  for (int64_t n : {int64_t(50), int64_t(1), int64_t(1), int64_t(120), int64_t(1)}) {
    d.step(*c, n, pool, seed++);
    tokens += n;
  }
  // Σ_w S̄(w) + sink = Σ_τ Σ_h (1/H_q) Σ_i a = number of query tokens (nothing evicted).
  double total = 0;
  const KvReport rep = report_of(*c, ReportDetail::kTiers);
  for (double x : rep.window_scores[0]) total += x;
  EXPECT_LE(total, double(tokens) + 1e-3);
  EXPECT_GT(total, 0.3 * double(tokens));  // the sink block holds the rest
}

TEST(TieredKvCache, InvalidParamsGiveClearErrors) {
  const KvShape s = test_shape();
  KvCacheParams p;
  p.policy = "qevict";
  auto c = make_kv_cache(s, 100, p);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().find("budget"), std::string::npos) << c.error();
  // Below sink + local in bytes: refused (a fraction is floored, budget_floor_test.cpp).
  p.budget_bytes = int64_t(s.token_bytes()) * 10;
  c = make_kv_cache(s, 100, p);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().find("does not cover the sink"), std::string::npos) << c.error();
  p.budget_bytes = 0;
  p.budget_fraction = 0.5;
  p.bits = 3;
  c = make_kv_cache(s, 100, p);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().find("bits"), std::string::npos) << c.error();
  p.bits = 2;
  p.policy = "lru";
  EXPECT_FALSE(make_kv_cache(s, 100, p).has_value());
  p.policy = "qevict";
  p.budget_bytes = 100000;
  EXPECT_FALSE(make_kv_cache(s, 100, p).has_value()) << "fraction and bytes together";
}

// --kv-bits auto (0): INT4 when K_f + K_q at 4 bits (plus the local windows) cover every
// window of the context past the sink, INT2 otherwise; the cache is then exactly the one
// built with those bits.
TEST(TieredKvCache, AutoBitsPicksFourOnlyWhenTheBudgetHoldsEveryWindow) {
  const KvShape s = test_shape();
  const int64_t n_ctx = 1000;
  ThreadPool pool(1);
  for (double fraction : {0.1, 0.2, 0.3, 0.4, 0.5, 0.8}) {
    SCOPED_TRACE(fraction);
    KvCacheParams p;
    p.policy = "qevict";
    p.budget_fraction = fraction;
    p.bits = 4;
    auto b4 = compute_budget(CacheKind::kWindowed, s, n_ctx, p);
    ASSERT_TRUE(b4.has_value()) << b4.error();
    const int64_t windows = (n_ctx - p.sink + p.window - 1) / p.window;
    const bool fits = b4->capacity_full + b4->capacity_quant + b4->local_windows >= windows;
    p.bits = 0;
    auto ba = compute_budget(CacheKind::kWindowed, s, n_ctx, p);
    ASSERT_TRUE(ba.has_value()) << ba.error();
    const int want = fits ? 4 : 2;
    EXPECT_EQ(ba->bits, want);
    p.bits = want;
    auto bw = compute_budget(CacheKind::kWindowed, s, n_ctx, p);
    ASSERT_TRUE(bw.has_value());
    EXPECT_EQ(ba->capacity_full, bw->capacity_full);
    EXPECT_EQ(ba->capacity_quant, bw->capacity_quant);
    EXPECT_EQ(ba->window_quant, bw->window_quant);
    // The cache built with auto is the one built with the chosen bits: same outputs.
    p.bits = 0;
    auto a = make(s, n_ctx, p);
    p.bits = want;
    auto w = make(s, n_ctx, p);
    ASSERT_TRUE(a && w);
    EXPECT_NE(a->describe().find(fmt::format("INT{}", want)), std::string::npos) << a->describe();
    Driver da, dw;  // one each: a normal_distribution carries state between calls
    for (int64_t done = 0; done < 900;) {
      const int64_t n = done < 600 ? 200 : 1;
      ASSERT_EQ(da.step(*a, n, pool, uint32_t(done)), dw.step(*w, n, pool, uint32_t(done)))
          << "at " << done;
      done += n;
    }
  }
  // Small budgets take INT2, large ones INT4 (both happen in the loop above).
  KvCacheParams p;
  p.policy = "qevict";
  p.bits = 0;
  p.budget_fraction = 0.1;
  EXPECT_EQ(compute_budget(CacheKind::kWindowed, s, n_ctx, p)->bits, 2);
  p.budget_fraction = 0.8;
  EXPECT_EQ(compute_budget(CacheKind::kWindowed, s, n_ctx, p)->bits, 4);
}

// --kv-value-bits: the low-bit tier's values at other bits than its keys. The budget
// charges the mixed window's real bytes (between INT2's and INT4's), the cache stays within
// it, holds quantized windows, says what it holds, and value bits equal to the key bits are
// the uniform layout (the same outputs).
TEST(TieredKvCache, ValueBitsSetTheLowBitValuesAlone) {
  const KvShape s = test_shape();
  const int64_t n_ctx = 1000;
  ThreadPool pool(1);
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  p.prefill_route = PrefillRoute::kChunk;
  auto window_quant = [&](int bits, int vbits) {
    KvCacheParams pp = p;
    pp.bits = bits;
    pp.value_bits = vbits;
    auto b = compute_budget(CacheKind::kWindowed, s, n_ctx, pp);
    EXPECT_TRUE(b.has_value()) << b.error();
    return b.has_value() ? b->window_quant : size_t(0);
  };
  const size_t m42 = window_quant(4, 2);
  EXPECT_EQ(m42, (QuantLayout{4, s.n_kv_heads, s.head_dim, 8, 0, 2}).window_bytes() +
                     kWindowEntryBytes);  // M_q: the low-bit window + its entry
  EXPECT_EQ(window_quant(2, 4), m42);
  EXPECT_GT(m42, window_quant(2, 0));
  EXPECT_LT(m42, window_quant(4, 0));
  EXPECT_EQ(window_quant(4, 4), window_quant(4, 0));

  p.bits = 4;
  p.value_bits = 2;
  auto mixed = make(s, n_ctx, p);
  ASSERT_NE(mixed, nullptr);
  EXPECT_NE(mixed->describe().find("INT4 keys, INT2 values"), std::string::npos)
      << mixed->describe();
  p.value_bits = 4;
  auto same = make(s, n_ctx, p);
  p.value_bits = 0;
  auto uniform = make(s, n_ctx, p);
  ASSERT_TRUE(same && uniform);
  Driver dm, ds, du;
  bool differs = false;
  for (int64_t done = 0; done < 900;) {
    const int64_t n = done < 600 ? 200 : 1;
    const auto om = dm.step(*mixed, n, pool, uint32_t(done));
    const auto os = ds.step(*same, n, pool, uint32_t(done));
    ASSERT_EQ(os, du.step(*uniform, n, pool, uint32_t(done))) << "at " << done;
    differs = differs || om != os;
    done += n;
    const KvReport r = report_of(*mixed);
    for (int l = 0; l < s.n_layers; ++l)
      ASSERT_LE(r.layers[l].bytes_budgeted, r.budget.total) << "at " << done;
  }
  EXPECT_TRUE(differs) << "2-bit values gave the 4-bit values' outputs";
  const KvReport r = report_of(*mixed);
  EXPECT_GT(r.layers[0].windows_quant, 0);
  EXPECT_GT(r.layers[0].evictions, 0);

  // Bad input: 3 bits, a per-head cache, and auto key bits.
  KvCacheParams bad;
  bad.policy = "qevict";
  bad.value_bits = 3;
  EXPECT_FALSE(bad.validate().is_ok());
  bad.value_bits = 2;
  bad.bits = 0;
  EXPECT_FALSE(bad.validate().is_ok());
  bad.bits = 2;
  EXPECT_TRUE(bad.validate().is_ok());
  bad.policy = "h2o";
  EXPECT_FALSE(bad.validate().is_ok());
}

// Large slots get small chunks: a pool of 24 KiB windows (ω = 32 on SmolLM2) grows by two
// slots at a time, not 32 (which would hold 768 KiB per layer whatever the budget).
TEST(SlotPool, ChunksOfLargeSlotsStaySmall) {
  SlotPool big(24576);
  EXPECT_EQ(big.chunk_slots(), 2);  // 64 KiB / 24 KiB
  const int32_t a = big.acquire();
  EXPECT_EQ(big.bytes_allocated(), size_t(2) * 24576);
  const int32_t b = big.acquire(), c = big.acquire();
  EXPECT_EQ(big.bytes_allocated(), size_t(4) * 24576);
  big.at(c)[0] = 7;
  big.release(a);
  big.release(b);
  const auto moves = big.compact();  // 1 live slot: one chunk of 2 is enough
  EXPECT_EQ(big.bytes_allocated(), size_t(2) * 24576);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(big.at(moves[0].second)[0], 7);
  EXPECT_EQ(SlotPool(70000).chunk_slots(), 1);  // never less than one slot
  EXPECT_EQ(SlotPool(4).chunk_slots(), SlotPool::kChunkSlots);
}

TEST(SlotPool, CompactMovesLiveSlotsDownAndReleasesChunks) {
  SlotPool pool(4);
  std::vector<int32_t> ids;
  for (int i = 0; i < 100; ++i) {
    ids.push_back(pool.acquire());
    for (int b = 0; b < 4; ++b) pool.at(ids.back())[b] = uint8_t(i);
  }
  EXPECT_EQ(pool.bytes_allocated(), size_t(4) * 4 * SlotPool::kChunkSlots);
  // Keep every 7th slot alive.
  std::vector<std::pair<int32_t, int>> live;
  for (int i = 0; i < 100; ++i) {
    if (i % 7 == 0)
      live.push_back({ids[i], i});
    else
      pool.release(ids[i]);
  }
  const auto moves = pool.compact();
  EXPECT_EQ(pool.bytes_allocated(), size_t(4) * SlotPool::kChunkSlots);  // 15 live: one chunk
  for (auto& [slot, value] : live) {
    for (const auto& [from, to] : moves)
      if (slot == from) {
        slot = to;
        break;
      }
    ASSERT_LT(slot, SlotPool::kChunkSlots);
    for (int b = 0; b < 4; ++b) ASSERT_EQ(pool.at(slot)[b], uint8_t(value));
  }
  // Acquiring after compaction never hands out a live slot.
  std::vector<char> used(SlotPool::kChunkSlots * 2, 0);
  for (auto& [slot, v] : live) used[slot] = 1;
  for (int i = 0; i < 17; ++i) {
    const int32_t s = pool.acquire();
    ASSERT_FALSE(used[s]) << s;
    used[s] = 1;
  }
  EXPECT_EQ(pool.in_use(), 32);
}

// Brute force: rank by (score desc, window asc); fill F by count, then Q, rest E. With
// pooling (r > 0), by (the max score among candidates within r ids desc, own score desc,
// window asc).
// (pool radius, after_only)
class QEvictPolicyRule : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(QEvictPolicyRule, MatchesBruteForceRule) {
  const auto [r, after_only] = GetParam();
  std::mt19937 rng(17 + r + (after_only ? 100 : 0));
  QEvictPolicy pol(ScoreMode::kSum, r, after_only);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = int(rng() % 40);
    RoutingRequest req;
    auto& in = req.candidates;
    in.resize(n);
    for (int i = 0; i < n; ++i) {
      in[i].id = i * 3 + int(rng() % 3);
      in[i].pos0 = 5 + int64_t(in[i].id) * 8;
      in[i].score = double(rng() % 7);  // many ties
      in[i].tier = Tier(rng() % 3);
    }
    if (trial % 2 == 0) std::shuffle(in.begin(), in.end(), rng);  // else in id order, as stored
    RoutingBudget& b = req.budget;
    req.n_past = 1000;
    b.window_full = 100;
    b.window_quant = 30;
    int kf = int(rng() % 10), kq = int(rng() % 15);
    b.full_bytes = size_t(kf) * 100 + rng() % 100;
    b.quant_bytes = size_t(kq) * 30 + rng() % 30;
    RoutingPlan plan;
    pol.plan(req, &plan);
    ASSERT_TRUE(check_plan(req, plan).is_ok()) << check_plan(req, plan).message();
    // Everything fits in F within the whole budget: all stay in F.
    if (size_t(n) * 100 <= b.full_bytes + b.quant_bytes) kf = n, kq = 0;
    std::vector<int> idx(n);
    for (int i = 0; i < n; ++i) idx[i] = i;
    std::vector<double> pooled(n);
    for (int i = 0; i < n; ++i) {
      pooled[i] = in[i].score;
      for (int j = 0; j < n; ++j)
        if (in[j].id >= in[i].id - r && in[j].id <= in[i].id + (after_only ? 0 : r))
          pooled[i] = std::max(pooled[i], in[j].score);
    }
    for (int i = 0; i < n; ++i)  // selection sort: obviously right
      for (int j = i + 1; j < n; ++j) {
        const int a = idx[i], c = idx[j];
        const auto key = [&](int x) { return std::make_tuple(-pooled[x], -in[x].score, in[x].id); };
        if (key(c) < key(a)) std::swap(idx[i], idx[j]);
      }
    for (int k = 0; k < n; ++k) {
      const Tier want = k < kf ? Tier::kFull : k < kf + kq ? Tier::kQuant : Tier::kEvicted;
      ASSERT_EQ(plan.entries[idx[k]].id, in[idx[k]].id);
      ASSERT_EQ(int(plan.entries[idx[k]].to), int(want)) << "trial " << trial << " rank " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Pool, QEvictPolicyRule,
                         ::testing::Combine(::testing::Values(0, 1, 2, 5), ::testing::Bool()));

// Pooling at work: a lone peak's neighbours outrank a middling window far from it, and the
// peak itself keeps its place ahead of them. One F slot, two Q slots.
TEST(QEvictPolicy, PoolingKeepsAPeaksNeighbours) {
  RoutingRequest req;
  const double score[] = {0.1, 0.3, 5.0, 0.1, 0.1, 0.1, 0.1, 0.2};
  for (int i = 0; i < 8; ++i) {
    RoutingCandidate c;
    c.id = i;
    c.pos0 = 5 + 8 * i;
    c.score = score[i];
    req.candidates.push_back(c);
  }
  req.n_past = 1000;
  req.budget.window_full = 100;
  req.budget.window_quant = 30;
  req.budget.full_bytes = 100;
  req.budget.quant_bytes = 60;
  auto tiers = [&](int pool, bool after_only = false) {
    QEvictPolicy pol(ScoreMode::kSum, pool, after_only);
    RoutingPlan plan;
    pol.plan(req, &plan);
    EXPECT_TRUE(check_plan(req, plan).is_ok());
    std::string t;
    for (const auto& e : plan.entries) t += tier_char(e.to);
    return t;
  };
  EXPECT_EQ(tiers(0), "EQFEEEEQ");  // own scores: 5.0 F, then 0.3 and 0.2 Q
  EXPECT_EQ(tiers(1), "EQFQEEEE");  // windows 1 and 3 rank with the peak
  // Only the windows after the peak rise with it: 3 and 4 outrank 1 (0.3) at radius 2.
  EXPECT_EQ(tiers(2, true), "EEFQQEEE");
}

}  // namespace
}  // namespace qevict
