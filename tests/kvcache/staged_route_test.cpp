// --prefill-route staged (issue 52 item 1; tiered_cache.h): while a long prompt is read in
// chunks the cache holds at most a stated bound — sink + local + every aged prompt window at
// M_q + one chunk in 16 bits (KvBudget::staged_prompt_bytes) plus tables and scratch — far
// below the prompt in 16 bits (end's peak); nothing is routed or evicted until the prompt
// ends; the one routing event then leaves every layer within its budget, with every F window
// promoted from its staged copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "common/kv_shape.h"
#include "common/staged_bound.h"
#include "kvcache/cache_peers.h"
#include "kvcache/options.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"
#include "kvcache/routing_schedule.h"
#include "kvcache/window_store.h"

namespace qevict {
namespace {

KvCacheParams staged_params(PrefillRoute route, double budget) {
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = budget;
  p.prefill_route = route;
  KvParamsGiven given;
  given.prefill_route = true;
  EXPECT_TRUE(apply_policy_defaults(&p, given).is_ok());  // window 32, pool 2, K4V2
  return p;
}

// What a cache held just before commit(): the peak the schedule notes for the call.
struct Held {
  size_t all = 0, store = 0;
};

// One forward call of n random tokens.
Held call(TieredKvCache& c, const KvShape& s, int64_t n, ThreadPool& pool, std::mt19937& r,
          const TieredKvCacheTestPeer* peer = nullptr) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  EXPECT_TRUE(c.begin(n).is_ok());
  std::vector<float> q(size_t(n) * s.q_width()), k(size_t(n) * s.kv_width()), v(k.size()),
      o(q.size());
  for (int l = 0; l < s.n_layers; ++l) {
    for (auto& x : q) x = 2.0f * dist(r);
    for (auto& x : k) x = 2.0f * dist(r);
    for (auto& x : v) x = dist(r);
    c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
  }
  const Held h{c.bytes_held(), peer ? peer->store().bytes_allocated() : 0};
  EXPECT_TRUE(c.commit().is_ok());
  return h;
}

TEST(StagedRoute, ScheduleStagesChunksAndRoutesThePromptOnce) {
  RoutingSchedule s(PrefillRoute::kStaged, 8);
  EXPECT_TRUE(s.defers_prompt());
  EXPECT_FALSE(s.holds_prompt());
  EXPECT_EQ(s.on_commit(512, 0), RoutingSchedule::Due::kStagePrompt);
  EXPECT_TRUE(s.prompt_pending());
  EXPECT_EQ(s.on_commit(100, 0), RoutingSchedule::Due::kStagePrompt);
  EXPECT_EQ(s.on_commit(1, 0), RoutingSchedule::Due::kPrompt);
  RoutingSchedule e(PrefillRoute::kEnd, 8);
  EXPECT_TRUE(e.holds_prompt());
  EXPECT_EQ(e.on_commit(512, 0), RoutingSchedule::Due::kHoldPrompt);
}

TEST(StagedRoute, OptionAndValidation) {
  KvCacheParams p;
  KvParamsGiven given;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  ASSERT_TRUE(set_kv_option(&p, &given, "prefill_route", "staged").is_ok());
  EXPECT_EQ(p.prefill_route, PrefillRoute::kStaged);
  EXPECT_STREQ(to_string(p.prefill_route), "staged");
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  EXPECT_EQ(p.prefill_window, 32);  // qevict's scorer for a deferred prompt, as with end
  EXPECT_EQ(p.pool, 2);
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().message();
  EXPECT_TRUE(p.defers_prompt());
  EXPECT_FALSE(p.holds_prompt());
  p.prefill_route = PrefillRoute::kChunk;  // the window scores the one routing of end/staged
  EXPECT_FALSE(p.validate().is_ok());
  p.prefill_route = PrefillRoute::kStaged;
  p.q = 0.0;  // no low-bit tier to stage into
  EXPECT_FALSE(p.validate().is_ok());
  for (const char* other : {"h2o", "snapkv", "kivi", "streaming"}) {
    KvCacheParams o;
    KvParamsGiven g;
    o.policy = other;
    o.budget_fraction = 0.2;
    ASSERT_TRUE(set_kv_option(&o, &g, "prefill_route", "staged").is_ok());
    ASSERT_TRUE(apply_policy_defaults(&o, g).is_ok()) << other;
    EXPECT_FALSE(o.validate().is_ok()) << other << " cannot stage";
  }
}

// A 3,072-token prompt in 256-token calls at 20 % (6 layers, so that the one layer's
// attention scratch is not most of what a cache holds): after every call, what the cache
// held before its commit (the peak the schedule notes) is within the bound; no routing, no
// eviction, no routing demotion until the prompt ends. The same prompt with end peaks above
// the whole prompt in f16; staged stays below it.
TEST(StagedRoute, LongPromptPeakWithinTheStatedBoundAndBelowEndAndFullKv) {
  const KvShape s = test::rope_shape(6, 4, 2, 64);
  const int64_t n_prompt = 3072, chunk = 256, n_ctx = n_prompt + 64;
  const int threads = 2;
  ThreadPool pool(threads);
  size_t peak_of[2] = {0, 0};
  for (PrefillRoute route : {PrefillRoute::kStaged, PrefillRoute::kEnd}) {
    SCOPED_TRACE(to_string(route));
    const KvCacheParams p = staged_params(route, 0.2);
    auto c = TieredKvCacheTestPeer::make(s, n_ctx, p);
    ASSERT_NE(c, nullptr);
    TieredKvCacheTestPeer peer(*c);
    const KvBudget b = report_of(*c).budget;
    std::mt19937 rng(52);
    size_t most = 0;
    for (int64_t n = chunk; n <= n_prompt; n += chunk) {
      const Held h = call(*c, s, chunk, pool, rng, &peer);
      most = std::max(most, h.all);
      const KvReport r = report_of(*c);
      EXPECT_EQ(r.routing_events, 0);
      EXPECT_EQ(r.total().evictions, 0);
      if (route != PrefillRoute::kStaged) continue;
      EXPECT_EQ(r.total().demotions, 0) << "staging is no routing demotion";
      const size_t sb = test::staged_store_bound(s, b, n, chunk);
      const size_t rb =
          test::staged_rest_bound(s, b, n, chunk, p.prefill_window, peer.rope_bytes(), threads);
      if (n % 1024 == 0)
        std::printf("n %lld: held %zu (store %zu of bound %zu, the rest %zu of bound %zu)\n",
                    (long long)n, h.all, h.store, sb, h.all - h.store, rb);
      EXPECT_LE(h.store, sb) << "n " << n;
      EXPECT_LE(h.all, sb + rb) << "n " << n;
    }
    EXPECT_EQ(report_of(*c).peak_bytes_held, most);
    peak_of[route == PrefillRoute::kStaged ? 0 : 1] = most;
  }
  const size_t full_kv = size_t(n_prompt) * s.token_bytes() * size_t(s.n_layers);
  std::printf("peak staged %zu, end %zu; the prompt in f16 %zu\n", peak_of[0], peak_of[1], full_kv);
  EXPECT_LT(peak_of[0], full_kv);
  EXPECT_GT(peak_of[1], full_kv);
}

// The prompt's end: one routing event; every layer within its budget; the F windows are the
// staged copies promoted (one promotion each, no new quantization: Q windows keep theirs);
// decode routes every Ω steps as before.
TEST(StagedRoute, PromptEndRoutesOnceWithinBudgetAndPromotesFFromStagedCopies) {
  const KvShape s = test::rope_shape(2, 4, 2, 64);
  ThreadPool pool(2);
  const KvCacheParams p = staged_params(PrefillRoute::kStaged, 0.2);
  auto c = TieredKvCacheTestPeer::make(s, 1024 + 64, p);
  ASSERT_NE(c, nullptr);
  std::mt19937 rng(7);
  for (int i = 0; i < 8; ++i) call(*c, s, 128, pool, rng);
  KvReport r = report_of(*c);
  const int64_t aged = r.budget.aged_windows(c->n_past());
  for (const KvLayerReport& l : r.layers) {
    EXPECT_EQ(l.quantizations, aged) << "every aged window staged, once";
    EXPECT_EQ(l.windows_quant, aged);
    EXPECT_EQ(l.windows_full, 0);
    EXPECT_EQ(l.promotions + l.demotions + l.evictions, 0);
  }
  EXPECT_EQ(r.routing_events, 0);
  ASSERT_TRUE(c->end_prompt().is_ok());
  r = report_of(*c);
  EXPECT_EQ(r.routing_events, 1);
  for (const KvLayerReport& l : r.layers) {
    EXPECT_LE(l.bytes_budgeted, r.budget.total);
    EXPECT_GT(l.windows_full, 0);
    EXPECT_GT(l.evictions, 0) << "the budget forces a choice";
    EXPECT_EQ(l.promotions, l.windows_full) << "every F window came from its staged copy";
    EXPECT_EQ(l.quantizations, aged) << "Q windows keep their staged copies";
    EXPECT_EQ(l.demotions, 0);
    EXPECT_EQ(l.evicted_at_first_routing, l.evictions);
    EXPECT_EQ(l.bytes_ledger_of_full, size_t(l.windows_full) * r.budget.quant_slot());
  }
  for (int t = 0; t < 16; ++t) call(*c, s, 1, pool, rng);
  r = report_of(*c);
  EXPECT_EQ(r.routing_events, 1 + 16 / p.route_every);
  for (const KvLayerReport& l : r.layers) EXPECT_LE(l.bytes_budgeted, r.budget.total);
}

// A prompt whose aged windows all fit in F is not staged (the routing keeps them all in F):
// the same outputs as end's, bit for bit, and no quantization or promotion.
TEST(StagedRoute, APromptWithinTheBudgetIsHeldAsEndHoldsIt) {
  const KvShape s = test::rope_shape(2, 4, 2, 64);
  ThreadPool pool(2);
  std::vector<std::vector<float>> outs[2];
  int i = 0;
  for (PrefillRoute route : {PrefillRoute::kStaged, PrefillRoute::kEnd}) {
    auto c = TieredKvCacheTestPeer::make(s, 2048, staged_params(route, 0.5));
    ASSERT_NE(c, nullptr);
    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t n : {int64_t(200), int64_t(200), int64_t(1), int64_t(1), int64_t(1)}) {
      if (n == 1 && c->n_past() == 400) {
        ASSERT_TRUE(c->end_prompt().is_ok());
      }
      ASSERT_TRUE(c->begin(n).is_ok());
      std::vector<float> q(size_t(n) * s.q_width()), k(size_t(n) * s.kv_width()), v(k.size()),
          o(q.size());
      for (int l = 0; l < s.n_layers; ++l) {
        for (auto& x : q) x = 2.0f * dist(rng);
        for (auto& x : k) x = 2.0f * dist(rng);
        for (auto& x : v) x = dist(rng);
        c->attend(l, q.data(), k.data(), v.data(), o.data(), pool);
        outs[i].push_back(o);
      }
      ASSERT_TRUE(c->commit().is_ok());
    }
    const KvLayerReport t = report_of(*c).total();
    EXPECT_EQ(t.quantizations, 0);
    EXPECT_EQ(t.promotions, 0);
    EXPECT_GT(t.windows_full, 0);
    ++i;
  }
  EXPECT_EQ(outs[0], outs[1]);
}

}  // namespace
}  // namespace qevict
