// Two turns through one cache (issue 51: the question arrives after the compression): turn 1's
// prompt in chunks and end_prompt(), a few decode steps, turn 2's prompt chunk and
// end_prompt(), decode again. Every cache holds its budget after every step, and the
// observation-window caches (the tiered cache's prefill window, the SnapKV family) rank
// turn 2's routing by turn 2's own last queries: a needle that only they attend to is kept,
// although the decode steps and the turn's earlier queries attend to other tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/kv_shape.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/options.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

KvShape shape() { return test::rope_shape(2, 2, 1, 32); }  // KIVI groups 32 channels

std::unique_ptr<SequenceKvCache> make(const KvShape& s, int64_t n_ctx, const KvCacheParams& p) {
  auto c = make_kv_cache(s, n_ctx, p);
  EXPECT_TRUE(c.has_value()) << c.error();
  return c.has_value() ? std::move(*c) : nullptr;
}

// `policy`, or "qevict/staged": qevict with --prefill-route staged.
KvCacheParams params_of(std::string policy, double budget) {
  KvCacheParams p;
  KvParamsGiven given;
  if (policy == "qevict/staged") {
    policy = "qevict";
    p.prefill_route = PrefillRoute::kStaged;
    given.prefill_route = true;
  }
  p.policy = policy;
  const PolicyInfo* row = find_policy(policy);
  EXPECT_NE(row, nullptr) << policy;
  if (row && row->kind != CacheKind::kFull && row->kind != CacheKind::kQuantized)
    p.budget_fraction = budget;
  EXPECT_TRUE(apply_policy_defaults(&p, given).is_ok()) << policy;
  EXPECT_TRUE(p.validate().is_ok()) << policy << ": " << p.validate().message();
  return p;
}

// What a token's key carries and what its query attends to (the key directions e0..e3 are
// disjoint, so a query reads only the tokens of its direction):
//   sink (pos < 5)   key 3·e1                 haystack   key e1 + noise, query 8·e1 + noise
//   needle A         key 4·e0, value 10·e5    needle B   key 4·e2, value 10·e6
//   distractor D     key 4·e3
//   question AB      query 6·(e0 + e2)        ask A      query 6·e0
//   ask D            query 6·(e3 + e0)        ask B      query 6·e2
enum class Key { kHaystack, kA, kB, kD, kRandom };
enum class Query { kHaystack, kAB, kA, kD, kB, kRandom };

struct Driver {
  KvShape s = shape();
  std::mt19937 rng{51};
  std::normal_distribution<float> noise{0.0f, 1.0f};

  // One forward call of n tokens with the given keys and queries; false if an output is not
  // finite.
  bool call(SequenceKvCache& c, int64_t n, Key key, Query query, ThreadPool& pool) {
    const int64_t p0 = c.n_past();
    const int qw = s.q_width(), kw = s.kv_width(), d = s.head_dim;
    std::vector<float> q(size_t(n) * qw, 0.0f), k(size_t(n) * kw, 0.0f), v(k.size(), 0.0f),
        o(q.size());
    for (int64_t t = 0; t < n; ++t) {
      float* kt = k.data() + t * kw;
      float* vt = v.data() + t * kw;
      for (int i = 0; i < d; ++i) vt[i] = noise(rng);
      if (key == Key::kRandom) {
        for (int i = 0; i < kw; ++i) kt[i] = 2.0f * noise(rng);
      } else if (p0 + t < 5) {
        kt[1] = 3.0f;
      } else if (key == Key::kA) {
        kt[0] = 4.0f, vt[5] = 10.0f;
      } else if (key == Key::kB) {
        kt[2] = 4.0f, vt[6] = 10.0f;
      } else if (key == Key::kD) {
        kt[3] = 4.0f;
      } else {
        kt[1] = 1.0f;
        for (int i = 4; i < d; ++i) kt[i] = 0.3f * noise(rng);
      }
      for (int h = 0; h < s.n_q_heads; ++h) {
        float* qt = q.data() + size_t(t) * qw + h * d;
        switch (query) {
          case Query::kRandom:
            for (int i = 0; i < d; ++i) qt[i] = 2.0f * noise(rng);
            break;
          case Query::kHaystack:
            qt[1] = 8.0f;
            for (int i = 4; i < d; ++i) qt[i] = 0.3f * noise(rng);
            break;
          case Query::kAB:
            qt[0] = qt[2] = 6.0f;
            break;
          case Query::kA:
            qt[0] = 6.0f;
            break;
          case Query::kD:
            qt[0] = qt[3] = 6.0f;
            break;
          case Query::kB:
            qt[2] = 6.0f;
            break;
        }
      }
    }
    EXPECT_TRUE(c.begin(n).is_ok());
    for (int l = 0; l < s.n_layers; ++l) c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
    EXPECT_TRUE(c.commit().is_ok());
    for (float x : o)
      if (!std::isfinite(x)) return false;
    return true;
  }
};

// The budget each layer is held to (budgeted kinds), or the bytes of the tokens themselves
// (quantizers; FullKV: the tokens seen). `slack` tokens per KV head beyond it for per-head
// caches between routing events.
void expect_within_budget(const SequenceKvCache& c, const KvShape& s, int64_t slack,
                          const std::string& where) {
  const KvReport r = report_of(c);
  const KvBudget& b = r.budget;
  if (b.kind == CacheKind::kFull) return;
  for (size_t l = 0; l < r.layers.size(); ++l) {
    if (b.kind == CacheKind::kQuantized) {
      EXPECT_LE(r.layers[l].bytes_budgeted, size_t(c.n_past()) * b.token_bytes) << where;
      continue;
    }
    const size_t extra =
        b.kind == CacheKind::kPerHead ? size_t(slack) * s.n_kv_heads * b.head_token_bytes : 0;
    EXPECT_LE(r.layers[l].bytes_budgeted, b.total + extra) << where << ", layer " << l;
  }
}

// Turn 1 (3 chunks and end_prompt), 8 decode steps, turn 2 (one chunk and end_prompt), 8
// decode steps: the budget holds after every step and every output is finite.
TEST(TwoTurns, EveryCacheHoldsItsBudgetAcrossTurns) {
  ThreadPool pool(2);
  for (const std::string policy :
       {"qevict", "qevict/staged", "snapkv", "adakv", "h2o", "streaming", "kivi", "full"}) {
    SCOPED_TRACE(policy);
    Driver d;
    const KvCacheParams p = params_of(policy, 0.3);
    auto c = make(d.s, 420, p);
    ASSERT_NE(c, nullptr);
    const int omega = std::max(p.route_every, 1);
    for (int chunk = 0; chunk < 3; ++chunk)
      ASSERT_TRUE(d.call(*c, 100, Key::kRandom, Query::kRandom, pool));
    ASSERT_TRUE(c->end_prompt().is_ok());
    expect_within_budget(*c, d.s, 0, "turn 1 ended");
    for (int t = 0; t < 8; ++t) {
      ASSERT_TRUE(d.call(*c, 1, Key::kRandom, Query::kRandom, pool));
      expect_within_budget(*c, d.s, omega, "turn 1 decode step " + std::to_string(t));
    }
    const int64_t events = report_of(*c).routing_events;
    const int64_t quantized = report_of(*c).total().quantizations;
    ASSERT_TRUE(d.call(*c, 60, Key::kRandom, Query::kRandom, pool));
    EXPECT_EQ(c->n_past(), 368);
    const bool held = p.defers_prompt() && report_of(*c).budget.budgeted();
    // With --prefill-route end the new turn's chunk is held whole until its end, as a prompt;
    // with staged its aged windows are staged meanwhile (quantized, none evicted).
    if (held) {
      EXPECT_EQ(report_of(*c).routing_events, events) << "turn 2's chunk is held";
    }
    if (policy == "qevict/staged") {
      const KvLayerReport t = report_of(*c).total();
      EXPECT_GT(t.quantizations, quantized) << "turn 2's aged windows are staged";
      ASSERT_TRUE(c->end_prompt().is_ok());
      EXPECT_GT(report_of(*c).total().evictions, t.evictions) << "turn 2's end evicts to fit";
    }
    ASSERT_TRUE(c->end_prompt().is_ok());
    expect_within_budget(*c, d.s, 0, "turn 2 ended");
    if (held) {
      EXPECT_EQ(report_of(*c).routing_events, events + 1) << "turn 2's end routes once";
    }
    for (int t = 0; t < 8; ++t) {
      ASSERT_TRUE(d.call(*c, 1, Key::kRandom, Query::kRandom, pool));
      expect_within_budget(*c, d.s, omega, "turn 2 decode step " + std::to_string(t));
    }
    EXPECT_EQ(c->n_past(), 376);
  }
}

// Needles A and B in turn 1, both read by turn 1's question; the decode steps then read A;
// turn 2 opens with 24 distractor tokens D that its first 200 queries read (with A), and ends
// with 32 queries that read B alone. Ranked by turn 2's last queries (its observation
// window), B is kept; ranked by every query since turn 1 ended, A and D fill the heavy
// budget and B is evicted.
TEST(TwoTurns, TurnTwoRoutingRanksByTurnTwosLastQueries) {
  ThreadPool pool(2);
  for (const std::string policy : {"snapkv", "adakv", "qevict", "qevict/staged"}) {
    SCOPED_TRACE(policy);
    Driver d;
    const int64_t n_ctx = 620;
    KvCacheParams p = params_of(policy, 0.2);
    if (policy.rfind("qevict", 0) != 0) {
      // A heavy budget of 32 tokens per head (beyond the sink, the recent tokens and the Ω
      // decode tokens between routings it charges): both needles fit at turn 1 (16 tokens,
      // 28 with the 3 neighbours on each side that AdaKV's max-pooling (k 7) scores alike);
      // at turn 2, A, D and B (40; 58 pooled) do not.
      auto b = compute_budget(CacheKind::kPerHead, d.s, n_ctx, p);
      ASSERT_TRUE(b.has_value()) << b.error();
      p.budget_fraction = 0.0;
      p.budget_bytes =
          int64_t((p.route_every + b->sink + b->local + 32) * b->head_token_bytes * d.s.n_kv_heads);
      b = compute_budget(CacheKind::kPerHead, d.s, n_ctx, p);
      ASSERT_TRUE(b.has_value()) << b.error();
      ASSERT_GE(b->head_heavy, 16);
    }
    auto c = make(d.s, n_ctx, p);
    ASSERT_NE(c, nullptr);
    const int64_t a0 = 40, b0 = 120;
    // Turn 1: haystack with A at [40, 48) and B at [120, 128), then the question on both.
    ASSERT_TRUE(d.call(*c, a0, Key::kHaystack, Query::kHaystack, pool));
    ASSERT_TRUE(d.call(*c, 8, Key::kA, Query::kHaystack, pool));
    ASSERT_TRUE(d.call(*c, b0 - a0 - 8, Key::kHaystack, Query::kHaystack, pool));
    ASSERT_TRUE(d.call(*c, 8, Key::kB, Query::kHaystack, pool));
    ASSERT_TRUE(d.call(*c, 300 - b0 - 8, Key::kHaystack, Query::kHaystack, pool));
    ASSERT_TRUE(d.call(*c, 32, Key::kHaystack, Query::kAB, pool));
    ASSERT_TRUE(c->end_prompt().is_ok());
    KvReport r = report_of(*c, ReportDetail::kTiers);
    for (size_t u = 0; u < r.position_tiers.size(); ++u)
      for (int64_t x : {a0, b0})
        ASSERT_NE(int(r.position_tiers[u][size_t(x)]), int(Tier::kEvicted))
            << "turn 1 keeps both needles: unit " << u << " position " << x;
    for (int t = 0; t < 8; ++t) ASSERT_TRUE(d.call(*c, 1, Key::kHaystack, Query::kA, pool));
    const int64_t evicted_turn1 = report_of(*c).total().evictions;
    // Turn 2: D, then 200 queries on D and A, then 32 on B.
    const int64_t d0 = c->n_past();
    ASSERT_TRUE(d.call(*c, 24, Key::kD, Query::kD, pool));
    ASSERT_TRUE(d.call(*c, 200, Key::kHaystack, Query::kD, pool));
    ASSERT_TRUE(d.call(*c, 32, Key::kHaystack, Query::kB, pool));
    ASSERT_TRUE(c->end_prompt().is_ok());
    r = report_of(*c, ReportDetail::kTiers);
    for (int l = 0; l < d.s.n_layers; ++l)
      EXPECT_LE(r.layers[size_t(l)].bytes_budgeted, r.budget.total) << "layer " << l;
    int64_t d_kept = 0;
    for (size_t u = 0; u < r.position_tiers.size(); ++u) {
      for (int64_t x = b0; x < b0 + 8; ++x)
        EXPECT_NE(int(r.position_tiers[u][size_t(x)]), int(Tier::kEvicted))
            << "needle B, unit " << u << " position " << x;
      if (policy.rfind("qevict", 0) == 0) {
        EXPECT_EQ(int(r.position_tiers[u][size_t(b0)]), int(Tier::kFull)) << "unit " << u;
      }
      for (int64_t x = d0; x < d0 + 24; ++x)
        d_kept += r.position_tiers[u][size_t(x)] != Tier::kEvicted;
    }
    // (D and the haystack score alike under B's queries; which of them the budget evicts is
    // their tie's order, so staged, whose scores carry its low-bit keys' noise, is checked
    // on its evictions instead.)
    if (policy == "qevict/staged") {
      EXPECT_GT(r.total().evictions, evicted_turn1) << "the budget forces a choice";
    } else {
      EXPECT_LT(d_kept, int64_t(r.position_tiers.size()) * 24) << "the budget forces a choice";
    }
    // Decoding reads B's value (10·e6 on channel 6 of every query head's output).
    std::vector<float> q(size_t(d.s.q_width()), 0.0f), k(size_t(d.s.kv_width()), 0.0f),
        v(k.size(), 0.0f), o(q.size());
    for (int h = 0; h < d.s.n_q_heads; ++h) q[size_t(h * d.s.head_dim + 2)] = 6.0f;
    k[1] = 1.0f;
    ASSERT_TRUE(c->begin(1).is_ok());
    for (int l = 0; l < d.s.n_layers; ++l) {
      c->attend(l, q.data(), k.data(), v.data(), o.data(), pool);
      for (int h = 0; h < d.s.n_q_heads; ++h)
        EXPECT_GT(o[size_t(h * d.s.head_dim + 6)], 5.0f) << "layer " << l << " head " << h;
    }
    ASSERT_TRUE(c->commit().is_ok());
  }
}

}  // namespace
}  // namespace qevict
