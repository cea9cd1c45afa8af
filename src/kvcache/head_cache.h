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
//
// The SnapKV family (SnapKV, PyramidKV, AdaKV, CriticalKV, DefensiveKV) runs on the same
// storage; its policies say what they read (RoutingPolicy::needs()):
//   per_layer    one request per layer holding every KV head's candidates (head-adaptive
//                budgets: a head keeps as many tokens as the policy gives it, the layer's
//                heads together at most H·K; each head's rows are its own vector, so a head
//                given fewer tokens holds fewer bytes — AdaKV's flattened variable-length
//                layout, cu_klen, in per-head vectors);
//   obs_window   w > 0: during the prompt the cache keeps each layer's last w queries and, at
//                a routing event, gives the policy their attention probabilities over the
//                candidates (RoutingRequest::obs), computed by the fused kernel over every
//                kept token. Once decode starts the queries are freed: each decode query's
//                probabilities (one more pass of the fused kernel over the head's tokens) are
//                summed per kept token and query head (g floats per token) and, for a max
//                over rows (obs_max_kernel), pooled and folded into a running max (1 float),
//                both reset at every routing event: the window is the queries since the last
//                event (Ω; w at the family's default), and it costs bytes per kept token that
//                the budget charges, not w·q_width floats per layer. A later turn's prompt
//                (a chunk after decode) opens the query window again: its end ranks by its
//                own last w queries;
//   cross_layer  the layers share one budget (Layer-DefensiveKV): every layer's request goes
//                to the policy first (prepare), then each layer is planned within the share
//                the policy gave it (layer_budget; the layers' sum is checked);
//   value_norms  ν_i = mean over the group of ‖v_i W_O^h‖₁ (CriticalKV), from the attention
//                output projection the model binds (set_output_projection), computed once per
//                token and kept with it (4 bytes per token and head, not in M: held bytes).
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

namespace qevict {

// CriticalKV's value norms of m value rows of KV head h: ν_i = (1/g) Σ_j ‖v_i W_O^{h·g+j}‖₁,
// W_O^{qh} the columns [qh·d, qh·d + d) of wo (f32 [E][qw]); v f32 [m][d]; y scratch.
void value_norm_rows(const float* wo, int64_t E, int64_t qw, int h, int g, int d, const float* v,
                     int64_t m, float* nu, std::vector<float>* y);

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
  // A sequence committed alone: per-head routing (H2O) plans its heads on the pool's threads,
  // each with its own copy of the policy; the result is what commit() / end_prompt() give.
  // Per-layer policies (the SnapKV family) route on this thread.
  Status commit_alone(ThreadPool& pool) override;
  Status end_prompt_alone(ThreadPool& pool) override;
  Status route() override;
  bool prefill_keeps_everything() const override { return sched_.defers_prompt(); }
  // Replay: the tokens (and the queries the observation window keeps); H2O's scores from the
  // shared masses (f16 attention, as this cache's own with the default --kv-dtype).
  PromptReplay prompt_replay() const override;
  bool prompt_replay_value_norms() const override {
    return needs_.value_norms && p_.dtype == HalfType::kF16;
  }
  void append_prompt(int layer, const float* q, const float* k, const float* v,
                     const PromptExtras& x) override;
  void set_output_projection(const OutputProjection* wo) override { wo_ = wo; }
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
    std::vector<float> nu;       // f32 [n_kept] value norms (value_norms policies), NaN: not yet
    // Decode observation window (obs_window policies, after the prompt): per kept token, the
    // probability summed over the queries since the last routing event, per query head of the
    // group (f32 [n_kept][group]), and their pooled running max (f32 [n_kept], obs_max_kernel).
    std::vector<float> osum, omax;
    int64_t cap = 0;  // tokens its vectors may hold before the next routing event
    int64_t n() const { return int64_t(pos.size()); }
  };

  HeadStore& head(int layer, int kv_head) {
    return heads_[size_t(layer) * shape_.n_kv_heads + kv_head];
  }
  const HeadStore& head(int layer, int kv_head) const {
    return heads_[size_t(layer) * shape_.n_kv_heads + kv_head];
  }
  // Appends the call's tokens to every head of `layer` (and keeps the prompt's queries for
  // the observation window): attend() without the attention.
  void append_tokens(int layer, const float* q, const float* k, const float* v);
  // One head's routing with the given policy instance and scratch; adds its evictions to
  // *evicted.
  Status route_head(HeadStore& s, RoutingPolicy& pol, RoutingRequest& req, RoutingPlan& plan,
                    int64_t* evicted);
  // route_head over every head on the with_pool call's threads; false (nothing done) when the cache
  // is not committed alone on a pool of 2+ threads or the policy cannot be copied.
  bool route_heads_parallel(Status* st);
  Status route_layer(int layer);
  // route() with its wall time on the clock; decode: triggered by a decode step.
  Status route_event(bool decode);
  // Builds request_ for `layer`: candidates, the layer's budget, and with `inputs` the
  // observation-window probabilities and value norms the policy needs.
  Status layer_request(int layer, bool inputs);
  // Fills request_.obs for `layer` (the window's last queries over each head's kept tokens;
  // during decode, the mean of the accumulated sums, and obs_max).
  void observe(int layer);
  // probs_ = the probabilities query row q (position qpos) gives every kept token of head h,
  // f32 [group][n_kept].
  void query_probs(const HeadStore& s, const float* q, int64_t qpos);
  // Decode: adds this call's queries of `layer` to the observation sums (and max).
  void observe_step(int layer, const float* q);
  // The prompt is routed: free the kept queries, start the decode sums.
  void start_decode_window();
  // A new prompt (a later turn) after decode started: drop the decode sums and keep that
  // prompt's last w queries again, so its routing ranks by them (as the tiered cache's
  // QueryWindow does), not by the decode steps and every query of the turn.
  void reopen_prompt_window();
  // Fills request_.value_norm, computing ν for the candidates that have none yet.
  Status value_norms(int layer);
  // Removes the candidates (rows first, first + n_cand) that `entries` evict, in place;
  // returns how many.
  int64_t compact(HeadStore& s, int64_t first, const PlanEntry* entries, int64_t n_cand);
  void position_tiers(int layer, int kv_head, std::vector<Tier>* out) const;

  KvShape shape_;
  int64_t n_ctx_;
  KvCacheParams p_;
  std::unique_ptr<RoutingPolicy> policy_;
  PolicyNeeds needs_;
  KvBudget budget_;
  int64_t steady_tokens_ = 0;     // most tokens a head holds during decode: min(C + Ω, n_ctx)
  std::vector<HeadStore> heads_;  // [n_layers][n_kv_heads]
  int64_t n_past_ = 0, n_new_ = 0;
  int64_t routed_below_ = 0;  // positions < this had left the recent window at the last routing
  int64_t evictions_ = 0;
  // When to route (every Ω decode steps; the prompt held to its end with --prefill-route end),
  // routing events, their wall time (--kv-stats, bench's routing share) and the peak bytes.
  RoutingSchedule sched_;
  // The pool of a commit_alone / end_prompt_alone call under way, and what the routing
  // threads past the first plan with (route_heads_parallel; their scratch is freed after
  // every event, as request_'s).
  RoutingThreads route_threads_;
  // Routing scratch (reused).
  RoutingRequest request_;
  RoutingPlan plan_;
  // Observation window (needs_.obs_window = w): each layer's last w prompt queries.
  QueryWindow obs_q_;
  std::vector<float> obs_st_;               // f32 [group][head_dim + 2] one query's softmax state
  std::vector<float> obs_ml_;               // f32 [kept tokens][group][2] its per-token (m, l)
  std::vector<float> probs_;                // f32 [group][kept tokens] its probabilities
  std::vector<double> pool_in_, pool_out_;  // one pooled row (obs_max_kernel)
  bool obs_decode_ = false;                 // the prompt is routed: queries freed, sums accumulate
  int64_t obs_acc_ = 0;                     // queries summed since the last routing event
  // Value norms (needs_.value_norms).
  const OutputProjection* wo_ = nullptr;
  std::vector<float> wo_f32_;  // f32 [n_embd][q_width] one layer's W_O, while routing
  // Attention scratch.
  std::vector<KvBlockRef> blocks_;  // one per kept token of each head
  std::vector<int64_t> head_off_;
  std::vector<double> mass_;  // f64 [blocks]: probability each kept token received
  BlockAttnScratch attn_;
};

}  // namespace qevict
