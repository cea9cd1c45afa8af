// Test-only access to the caches' internals, kept out of the production classes: each
// peer is a friend of its cache and builds the cache itself (no casts from the interface).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kvcache/budget.h"
#include "kvcache/head_cache.h"
#include "kvcache/registry.h"
#include "kvcache/tiered_cache.h"

namespace qevict {

class TieredKvCacheTestPeer {
 public:
  // A TieredKvCache for p (p.policy must be a windowed policy); fails the test otherwise.
  static std::unique_ptr<TieredKvCache> make(const KvShape& shape, int64_t n_ctx,
                                             const KvCacheParams& p) {
    EXPECT_TRUE(p.validate().is_ok()) << p.validate().message();
    auto b = compute_budget(CacheKind::kWindowed, shape, n_ctx, p);
    EXPECT_TRUE(b.has_value()) << b.error();
    if (!b) return nullptr;
    return std::make_unique<TieredKvCache>(shape, n_ctx, p, *b,
                                           find_policy(p.policy)->make_policy(p), nullptr);
  }
  explicit TieredKvCacheTestPeer(TieredKvCache& c) : c_(c) {}
  const WindowStore& store() const { return c_.store_; }
  WindowStore& mutable_store() { return c_.store_; }
  const QuantLayout& quant_layout() const { return c_.qlayout_; }
  // What the cache holds beside the store and the RoPE table: attention and routing scratch,
  // the observation window's queries and outputs.
  size_t attention_scratch_bytes() const { return c_.attn_.bytes(); }
  size_t rope_bytes() const { return c_.rope_.bytes(); }
  // Moves one aged window to tier t through the store's plan path (every other candidate
  // keeps its tier; windows that just aged go to F).
  Status force_tier(int layer, int32_t id, Tier t) {
    RoutingRequest req;
    c_.store_.candidates(layer, c_.n_past_, &req);
    RoutingPlan plan;
    plan.reset(req);
    for (size_t i = 0; i < req.candidates.size(); ++i) {
      const Tier now =
          req.candidates[i].tier == Tier::kLocal ? Tier::kFull : req.candidates[i].tier;
      plan.set(i, req.candidates[i].id == id ? t : now);
    }
    return c_.store_.apply(layer, req, plan);
  }
  std::vector<uint8_t> ledger(int layer, int32_t id) const {
    const uint8_t* p = c_.store_.ledger(layer, id);
    return p ? std::vector<uint8_t>(p, p + c_.budget_.quant_slot()) : std::vector<uint8_t>();
  }
  // Post-RoPE 16-bit keys [n_kv_heads][ω][head_dim] of a window in F or local.
  std::vector<uint16_t> full_keys(int layer, int32_t id) const {
    const uint16_t* p = c_.store_.full_keys(layer, id);
    const size_t n = size_t(c_.shape_.n_kv_heads) * c_.p_.window * c_.shape_.head_dim;
    return p ? std::vector<uint16_t>(p, p + n) : std::vector<uint16_t>();
  }

 private:
  TieredKvCache& c_;
};

class HeadKvCacheTestPeer {
 public:
  static std::unique_ptr<HeadKvCache> make(const KvShape& shape, int64_t n_ctx,
                                           const KvCacheParams& p) {
    auto b = compute_budget(CacheKind::kPerHead, shape, n_ctx, p);
    EXPECT_TRUE(b.has_value()) << b.error();
    if (!b) return nullptr;
    return std::make_unique<HeadKvCache>(shape, n_ctx, p, *b,
                                         find_policy(p.policy)->make_policy(p));
  }
  explicit HeadKvCacheTestPeer(const HeadKvCache& c) : c_(c) {}
  std::vector<int32_t> kept_positions(int layer, int kv_head) const {
    return c_.head(layer, kv_head).pos;
  }
  // Accumulated attention score of a kept token; NaN when `pos` is not kept.
  double token_score(int layer, int kv_head, int32_t pos) const {
    const auto& s = c_.head(layer, kv_head);
    const auto it = std::lower_bound(s.pos.begin(), s.pos.end(), pos);
    if (it == s.pos.end() || *it != pos) return std::numeric_limits<double>::quiet_NaN();
    return s.score[size_t(it - s.pos.begin())];
  }

 private:
  const HeadKvCache& c_;
};

// The cache's report (summary or with tiers).
inline KvReport report_of(const SequenceKvCache& c, ReportDetail d = ReportDetail::kSummary) {
  KvReport r;
  c.report(&r, d);
  return r;
}

}  // namespace qevict

namespace qevict {

// Runs `pol` on candidates `in` with budget `b` (at position n_past) and returns the target
// tier of each candidate; fails the test when the plan does not answer every candidate in
// order or does not fit the budget (check_plan, what the stores enforce).
inline std::vector<Tier> plan_tiers(RoutingPolicy& pol, const std::vector<RoutingCandidate>& in,
                                    const RoutingBudget& b, int64_t n_past = 1 << 20) {
  RoutingRequest req;
  req.n_past = n_past;
  req.candidates = in;
  req.budget = b;
  RoutingPlan plan;
  pol.plan(req, &plan);
  const Status st = check_plan(req, plan);
  EXPECT_TRUE(st.is_ok()) << pol.name() << ": " << st.message();
  std::vector<Tier> out;
  for (const auto& e : plan.entries) out.push_back(e.to);
  return out;
}

}  // namespace qevict
