// A tiered cache committed alone (commit_alone / end_prompt_alone) routes its layers on the
// pool's threads, and a per-head cache (H2O) its heads, each thread with its own copy of the
// policy: the result must be exactly what one thread gives. Two caches with the same parameters
// take the same random calls, one through commit() / end_prompt(), the other through the *_alone
// calls on a 2-thread pool; after every call their outputs (every layer), tiers per position,
// scores and bytes held must be equal, bit for bit.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "kvcache/factory.h"
#include "kvcache/head_cache.h"
#include "kvcache/params.h"
#include "kvcache/tiered_cache.h"

namespace qevict {
namespace {

KvShape shape() {
  return test::rope_shape(5, 4, 2, 16);  // 5 layers: the threads take different numbers
}

struct Variant {
  std::string name;
  KvCacheParams p;
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  auto q = [](const std::string& route, int pool, const std::string& side, double q_share) {
    KvCacheParams p;
    p.policy = "qevict";
    p.budget_fraction = 0.2;
    p.prefill_route = test::route_of(route);
    p.prefill_window = route == "end" ? 16 : 0;
    p.pool = pool;
    p.pool_side = test::side_of(side);
    p.q = q_share;
    return p;
  };
  out.push_back({"qevict chunk", q("chunk", 0, "both", 0.7)});
  out.push_back({"qevict end pool 2", q("end", 2, "both", 0.7)});
  out.push_back({"qevict end pool 2 after", q("end", 2, "after", 0.7)});
  out.push_back({"two-tier end", q("end", 0, "both", 0.0)});
  KvCacheParams st;
  st.policy = "streaming";
  st.budget_fraction = 0.2;
  out.push_back({"streaming", st});
  KvCacheParams h2o;  // per head, routing every step
  h2o.policy = "h2o";
  h2o.budget_fraction = 0.2;
  out.push_back({"h2o", h2o});
  KvCacheParams h2o_end = h2o;
  h2o_end.prefill_route = PrefillRoute::kEnd;
  out.push_back({"h2o end", h2o_end});
  return out;
}

TEST(ParallelRouting, LayersOnThreadsGiveWhatOneThreadGives) {
  const KvShape s = shape();
  const int64_t n_ctx = 1200, prompt = 700, decode = 200;
  ThreadPool one(1), two(2);
  for (const Variant& var : variants()) {
    SCOPED_TRACE(var.name);
    KvCacheParams p = var.p;
    auto a_or = make_kv_cache(s, n_ctx, p);
    auto b_or = make_kv_cache(s, n_ctx, p);
    ASSERT_TRUE(a_or.has_value()) << a_or.error();
    ASSERT_TRUE(b_or.has_value()) << b_or.error();
    SequenceKvCache& a = **a_or;
    SequenceKvCache& b = **b_or;
    ASSERT_TRUE(dynamic_cast<TieredKvCache*>(&b) != nullptr ||
                dynamic_cast<HeadKvCache*>(&b) != nullptr);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int qw = s.q_width(), kw = s.kv_width();
    int64_t routing_events = 0, moves = 0;
    auto step = [&](int64_t n, bool last_chunk) {
      // Layers get different data (their routing differs); a few keys stand out so that
      // scores spread.
      std::vector<float> q(size_t(n) * qw), k(size_t(n) * kw), v(size_t(n) * kw);
      std::vector<float> oa(q.size()), ob(q.size());
      ASSERT_TRUE(a.begin(n).is_ok());
      ASSERT_TRUE(b.begin(n).is_ok());
      for (int l = 0; l < s.n_layers; ++l) {
        for (float& x : q) x = 2.0f * nd(rng);
        for (float& x : k) x = nd(rng) * (rng() % 13 == 0 ? 4.0f : 1.0f);
        for (float& x : v) x = nd(rng);
        a.attend(l, q.data(), k.data(), v.data(), oa.data(), one);
        b.attend(l, q.data(), k.data(), v.data(), ob.data(), one);
        ASSERT_EQ(oa, ob) << "layer " << l << " at " << a.n_past();
      }
      ASSERT_TRUE(a.commit().is_ok());
      ASSERT_TRUE(b.commit_alone(two).is_ok());
      if (last_chunk) {
        ASSERT_TRUE(a.end_prompt().is_ok());
        ASSERT_TRUE(b.end_prompt_alone(two).is_ok());
      }
      KvReport ra, rb;
      a.report(&ra, ReportDetail::kTiers);
      b.report(&rb, ReportDetail::kTiers);
      ASSERT_EQ(ra.position_tiers, rb.position_tiers) << "at " << a.n_past();
      ASSERT_EQ(ra.window_scores, rb.window_scores) << "at " << a.n_past();
      ASSERT_EQ(ra.layers.size(), rb.layers.size());
      for (size_t l = 0; l < ra.layers.size(); ++l) {
        ASSERT_EQ(ra.layers[l].quantizations, rb.layers[l].quantizations);
        ASSERT_EQ(ra.layers[l].promotions, rb.layers[l].promotions);
        ASSERT_EQ(ra.layers[l].evictions, rb.layers[l].evictions);
        ASSERT_EQ(ra.layers[l].bytes_allocated, rb.layers[l].bytes_allocated);
      }
      ASSERT_EQ(ra.routing_events, rb.routing_events);
      routing_events = rb.routing_events;
      moves = 0;
      for (const auto& L : rb.layers) moves += L.promotions + L.evictions + L.quantizations;
    };
    for (int64_t done = 0; done < prompt;) {
      const int64_t n = std::min<int64_t>(128, prompt - done);
      done += n;
      step(n, done == prompt);
      if (HasFatalFailure()) return;
    }
    for (int64_t t = 0; t < decode; ++t) {
      step(1, false);
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(routing_events, 20);  // the test routed, and moved windows
    EXPECT_GT(moves, 100);
  }
}

}  // namespace
}  // namespace qevict
