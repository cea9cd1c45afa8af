// QEvictPolicy (see qevict_policy.h). O(n log n) in the number of candidates.
#include "kvcache/policies/qevict_policy.h"

#include <algorithm>

namespace qevict {

void QEvictPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  const auto& in = req.candidates;
  const RoutingBudget& b = req.budget;
  rank_.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    rank_[i] = rank_score(mode_, in[i], req.n_past, req.scores_from);
  const std::vector<double>* key = &rank_;
  if (pool_ > 0) {  // the max over the candidates within pool_ ids, in id order
    pooled_.resize(in.size());
    by_id_.resize(in.size());
    for (size_t i = 0; i < in.size(); ++i) by_id_[i] = static_cast<int32_t>(i);
    const auto older = [&](int32_t a, int32_t c) { return in[a].id < in[c].id; };
    // WindowStore hands candidates in id order; a test may not.
    if (!std::is_sorted(by_id_.begin(), by_id_.end(), older))
      std::sort(by_id_.begin(), by_id_.end(), older);
    for (size_t k = 0; k < by_id_.size(); ++k) {
      const int32_t i = by_id_[k];
      double m = rank_[i];
      for (size_t j = k; j-- > 0 && in[by_id_[j]].id >= in[i].id - pool_;)
        m = std::max(m, rank_[by_id_[j]]);
      if (!after_only_)
        for (size_t j = k + 1; j < by_id_.size() && in[by_id_[j]].id <= in[i].id + pool_; ++j)
          m = std::max(m, rank_[by_id_[j]]);
      pooled_[i] = m;
    }
    key = &pooled_;
  }
  const std::vector<double>& pooled = *key;
  order_.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t c) {
    if (pooled[a] != pooled[c]) return pooled[a] > pooled[c];
    if (rank_[a] != rank_[c]) return rank_[a] > rank_[c];
    return in[a].id < in[c].id;  // deterministic: older first
  });
  // When every candidate fits in full precision within the whole history budget, nothing is
  // quantized or evicted: a budget that covers the full cache behaves as FullKV. (Eq. 3's
  // fixed K_f/K_q split would otherwise quantize windows that the budget could hold in F.)
  size_t all_full = 0;
  for (const auto& c : in)
    all_full += b.window_full + (b.strict_ledger && c.has_ledger ? b.window_quant : 0);
  if (all_full <= b.full_bytes + b.quant_bytes) {
    plan->reset(req);
    for (size_t i = 0; i < in.size(); ++i) plan->set(i, Tier::kFull);
    return;
  }
  fill_tiers_in_order(order_, req, plan);
}

}  // namespace qevict
