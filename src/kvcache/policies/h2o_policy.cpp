// H2OPolicy (see h2o_policy.h): top-k selection by accumulated attention score.
#include "kvcache/policies/h2o_policy.h"

#include <algorithm>

namespace qevict {

void H2OPolicy::route(const std::vector<RoutingCandidate>& in, const RoutingBudget& b,
                      std::vector<Tier>* out) {
  const size_t n = in.size();
  const size_t keep = b.window_full > 0 ? std::min(n, b.full_bytes / b.window_full) : n;
  out->assign(n, Tier::kEvicted);
  if (keep == n) {
    out->assign(n, Tier::kFull);
    return;
  }
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);
  // A strict total order (score desc, position asc, index asc), so the selected set does not
  // depend on the partition algorithm even when positions repeat.
  const auto before = [&](int32_t a, int32_t c) {
    if (in[a].score != in[c].score) return in[a].score > in[c].score;
    if (in[a].window != in[c].window) return in[a].window < in[c].window;
    return a < c;
  };
  std::nth_element(order_.begin(), order_.begin() + keep, order_.end(), before);
  for (size_t r = 0; r < keep; ++r) (*out)[order_[r]] = Tier::kFull;
}

}  // namespace qevict
