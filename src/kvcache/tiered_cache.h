// The QEvict tiered KV cache (SPEC §1–6): a recoverable memory hierarchy per layer.
//   sink   positions [0, S)                  f16, never routed
//   local  the windows holding the newest L   f16, not routed until they age
//   F      aged windows kept in full precision (slots of a SlotPool)
//   Q      aged windows in the low-bit ledger (KIVI INT2/INT4, pre-RoPE keys)
//   E      evicted: gone for good
// Every ω tokens after the sink form a window whose id never changes. Attention runs the
// fused kernel over sink, F, Q and local blocks and returns each window's probability mass,
// which accumulates into the window's score (Eq. 1). After every prefill chunk and every Ω
// decode steps, a RoutingPolicy ranks the aged windows and the cache applies its plan:
// demote (quantize once, keep the ledger), promote (decode + re-apply RoPE, keep the
// ledger), evict (free all).
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"
#include "kvcache/slot_pool.h"

namespace qevict {

struct TierLayerStats {
  int64_t windows_full = 0, windows_quant = 0, windows_evicted = 0, windows_local = 0;
  int64_t promotions = 0, demotions = 0, evictions = 0, quantizations = 0;
  int64_t evicted_at_first_routing = 0;                    // young-window evictions (SPEC §8)
  int64_t aged = 0;                                        // windows that left the local region
  size_t bytes_sink = 0, bytes_full = 0, bytes_quant = 0;  // in use
  size_t bytes_ledger_of_full = 0;  // ledger entries held by windows now in F
  size_t bytes_allocated = 0;       // pools + sink, what the process holds
};

struct TierStats {
  std::vector<TierLayerStats> layers;
  int64_t routing_events = 0;
  double route_seconds = 0.0, quantize_seconds = 0.0, promote_seconds = 0.0;
  double route_seconds_decode = 0.0;  // routing triggered by decode steps (not prefill chunks)
  size_t budget_bytes_per_layer = 0, window_full_bytes = 0, window_quant_bytes = 0;
  int64_t capacity_full = 0, capacity_quant = 0;  // K_f, K_q
};

class TieredKvCache final : public SequenceKvCache {
 public:
  // Use make_kv_cache() (params.h), which validates; this constructor assumes valid input.
  TieredKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                std::unique_ptr<RoutingPolicy> policy);
  ~TieredKvCache() override;

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
  void position_tiers(int layer, int kv_head, std::vector<Tier>* out) const override;

  TierStats stats() const;
  const KvCacheParams& params() const { return p_; }
  // What a window is ranked by at a routing event: its cumulative score (by_age = false), or
  // that score per query token that has seen it, i.e. divided by n_past − pos0 (at least 1).
  static double rank_score(double score, int64_t n_past, int64_t pos0, bool by_age) {
    return by_age ? score / double(std::max<int64_t>(1, n_past - pos0)) : score;
  }
  // Bytes in use that count against the budget (sink + local excluded from B_hist but
  // included here; ledger of promoted windows included only in strict mode), max over layers.
  size_t budgeted_bytes_in_use(int layer) const;
  size_t budget_bytes() const { return budget_total_; }
  const QuantLayout& quant_layout() const { return qlayout_; }
  size_t window_full_bytes() const { return m_f_; }
  size_t window_quant_bytes() const { return m_q_; }

  // Introspection for tests and diagnostics.
  Tier window_tier(int layer, int32_t window) const;
  double window_score(int layer, int32_t window) const;
  int32_t n_windows(int layer) const { return static_cast<int32_t>(layers_[layer].windows.size()); }
  // The ledger bytes of a window (empty when it has none).
  std::vector<uint8_t> window_ledger(int layer, int32_t window) const;
  // Post-RoPE f16 keys of a window in F or local, [n_kv_heads][window][head_dim].
  std::vector<uint16_t> window_full_keys(int layer, int32_t window) const;
  // Forces a window's tier (tests: drive demote/promote cycles). Applies like routing does.
  void force_tier(int layer, int32_t window, Tier t);
  // Routes now (as at a routing event).
  void route_now();

 private:
  struct Window {
    Tier tier = Tier::kLocal;
    int32_t f_slot = -1;  // full-precision slot (local or F)
    int32_t q_slot = -1;  // ledger entry (Q, or F after promotion)
    int32_t n = 0;        // tokens written
    double score = 0.0;
    bool routed = false;  // has been through at least one routing event since aging
  };
  struct Layer {
    std::vector<uint16_t> sink_k, sink_v;  // half [n_kv_heads][S][head_dim]
    std::vector<Window> windows;
    SlotPool fpool, qpool;    // f16 K|V [n_kv_heads][ω][head_dim] each; ledger
    double sink_score = 0.0;  // attention mass the sink received
    TierLayerStats st;
  };

  uint16_t* f_k(Layer& L, int32_t slot, int h) const;
  uint16_t* f_v(Layer& L, int32_t slot, int h) const;
  void store_token(Layer& L, int64_t pos, const float* k, const float* v);
  void demote(Layer& L, Window& w, int32_t id);
  void promote(Layer& L, Window& w, int32_t id);
  void evict(Layer& L, Window& w);
  void route_layer(int layer);
  int64_t aged_windows() const;  // windows whose every position left the local region

  KvShape shape_;
  int64_t n_ctx_;
  KvCacheParams p_;
  std::unique_ptr<RoutingPolicy> policy_;
  QuantLayout qlayout_;
  RopeTable rope_;
  size_t m_f_ = 0, m_q_ = 0;  // bytes of one window in F / Q
  size_t budget_total_ = 0;   // B_total per layer
  RoutingBudget rbudget_;
  std::vector<Layer> layers_;
  int64_t n_past_ = 0, n_new_ = 0;
  int steps_since_route_ = 0;
  int64_t routing_events_ = 0;
  double route_s_ = 0.0, quant_s_ = 0.0, promote_s_ = 0.0, route_decode_s_ = 0.0;
  std::FILE* trace_ = nullptr;
  // Routing scratch (reused).
  std::vector<RoutingCandidate> cand_;
  std::vector<Tier> plan_;
  // Attention scratch.
  std::vector<KvBlockRef> blocks_;
  std::vector<int32_t> block_window_;  // window id of each block (-1: sink)
  std::vector<float> parts_, block_ml_, gml_;
  std::vector<double> mass_acc_;
};

}  // namespace qevict
