// Routing policies decide; the cache applies. At a routing event a policy receives a
// RoutingRequest — one layer's candidates (aged windows in F or Q, and those that just left
// the local region; per-head caches: tokens of one KV head) with their cumulative scores, the
// current position and the byte budget of the two kept tiers — and returns a RoutingPlan: a
// target tier per candidate. It never touches storage. How a policy ranks (cumulative
// score, score per step, recency, ...) is its own business; the store checks every plan
// against the budget (check_plan) before it touches anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kvcache/budget.h"
#include "kvcache/tier.h"

namespace qevict {

struct RoutingCandidate {
  int32_t id = 0;            // window id (per-head caches: token position); older = smaller
  int64_t pos0 = 0;          // position of its first token
  double score = 0.0;        // cumulative attention mass S̄ (Eq. 1, SPEC §2)
  Tier tier = Tier::kLocal;  // current tier (kLocal: just aged)
  bool has_ledger = false;   // a low-bit copy exists already
  int32_t head = 0;          // KV head (per-layer requests of per-head caches), else 0
};

struct RoutingRequest {
  int64_t n_past = 0;  // tokens seen when the event runs
  // Scores hold the attention of the queries at positions >= scores_from only (0: every
  // query; a prompt-end observation window, --prefill-window, restarts them): what a
  // per-query normalisation (--kv-score age) divides by.
  int64_t scores_from = 0;
  std::vector<RoutingCandidate> candidates;
  RoutingBudget budget;

  // Per-head caches whose policy routes a whole layer at once (PolicyNeeds::per_layer): the
  // candidates of KV head h are candidates[head_begin[h], head_begin[h+1]) in position order,
  // and budget covers the layer (all its heads). Empty head_begin: one head.
  int layer = 0, n_layers = 1;
  int n_heads = 1;
  std::vector<int64_t> head_begin;  // [n_heads + 1]
  // Observation-window attention (PolicyNeeds::obs_window > 0; SnapKV's scoring): the
  // probability that query r of the last n_obs queries (positions n_past − n_obs + r), query
  // head j of the KV head's group, gave candidate i, in a softmax over every key the head
  // holds (causal):  obs[group·n_obs·head_begin[h] + (j·n_obs + r)·n_h + (i − head_begin[h])]
  // for candidate i of head h with n_h = head_begin[h+1] − head_begin[h] (f32 [head][group]
  // [n_obs][n_h]).
  // During decode the cache keeps no queries: it sums, per kept token, the probability each
  // query since the last routing event gave it, and hands the mean over those queries as one
  // row (n_obs = 1) — what a mean over the window's rows gives; obs_max carries what a max over
  // rows needs (PolicyNeeds::obs_max_kernel).
  int group = 1, n_obs = 0;
  std::vector<float> obs;
  // Decode (PolicyNeeds::obs_max_kernel = k > 0), else empty: per candidate, the max over the
  // queries since the last routing event and the group's query heads of each query head's
  // probability row pooled (avg, width k, zero padding) along every token the head holds and
  // rescaled to its pre-pool sum (DefensiveKV's defensive aggregation). f32 [candidates].
  std::vector<float> obs_max;
  // ν_i = mean over the group's query heads h of ‖v_i W_O^h‖₁ (PolicyNeeds::value_norms;
  // CriticalKV): f32 [candidates].
  std::vector<float> value_norm;

  int64_t n_cand(int h) const {
    return head_begin.empty() ? int64_t(candidates.size()) : head_begin[h + 1] - head_begin[h];
  }
  int64_t cand_begin(int h) const { return head_begin.empty() ? 0 : head_begin[h]; }
  // obs row (j, r) of head h: n_cand(h) floats.
  const float* obs_row(int h, int j, int r) const {
    return obs.data() + size_t(group) * n_obs * cand_begin(h) + (size_t(j) * n_obs + r) * n_cand(h);
  }
};

// What a policy's rule reads besides candidates and their cumulative scores; the cache that
// runs it supplies these (per-head caches, HeadKvCache).
struct PolicyNeeds {
  bool per_layer = false;         // one request per layer with every KV head's candidates
  int obs_window = 0;             // w > 0: RoutingRequest::obs over the last w queries
  int obs_max_kernel = 0;         // k > 0: RoutingRequest::obs_max during decode
  bool value_norms = false;       // RoutingRequest::value_norm
  bool cumulative_scores = true;  // RoutingCandidate::score (H2O's per-step masses)
  // Budgets shared across layers (Layer-DefensiveKV): the cache first hands every layer's
  // full request to prepare(), then calls prepare_done() and plans each layer (requests
  // without obs / value_norm: the policy kept what it needed).
  bool cross_layer = false;
};

// The decision for one candidate.
struct PlanEntry {
  int32_t id = 0;
  Tier to = Tier::kEvicted;  // kFull, kQuant or kEvicted
};

// A policy's answer: entries[i] is the decision for request.candidates[i].
struct RoutingPlan {
  std::vector<PlanEntry> entries;
  // Every candidate evicted (policies then raise the ones they keep). Reuses capacity.
  void reset(const RoutingRequest& req);
  void set(size_t i, Tier to) { entries[i].to = to; }
};

// Bytes a plan keeps, as the budget counts them: F windows pay M_f (plus M_q in strict
// mode when they keep a ledger), Q windows M_q.
struct PlanCost {
  size_t full = 0, quant = 0;
};
PlanCost plan_cost(const RoutingRequest& req, const RoutingPlan& plan);

// OK when the plan answers every candidate in order with F, Q or E, and what it keeps fits:
// quant ≤ quant_bytes and full + quant ≤ full_bytes + quant_bytes (a policy may give F the
// bytes Q does not use, never more than the two together).
Status check_plan(const RoutingRequest& req, const RoutingPlan& plan);

// The fill rule that ranking policies share: walk the candidates in `order` (best first); each
// takes F while its F cost fits, and once one misses F no later one takes F; the next take Q
// while M_q fits; the rest E.
void fill_tiers_in_order(const std::vector<int32_t>& order, const RoutingRequest& req,
                         RoutingPlan* plan);

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual void plan(const RoutingRequest& req, RoutingPlan* plan) = 0;
  virtual std::string name() const = 0;
  virtual PolicyNeeds needs() const { return {}; }
  // A fresh instance with the same rule, for caches that plan layers on several threads at
  // once (a policy's members are scratch only between plan() calls); null: plan layers one
  // after the other on this instance.
  virtual std::unique_ptr<RoutingPolicy> clone() const { return nullptr; }
  // Layer budgets (per-layer requests): the history tokens `layer` may keep over its n_heads
  // KV heads when the budget gives each head `heavy` on average and the sequence has n_hist
  // history positions. The cache checks that the layers' sum is at most
  // n_layers · n_heads · heavy. Default: n_heads · heavy (uniform).
  virtual int64_t layer_budget(int layer, int n_layers, int n_heads, int64_t heavy,
                               int64_t n_hist) const {
    (void)layer, (void)n_layers, (void)n_hist;
    return int64_t(n_heads) * heavy;
  }
  // Cross-layer policies (PolicyNeeds::cross_layer): every layer's request, in layer order
  // (its budget the uniform H·K), then the end of that pass with the budget of the whole
  // cache in history tokens.
  virtual void prepare(const RoutingRequest& req) { (void)req; }
  virtual void prepare_done(int64_t total_tokens) { (void)total_tokens; }
};

// The threads of a routing event when a cache is committed alone (SequenceKvCache::
// commit_alone): thread 0 plans with the cache's own policy, request and plan, every other
// thread with a copy of the policy and a request and plan of its own, kept between events.
class RoutingThreads {
 public:
  // What thread t plans with.
  struct Slot {
    RoutingPolicy& policy;
    RoutingRequest& request;
    RoutingPlan& plan;
  };
  // Runs f (the cache's commit() or end_prompt()) with `pool` given to its routing events.
  template <class F>
  Status with_pool(ThreadPool& pool, F&& f) {
    pool_ = &pool;
    const Status s = f();
    pool_ = nullptr;
    return s;
  }
  // The pool of the with_pool call under way, if it has 2+ threads; else null.
  ThreadPool* pool() const { return pool_ != nullptr && pool_->size() >= 2 ? pool_ : nullptr; }
  // Copies of `own` for threads 1 .. n_threads - 1 (made once); false when the policy cannot
  // be copied (RoutingPolicy::clone is null): the event then runs on one thread.
  bool prepare(const RoutingPolicy& own, int n_threads);
  Slot slot(int t, RoutingPolicy& own, RoutingRequest& request, RoutingPlan& plan);
  // Frees the other threads' candidates and plan entries (as a cache frees its own between
  // events), keeping the policy copies.
  void free_scratch();
  // Bytes the other threads hold (the copies' members are scratch, not counted).
  size_t bytes() const;

 private:
  struct Worker {
    std::unique_ptr<RoutingPolicy> policy;
    RoutingRequest request;
    RoutingPlan plan;
  };
  std::vector<Worker> workers_;
  ThreadPool* pool_ = nullptr;
};

}  // namespace qevict
