// H2O routing (Zhang et al., NeurIPS 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative
// Inference of Large Language Models"): keep the heavy hitters, evict the rest.
//
// Where the rule and the defaults come from (the paper):
//  - Heavy hitters are the tokens with the largest accumulated attention scores: the sum of the
//    attention each cached token has received over every query since it entered the cache
//    (the greedy H2 eviction of Algorithm 1).
//  - They are kept together with a window of the most recent tokens; the paper's default
//    splits the budget equally between heavy hitters and recent tokens.
//  - Eviction runs at every decoding step (Ω = 1) and selections are made per attention head
//    (each head keeps its own tokens).
// This class is the rule only. The cache (HeadKvCache) supplies the per-head storage, the
// recent window (L: half the budget by default, KvBudget), the optional sink (S; the paper has
// none, S = 0 reproduces it) and the routing cadence, and hands over the tokens that left the
// recent window as candidates: RoutingCandidate::id = token position, score = its
// accumulated attention. The policy keeps the top floor(full_bytes / window_full) candidates by
// score in Tier::kFull (ties: smaller position first) and evicts the rest; it never returns
// Tier::kQuant (H2O has no low-bit tier).
#pragma once

#include <memory>

#include "kvcache/policies/routing_policy.h"

namespace qevict {

class H2OPolicy final : public RoutingPolicy {
 public:
  // kFull for the top floor(budget.full_bytes / budget.window_full) candidates by
  // (score desc, id asc), kEvicted otherwise. window_full == 0 keeps every candidate.
  // O(n) (nth_element) in the number of candidates.
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return "h2o"; }
  std::unique_ptr<RoutingPolicy> clone() const override {
    return std::make_unique<H2OPolicy>();  // order_ is scratch
  }

 private:
  std::vector<int32_t> order_;  // candidate indices, reused: no allocation in steady state
};

}  // namespace qevict
