// Per-KV-head token cache for the H2O baseline (Zhang et al., NeurIPS 2023): every (layer,
// KV head) keeps its own set of token positions in 16-bit floats, so heads keep different
// tokens and evicted tokens free memory per head. Attention is the shared block loop
// (kernels/attention.h) with one block per kept token, whose masses are the H2O scores.
//
// Per (layer, KV head), with C = floor((B_total / n_kv_heads) / M) tokens of M bytes each
// (KvBudget, kind kPerHead):
//   sink    positions [0, S)                        always kept
//   recent  positions [n_past - L, n_past)          always kept (H2O: L = half the budget)
//   heavy   at most K = C - S - L older positions   the top-K by accumulated attention
// A routing event (after every prefill chunk and every Ω decode steps; H2O: Ω = 1) asks the
// RoutingPolicy (H2OPolicy) which older tokens stay and compacts the storage; evicted tokens
// never come back. Between routing events the cache holds up to one prefill chunk (or Ω - 1
// decode tokens) more than C. With --prefill-route end (SPEC §4) prefill chunks route
// nothing: every head holds the whole prompt until end_prompt() (or the first decode step)
// routes it once, ranked by H2O's own score, the attention accumulated from every prompt
// query (H2O's rule has no observation window, so --prefill-window does not apply).
#pragma once

#include <memory>
#include <vector>

#include "kernels/attention.h"
#include "kvcache/budget.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"

namespace qevict {

class HeadKvCache final : public SequenceKvCache {
 public:
  // Use make_kv_cache() (factory.h); assumes validated params and a budget made by
  // compute_budget(CacheKind::kPerHead, ...): S = budget.sink, L = budget.local, K =
  // budget.head_heavy, Ω = params.route_every.
  HeadKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
              const KvBudget& budget, std::unique_ptr<RoutingPolicy> policy);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  Status end_prompt() override;
  Status route() override;
  bool prefill_keeps_everything() const override { return p_.prefill_route == "end"; }
  void clear() override;
  size_t bytes_held() const override;
  std::string describe() const override;
  // Units are (layer, KV head): kLocal for sink and recent positions, kFull for kept
  // history, kEvicted for the rest.
  void report(KvReport* out, ReportDetail detail) const override;

 private:
  friend class HeadKvCacheTestPeer;  // tests/kvcache: kept sets and scores
  // One (layer, KV head): rows in ascending position order.
  struct HeadStore {
    std::vector<uint16_t> k, v;  // half [n_kept][head_dim]
    std::vector<int32_t> pos;    // int32 [n_kept]
    std::vector<double> score;   // f64 [n_kept], Σ attention received / group size
    int64_t n() const { return int64_t(pos.size()); }
  };

  HeadStore& head(int layer, int kv_head) {
    return heads_[size_t(layer) * shape_.n_kv_heads + kv_head];
  }
  const HeadStore& head(int layer, int kv_head) const {
    return heads_[size_t(layer) * shape_.n_kv_heads + kv_head];
  }
  Status route_head(HeadStore& s);
  void position_tiers(int layer, int kv_head, std::vector<Tier>* out) const;

  KvShape shape_;
  int64_t n_ctx_;
  KvCacheParams p_;
  std::unique_ptr<RoutingPolicy> policy_;
  KvBudget budget_;
  int64_t steady_tokens_ = 0;     // most tokens a head holds during decode: min(C + Ω, n_ctx)
  std::vector<HeadStore> heads_;  // [n_layers][n_kv_heads]
  int64_t n_past_ = 0, n_new_ = 0;
  int steps_since_route_ = 0;
  int64_t routed_below_ = 0;  // positions < this had left the recent window at the last routing
  int64_t routing_events_ = 0, evictions_ = 0;
  size_t peak_bytes_ = 0;        // most bytes held after any call (before its routing)
  bool prompt_pending_ = false;  // --prefill-route end: prompt committed, not routed yet
  // Routing scratch (reused).
  RoutingRequest request_;
  RoutingPlan plan_;
  // Attention scratch.
  std::vector<KvBlockRef> blocks_;  // one per kept token of each head
  std::vector<int64_t> head_off_;
  std::vector<double> mass_;  // f64 [blocks]: probability each kept token received
  BlockAttnScratch attn_;
};

}  // namespace qevict
