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
#include <string>
#include <vector>

#include "core/status.h"
#include "kvcache/budget.h"
#include "kvcache/tier.h"

namespace qevict {

struct RoutingCandidate {
  int32_t id = 0;            // window id (per-head caches: token position); older = smaller
  int64_t pos0 = 0;          // position of its first token
  double score = 0.0;        // cumulative attention mass S̄ (Eq. 1, SPEC §2)
  Tier tier = Tier::kLocal;  // current tier (kLocal: just aged)
  bool has_ledger = false;   // a low-bit copy exists already
};

struct RoutingRequest {
  int64_t n_past = 0;  // tokens seen when the event runs
  // Scores hold the attention of the queries at positions >= scores_from only (0: every
  // query; a prompt-end observation window, --prefill-window, restarts them): what a
  // per-query normalisation (--kv-score age) divides by.
  int64_t scores_from = 0;
  std::vector<RoutingCandidate> candidates;
  RoutingBudget budget;
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
};

}  // namespace qevict
