// StreamingLLM (Xiao et al., ICLR 2024, "Efficient Streaming Language Models with Attention
// Sinks"): keep the first few tokens (attention sinks) and a rolling window of the most
// recent tokens; no scores. As a RoutingPolicy it ranks candidates by recency only: the
// newest windows that fit the full tier stay in F, the next newest that fit the low-bit
// tier go to Q (0 bytes by default: the authors' method has no such tier), the rest are
// evicted. The authors' defaults — 4 sink tokens, token granularity, eviction as soon as a
// token leaves the window — are its registry row's (kvcache/registry.cpp): S = 4, ω = 1,
// Ω = 1, q = 0; the recent window is the cache's local region plus the F tier.
#pragma once

#include "kvcache/policies/routing_policy.h"

namespace qevict {

class StreamingPolicy final : public RoutingPolicy {
 public:
  void plan(const RoutingRequest& req, RoutingPlan* plan) override;
  std::string name() const override { return "streaming"; }
  std::unique_ptr<RoutingPolicy> clone() const override {
    return std::make_unique<StreamingPolicy>();
  }

 private:
  std::vector<int32_t> order_;  // reused: no allocation in steady state
};

}  // namespace qevict
