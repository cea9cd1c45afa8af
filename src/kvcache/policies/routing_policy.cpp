// The fill rule shared by the ranking policies (see routing_policy.h).
#include "kvcache/policies/routing_policy.h"

namespace qevict {

void fill_tiers_in_order(const std::vector<int32_t>& order, const std::vector<RoutingCandidate>& in,
                         const RoutingBudget& b, std::vector<Tier>* out) {
  out->assign(in.size(), Tier::kEvicted);
  size_t full_left = b.full_bytes, quant_left = b.quant_bytes;
  bool full_open = true;
  for (int32_t i : order) {
    // A window keeps (or gets) a ledger entry when it is or was in Q; in strict mode that
    // copy is charged to the full tier too.
    const size_t f_cost =
        b.window_full + (b.strict_ledger && in[i].has_ledger ? b.window_quant : 0);
    if (full_open && f_cost <= full_left) {
      (*out)[i] = Tier::kFull;
      full_left -= f_cost;
      continue;
    }
    full_open = false;  // rank order: once a window misses F, no lower-ranked window takes F
    if (b.window_quant > 0 && b.window_quant <= quant_left) {
      (*out)[i] = Tier::kQuant;
      quant_left -= b.window_quant;
    }
  }
}

}  // namespace qevict
