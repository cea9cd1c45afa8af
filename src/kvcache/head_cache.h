// Per-KV-head token cache for the H2O baseline (Zhang et al., NeurIPS 2023): every (layer,
// KV head) keeps its own set of token positions in 16-bit floats, so heads keep different
// tokens and evicted tokens free memory per head. Reference-style path: attention materializes
// the probabilities (they are the H2O scores), no fused kernel.
//
// Per (layer, KV head), with C = floor((B_total / n_kv_heads) / M) tokens of M bytes each:
//   sink    positions [0, S)                        always kept
//   recent  positions [n_past - L, n_past)          always kept (H2O: L = half the budget)
//   heavy   at most K = C - S - L older positions   the top-K by accumulated attention
// A routing event (after every prefill chunk and every Ω decode steps; H2O: Ω = 1) asks the
// RoutingPolicy (H2OPolicy) which older tokens stay and compacts the storage; evicted tokens
// never come back. Between routing events the cache holds up to one prefill chunk (or Ω - 1
// decode tokens) more than C.
#pragma once

#include <memory>
#include <vector>

#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"

namespace qevict {

class HeadKvCache final : public SequenceKvCache {
 public:
  // Assumes validated params and check_budget() ok. Budget per layer B_total:
  // params.budget_bytes if > 0, else floor(budget_fraction * n_ctx * 2 * n_kv_heads *
  // head_dim * 2) (as TieredKvCache). params.sink = S, params.local = L, params.route_every = Ω.
  HeadKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
              std::unique_ptr<RoutingPolicy> policy);

  // M: bytes of one token of one KV head = key + value (head_dim 16-bit values each) + its
  // int32 position.
  static size_t token_head_bytes(const KvShape& shape);
  // Errors when a head cannot hold S sink + L recent + at least one heavy token (K < 1).
  static Status check_budget(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params);

  int64_t n_past() const override { return n_past_; }
  int64_t n_ctx() const override { return n_ctx_; }
  Status begin(int64_t n_new) override;
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override;
  void commit() override;
  void clear() override;
  size_t bytes_held() const override;
  std::string describe() const override;
  int64_t routing_events() const override { return routing_events_; }
  bool per_head_tiers() const override { return true; }
  // kLocal for sink and recent positions, kFull for kept history, kEvicted for the rest.
  void position_tiers(int layer, int kv_head, std::vector<Tier>* out) const override;

  size_t budget_bytes() const { return budget_total_; }  // B_total per layer
  // Σ over KV heads of kept tokens × M, for one layer (what counts against B_total).
  size_t bytes_in_use(int layer) const;
  int64_t head_capacity() const { return capacity_; }         // C tokens per KV head
  int64_t heavy_capacity() const { return heavy_capacity_; }  // K = C - S - L
  int64_t evictions() const { return evictions_; }            // tokens evicted, all heads
  int n_layers() const { return shape_.n_layers; }

  // Introspection for tests and diagnostics.
  std::vector<int32_t> kept_positions(int layer, int kv_head) const;  // ascending
  // Accumulated attention score of a kept token; NaN when `pos` is not kept.
  double token_score(int layer, int kv_head, int32_t pos) const;

 private:
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
  void route_head(HeadStore& s);
  void route_now();

  KvShape shape_;
  int64_t n_ctx_;
  KvCacheParams p_;
  std::unique_ptr<RoutingPolicy> policy_;
  size_t m_ = 0;                  // M, bytes per token per KV head
  size_t budget_total_ = 0;       // B_total per layer
  int64_t capacity_ = 0;          // C
  int64_t heavy_capacity_ = 0;    // K
  int64_t steady_tokens_ = 0;     // most tokens a head holds during decode: min(C + Ω, n_ctx)
  RoutingBudget rbudget_;         // full_bytes = K·M, window_full = M
  std::vector<HeadStore> heads_;  // [n_layers][n_kv_heads]
  int64_t n_past_ = 0, n_new_ = 0;
  int steps_since_route_ = 0;
  int64_t routed_below_ = 0;  // positions < this had left the recent window at the last routing
  int64_t routing_events_ = 0, evictions_ = 0;
  // Routing scratch (reused).
  std::vector<RoutingCandidate> cand_;
  std::vector<Tier> plan_;
  // Attention scratch, one slice per task (KV head, block of query tokens).
  std::vector<float> probs_;  // f32 [n_tasks][group][n_keys_max]: one query token's softmax
  std::vector<double> part_;  // f64 [n_tasks][n_keys_max]: the task's score sums per key
};

}  // namespace qevict
