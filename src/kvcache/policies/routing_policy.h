// Routing policies decide; the cache applies. At a routing event a policy receives the
// candidate windows of one layer (aged windows in F or Q, and those that just left the
// local region) with their scores, and byte budgets for the two kept tiers, and returns a
// target tier per candidate. It never touches storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/tier.h"

namespace qevict {

struct RoutingCandidate {
  int32_t window = 0;        // window id (older windows have smaller ids)
  double score = 0.0;        // accumulated attention mass (SPEC §2)
  Tier tier = Tier::kLocal;  // current tier (kLocal: just aged)
  bool has_ledger = false;   // a low-bit copy exists already
};

struct RoutingBudget {
  size_t full_bytes = 0;       // bytes for the full-precision tier
  size_t quant_bytes = 0;      // bytes for the low-bit tier
  size_t window_full = 0;      // M_f
  size_t window_quant = 0;     // M_q
  bool strict_ledger = false;  // a full window that keeps a ledger also pays M_q from full_bytes
};

// The fill rule that ranking policies share: walk the candidates in `order` (best first); each
// takes F while its F cost (M_f, plus M_q in strict mode when it keeps a ledger) fits, and
// once one misses F no later one takes F; the next take Q while M_q fits; the rest E.
void fill_tiers_in_order(const std::vector<int32_t>& order, const std::vector<RoutingCandidate>& in,
                         const RoutingBudget& budget, std::vector<Tier>* out);

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  // out[i] = target tier of in[i] (kFull, kQuant or kEvicted).
  virtual void route(const std::vector<RoutingCandidate>& in, const RoutingBudget& budget,
                     std::vector<Tier>* out) = 0;
  virtual std::string name() const = 0;
};

}  // namespace qevict
