// CriticalKVPolicy (see criticalkv_policy.h). O(H·n log(H·n)) per layer.
#include "kvcache/policies/criticalkv_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvcache/policies/adakv_policy.h"

namespace qevict {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

PolicyNeeds CriticalKVPolicy::needs() const {
  PolicyNeeds n;
  n.per_layer = true;
  n.obs_window = o_.snap.window;
  n.value_norms = true;
  n.cumulative_scores = false;
  return n;
}

void CriticalKVPolicy::force_top(const RoutingRequest& req, int h, std::vector<double>& s,
                                 int64_t n) {
  const int64_t m = int64_t(s.size());
  n = std::clamp<int64_t>(n, 0, m);
  if (n == 0) return;
  order_.resize(size_t(m));
  for (int64_t i = 0; i < m; ++i) order_[size_t(i)] = int32_t(i);
  const int64_t b = req.cand_begin(h);
  const auto& c = req.candidates;
  std::nth_element(order_.begin(), order_.begin() + (n - 1), order_.end(),
                   [&](int32_t x, int32_t y) {
                     if (s[size_t(x)] != s[size_t(y)]) return s[size_t(x)] > s[size_t(y)];
                     return c[size_t(b + x)].id < c[size_t(b + y)].id;
                   });
  for (int64_t r = 0; r < n; ++r) s[size_t(order_[size_t(r)])] = kInf;
}

void CriticalKVPolicy::two_stage(const RoutingRequest& req, int h, std::vector<double>& s,
                                 int64_t n_forced, int64_t keep, RoutingPlan* plan) {
  force_top(req, h, s, n_forced);  // stage 1
  const int64_t b = req.cand_begin(h), n = req.n_cand(h);
  s2_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i)  // stage 2
    s2_[size_t(i)] = std::isinf(s[size_t(i)])
                         ? kInf
                         : (s[size_t(i)] + o_.epsilon) * double(req.value_norm[size_t(b + i)]);
  snapkv::keep_top(req, b, n, s2_.data(), keep, &order_, plan);
}

void CriticalKVPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  plan->reset(req);
  const int H = req.n_heads;
  const int64_t quota =
      std::min<int64_t>(snapkv::per_head_quota(req), int64_t(req.candidates.size()));
  // kvpress's K and its stage-1 share counted with the always-kept tokens (see the header).
  auto history_share = [&](double ratio, int64_t k_hist) {
    return std::clamp<int64_t>(int64_t(ratio * double(k_hist + recent_)) - recent_, 0, k_hist);
  };
  score_.resize(size_t(H));
  for (int h = 0; h < H; ++h)
    snapkv::head_scores(req, h, o_.snap.kernel, o_.snap.pool, &score_[size_t(h)]);
  if (!o_.adaptive) {
    for (int h = 0; h < H; ++h)
      two_stage(req, h, score_[size_t(h)], history_share(o_.first_stage, quota), quota, plan);
    return;
  }
  // CriticalAdaKV: safeguard, head budgets from the global top H·K, then two stages per head.
  const int64_t n_safe = history_share(o_.alpha, quota);
  for (int h = 0; h < H; ++h) force_top(req, h, score_[size_t(h)], n_safe);
  AdaKVPolicy::allocate(score_, quota, 0.0, &budget_);  // α = 0: the plain counts c_h
  for (int h = 0; h < H; ++h)
    two_stage(req, h, score_[size_t(h)], history_share(o_.first_stage, budget_[size_t(h)]),
              budget_[size_t(h)], plan);
}

}  // namespace qevict
