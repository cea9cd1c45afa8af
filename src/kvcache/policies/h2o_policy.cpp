// H2OPolicy (see h2o_policy.h): top-k selection by accumulated attention score.
#include "kvcache/policies/h2o_policy.h"

#include <algorithm>

namespace qevict {

void H2OPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  const auto& in = req.candidates;
  const RoutingBudget& b = req.budget;
  const size_t n = in.size();
  const size_t keep = b.window_full > 0 ? std::min(n, b.full_bytes / b.window_full) : n;
  plan->reset(req);
  if (keep == n) {
    for (size_t i = 0; i < n; ++i) plan->set(i, Tier::kFull);
    return;
  }
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);
  // A strict total order (score desc, position asc, index asc), so the selected set does not
  // depend on the partition algorithm even when positions repeat.
  const auto before = [&](int32_t a, int32_t c) {
    if (in[a].score != in[c].score) return in[a].score > in[c].score;
    if (in[a].id != in[c].id) return in[a].id < in[c].id;
    return a < c;
  };
  std::nth_element(order_.begin(), order_.begin() + keep, order_.end(), before);
  for (size_t r = 0; r < keep; ++r) plan->set(size_t(order_[r]), Tier::kFull);
}

}  // namespace qevict
