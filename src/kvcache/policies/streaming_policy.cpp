// StreamingPolicy (see streaming_policy.h). O(n log n) in the number of candidates.
#include "kvcache/policies/streaming_policy.h"

#include <algorithm>

namespace qevict {

void StreamingPolicy::route(const std::vector<RoutingCandidate>& in, const RoutingBudget& b,
                            std::vector<Tier>* out) {
  out->assign(in.size(), Tier::kEvicted);
  order_.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(),
            [&](int32_t a, int32_t c) { return in[a].window > in[c].window; });  // newest first
  size_t full_left = b.full_bytes, quant_left = b.quant_bytes;
  bool full_open = true;
  for (int32_t i : order_) {
    const size_t f_cost =
        b.window_full + (b.strict_ledger && in[i].has_ledger ? b.window_quant : 0);
    if (full_open && f_cost <= full_left) {
      (*out)[i] = Tier::kFull;
      full_left -= f_cost;
      continue;
    }
    full_open = false;  // the recent window is contiguous: nothing older takes F
    if (b.window_quant > 0 && b.window_quant <= quant_left) {
      (*out)[i] = Tier::kQuant;
      quant_left -= b.window_quant;
    }
  }
}

}  // namespace qevict
