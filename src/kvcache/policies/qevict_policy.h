// QEvict routing (paper Eq. 4–6, Algorithm 1; SPEC §4): sort candidates by score (ties:
// older window first), the top windows that fit the full tier's bytes go to F, the next
// that fit the low-bit tier's bytes go to Q, the rest are evicted. With a zero low-bit
// budget this is the two-tier (F + E) variant. One addition to the paper: when all
// candidates fit in F within the whole history budget, all stay in F (so a budget that
// covers the full cache is exactly FullKV's storage).
#pragma once

#include "kvcache/policies/routing_policy.h"

namespace qevict {

class QEvictPolicy final : public RoutingPolicy {
 public:
  void route(const std::vector<RoutingCandidate>& in, const RoutingBudget& budget,
             std::vector<Tier>* out) override;
  std::string name() const override { return "qevict"; }

 private:
  std::vector<int32_t> order_;  // reused: routing allocates nothing in steady state
};

}  // namespace qevict
