// StreamingPolicy (see streaming_policy.h). O(n log n) in the number of candidates.
#include "kvcache/policies/streaming_policy.h"

#include <algorithm>

namespace qevict {

void StreamingPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  const auto& in = req.candidates;
  order_.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(),
            [&](int32_t a, int32_t c) { return in[a].id > in[c].id; });  // newest first
  fill_tiers_in_order(order_, req, plan);
}

}  // namespace qevict
