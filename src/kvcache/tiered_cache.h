// The QEvict tiered KV cache (SPEC §1–6): a recoverable memory hierarchy per layer, stored
// by a WindowStore (sink, local, F, Q, E; see window_store.h). Attention runs the fused
// kernel over sink, F, Q and local blocks and returns each window's probability mass, which
// accumulates into the window's score (Eq. 1). After every prefill chunk and every Ω decode
// steps — or when route() is called — the RoutingPolicy plans each layer and the store
// checks the plan against the budget and applies it.
#pragma once

#include <memory>
#include <vector>

#include "kernels/attention.h"
#include "kvcache/budget.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"
#include "kvcache/routing_observer.h"
#include "kvcache/window_store.h"

namespace qevict {

class TieredKvCache final : public SequenceKvCache {
 public:
  // Use make_kv_cache() (factory.h), which validates; this constructor assumes valid input
  // and a budget made by compute_budget(CacheKind::kWindowed, ...). `trace` may be null.
  TieredKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                const KvBudget& budget, std::unique_ptr<RoutingPolicy> policy,
                std::unique_ptr<RoutingObserver> trace);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  Status commit() override;
  Status route() override;
  void clear() override;
  size_t bytes_held() const override;
  std::string describe() const override;
  void report(KvReport* out, ReportDetail detail) const override;

 private:
  friend class TieredKvCacheTestPeer;  // tests/kvcache: drives the store directly
  Status route_event(bool decode);

  KvShape shape_;
  int64_t n_ctx_;
  KvCacheParams p_;
  KvBudget budget_;
  std::unique_ptr<RoutingPolicy> policy_;
  QuantLayout qlayout_;
  RopeTable rope_;
  WindowStore store_;
  std::unique_ptr<RoutingObserver> trace_;
  RoutingClock clock_;
  int64_t n_past_ = 0, n_new_ = 0;
  int steps_since_route_ = 0;
  int64_t routing_events_ = 0;
  // Routing scratch (reused).
  RoutingRequest request_;
  RoutingPlan plan_;
  // Attention scratch.
  std::vector<KvBlockRef> blocks_;
  std::vector<int32_t> block_window_;  // window id of each block (-1: sink)
  std::vector<int64_t> head_off_;
  std::vector<double> mass_;
  BlockAttnScratch attn_;
};

}  // namespace qevict
