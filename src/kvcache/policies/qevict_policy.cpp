// QEvictPolicy (see qevict_policy.h). O(n log n) in the number of candidates.
#include "kvcache/policies/qevict_policy.h"

#include <algorithm>

namespace qevict {

void QEvictPolicy::route(const std::vector<RoutingCandidate>& in, const RoutingBudget& b,
                         std::vector<Tier>* out) {
  order_.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t c) {
    if (in[a].score != in[c].score) return in[a].score > in[c].score;
    return in[a].window < in[c].window;  // deterministic: older first
  });
  // When every candidate fits in full precision within the whole history budget, nothing is
  // quantized or evicted: a budget that covers the full cache behaves as FullKV. (Eq. 3's
  // fixed K_f/K_q split would otherwise quantize windows that the budget could hold in F.)
  size_t all_full = 0;
  for (const auto& c : in)
    all_full += b.window_full + (b.strict_ledger && c.has_ledger ? b.window_quant : 0);
  if (all_full <= b.full_bytes + b.quant_bytes) {
    out->assign(in.size(), Tier::kFull);
    return;
  }
  fill_tiers_in_order(order_, in, b, out);
}

}  // namespace qevict
