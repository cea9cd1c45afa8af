// The QEvict tiered KV cache (SPEC §1–6): a recoverable memory hierarchy per layer, stored
// by a WindowStore (sink, local, F, Q, E; see window_store.h). Attention runs the fused
// kernel over sink, F, Q and local blocks and returns each window's probability mass, which
// accumulates into the window's score (Eq. 1). After every prefill chunk and every Ω decode
// steps — or when route() is called — the RoutingPolicy plans each layer and the store
// checks the plan against the budget and applies it.
//
// --prefill-route end (SPEC §4): prefill chunks route nothing — every prompt window stays in
// full precision in the local tier, so bytes held peak at the whole prompt — and the prompt
// is routed once, at end_prompt() or else at the first decode step (what the paper's code
// does), by one of two scores:
//   prefill_window 0  the cumulative S̄ of every prompt query (Eq. 1 unchanged; SPEC §2
//                     makes it the default, and decode-time routing goes on ranking by it);
//   prefill_window N  the attention of the last N prompt queries only (SnapKV's observation
//                     window: snapkv_utils.py:L38-70, w = 32 in init_snapkv L72-81). The
//                     last N queries are kept and, after each prefill call, attend once more
//                     over the cache; their masses replace the scores (summed per ω-token
//                     window, which pools as SnapKV's kernel-5/7 avgpool does along the key
//                     axis, so no separate pool). The scores then restart from that mass:
//                     keeping the prompt's S̄ would let the first decode routing evict, by the
//                     haystack's cumulative mass, what the question pointed to.
//
// --prefill-route staged (issue 52): the end route's one routing event and scores with a
// bounded peak. While the prompt is read (chunks, RoutingSchedule::Due::kStagePrompt), the
// windows that leave the local region are quantized into the low-bit tier — the staged copy,
// in the Q tier's own layout (QuantLayout: --kv-bits / --kv-value-bits; one layout per store,
// which the attention kernel decodes for every low-bit block), the window's ledger entry —
// and their 16-bit slots freed; nothing is evicted. Only while every aged window would fit in
// F (K_f·M_f + K_q·M_q) are they kept in 16 bits, as the routing would keep them. Bytes held
// while the prompt is read: ≤ KvBudget::staged_prompt_bytes per layer (sink + local + the
// prompt at M_q + one chunk) + tables and scratch. At end_prompt() (or the first decode step)
// the same routing as end's, with the same observation window and pooling, decides F/Q/E over
// every aged window: windows planned for F are promoted from their staged copies (decode,
// re-apply RoPE: lossy at the ledger's bits, and the ledger entry is kept as after any
// promotion), windows planned for Q keep them, the rest are evicted to fit the budget.
// Unlike end, the prompt's own attention — the later prompt tokens' and the observation
// window's — sees the staged windows' low-bit keys and values, not 16-bit ones. A later turn
// (a prompt appended after decoding) stages and routes the same way; decode is unchanged.
#pragma once

#include <memory>
#include <vector>

#include "kernels/attention.h"
#include "kvcache/budget.h"
#include "kvcache/kv_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"
#include "kvcache/routing_observer.h"
#include "kvcache/routing_schedule.h"
#include "kvcache/window_store.h"

namespace qevict {

// Receives the attention of each TieredKvCache::attend() call by tier (diagnostics): mass[t]
// for t a Tier, the probability the call's query tokens put on the sink and local windows
// (kLocal), F and Q windows, summed over the tokens and averaged over the query heads (the
// four sum to the call's number of query tokens; kEvicted is 0). n_keys = n_past + n_new.
class TierMassObserver {
 public:
  virtual ~TierMassObserver() = default;
  virtual void on_tier_mass(int layer, int64_t n_keys, const double* mass) = 0;
};

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
  Status end_prompt() override;
  // With a pool of more than one thread, a routing event plans and applies its layers on all
  // of them (each thread its own copy of the policy); the same result as commit().
  Status commit_alone(ThreadPool& pool) override;
  Status end_prompt_alone(ThreadPool& pool) override;
  Status route() override;
  bool prefill_keeps_everything() const override { return sched_.holds_prompt(); }
  // Replay of a deferred prompt: the tokens, and window scores from the shared masses (f16
  // attention over every prompt token, as this cache's own with the default --kv-dtype);
  // with --prefill-window, the masses of the prompt's last queries only.
  PromptReplay prompt_replay() const override {
    return sched_.holds_prompt() && p_.dtype == HalfType::kF16 ? PromptReplay::kMasses
                                                               : PromptReplay::kAttend;
  }
  int64_t prompt_mass_window() const override { return p_.prefill_window; }
  // --kv-adapt's statistic (PromptFocus::kl) needs every query's attention of the first prompt.
  bool prompt_replay_all_masses() const override {
    return p_.adapt > 0.0 && p_.prefill_window > 0 && focus_.empty();
  }
  void append_prompt(int layer, const float* q, const float* k, const float* v,
                     const PromptExtras& x) override;
  void clear() override;
  // Sessions (tiered_cache_state.cpp): truncation within the local region, save / load.
  bool can_truncate(int64_t n) const override;
  Status truncate(int64_t n) override;
  bool can_save_state() const override { return trace_ == nullptr; }
  Status save_state(ByteWriter& w) const override;
  Status load_state(ByteReader& r) override;
  size_t bytes_held() const override;
  std::string describe() const override;
  void report(KvReport* out, ReportDetail detail) const override;
  // Reports every attend() call's mass by tier to `observer` (nullptr: stop).
  void set_tier_mass_observer(TierMassObserver* observer) { tier_mass_ = observer; }

 private:
  // The call's block masses (mass_, summed over heads) by the tier of their window.
  void report_tier_mass(int layer) const;
  friend class TieredKvCacheTestPeer;  // tests/kvcache: drives the store directly
  // Frees the attention and routing scratch a prefill chunk grew (decode regrows its own).
  void trim_scratch();
  Status route_event(bool decode);
  // route_event's layers over the with_pool call's threads; false when it cannot (no pool, a
  // policy without clone(), a trace, which wants the layers in order).
  bool route_layers_parallel(std::vector<Status>* st);
  // One layer of a routing event: candidates, the policy's plan, the store applies it.
  Status route_layer(int l, RoutingPolicy& pol, RoutingRequest& req, RoutingPlan& plan);
  // The one routing event of a deferred prompt (--prefill-route end, staged).
  Status route_prompt();
  // generic_[layer][id] += mass (grown on demand; the sink, id -1, is not a history window).
  void add_generic(int layer, int32_t id, double mass);
  // At the first prompt routing with a prefill window: where the observation window's
  // attention fell (focus_), from the window scores it just set.
  void measure_focus();
  // --kv-adapt: the coverage tier when focus_score(focus_) < p_.adapt (before any window has
  // a low-bit copy; the budget's total unchanged), else the configured one.
  void adapt_tier();
  // The tier a cache runs in: the configured one, or --kv-adapt's coverage tier (its params,
  // with `adapt` kept so that describe() and sessions say the cache adapts). Shared by
  // adapt_tier() and load_state().
  struct TierSetup {
    KvCacheParams p;
    KvBudget budget;
    QuantLayout layout;
  };
  Expected<TierSetup> tier_setup(bool coverage) const;
  // --prefill-route staged, after a prompt chunk: every layer's aged windows to the low-bit
  // tier (WindowStore::stage).
  void stage_prompt();
  // Whether this call's queries belong to the prompt's observation window.
  bool observing() const {
    return sched_.defers_prompt() && p_.prefill_window > 0 &&
           (n_new_ > 1 || sched_.prompt_pending());
  }
  // Keeps layer's last prefill_window queries (of q, this call's) and makes them the layer's
  // window scores: one more attention pass over the cache.
  void observe(int layer, const float* q, ThreadPool& pool);
  // The attention kernel's parameters for this cache (low-bit layout and RoPE table).
  FusedAttnParams fused_params() const;

  KvShape shape_;
  int64_t n_ctx_;
  KvCacheParams p_;
  KvBudget budget_;
  // The configured params and budget, which clear() restores after --kv-adapt changed them.
  KvCacheParams base_p_;
  KvBudget base_budget_;
  std::vector<PromptFocus> focus_;  // measure_focus(); empty until the first prompt routing
  // While the first prompt is read with an observation window: every prompt query's
  // attention per window id, summed over heads ([layer][window id]; PromptFocus::kl).
  std::vector<std::vector<double>> generic_;
  int adapted_ = -1;  // --kv-adapt: -1 not yet, 0 configured tier, 1 coverage
  std::unique_ptr<RoutingPolicy> policy_;
  // The pool of a commit_alone / end_prompt_alone call under way, and what the routing
  // threads past the first plan with.
  RoutingThreads route_threads_;
  QuantLayout qlayout_;
  RopeTable rope_;
  WindowStore store_;
  std::unique_ptr<RoutingObserver> trace_;
  // When to route (every Ω decode steps; the prompt held to its end with --prefill-route
  // end), routing events, their time and the peak bytes held.
  RoutingSchedule sched_;
  int64_t n_past_ = 0, n_new_ = 0;
  int64_t scores_from_ = 0;  // RoutingRequest::scores_from
  // --prefill-window: the prompt's last queries, allocated while a prompt is read.
  QueryWindow obs_q_;
  std::vector<float> obs_out_;  // f32 [prefill_window][q_width], discarded outputs
  // Routing scratch (reused).
  RoutingRequest request_;
  RoutingPlan plan_;
  // Attention scratch.
  std::vector<KvBlockRef> blocks_;
  std::vector<int32_t> block_window_;  // window id of each block (-1: sink)
  std::vector<double> mass_;
  BlockAttnScratch attn_;
  TierMassObserver* tier_mass_ = nullptr;
};

}  // namespace qevict
