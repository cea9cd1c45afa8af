// SnapKVPolicy and the SnapKV family's shared scoring (see snapkv_policy.h). O(G · w · n) per
// head for the scores, O(n log n) for the selection.
#include "kvcache/policies/snapkv_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qevict {
namespace snapkv {

void pool1d(const double* x, int64_t n, int k, ObsPool pool, double* y) {
  const int64_t r = k / 2;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t a = std::max<int64_t>(0, i - r), b = std::min<int64_t>(n, i + r + 1);
    if (pool == ObsPool::kAvg) {
      double s = 0.0;
      for (int64_t t = a; t < b; ++t) s += x[t];
      y[i] = s / k;  // zero padding counts (count_include_pad)
    } else {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t t = a; t < b; ++t) m = std::max(m, x[t]);
      y[i] = m;
    }
  }
}

void head_scores(const RoutingRequest& req, int h, int kernel, ObsPool pool,
                 std::vector<double>* out) {
  const int64_t n = req.n_cand(h);
  out->assign(size_t(n), 0.0);
  if (n == 0 || req.n_obs == 0) return;
  thread_local std::vector<double> mean, pooled;
  mean.resize(size_t(n));
  pooled.resize(size_t(n));
  for (int j = 0; j < req.group; ++j) {
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int r = 0; r < req.n_obs; ++r) {
      const float* row = req.obs_row(h, j, r);
      for (int64_t i = 0; i < n; ++i) mean[size_t(i)] += row[i];
    }
    for (double& m : mean) m /= req.n_obs;
    pool1d(mean.data(), n, kernel, pool, pooled.data());
    for (int64_t i = 0; i < n; ++i) (*out)[size_t(i)] += pooled[size_t(i)] / req.group;
  }
}

void keep_top(const RoutingRequest& req, int64_t begin, int64_t n, const double* scores,
              int64_t keep, std::vector<int32_t>* order, RoutingPlan* plan) {
  keep = std::clamp<int64_t>(keep, 0, n);
  if (keep == n) {
    for (int64_t i = 0; i < n; ++i) plan->set(size_t(begin + i), Tier::kFull);
    return;
  }
  order->resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) (*order)[size_t(i)] = int32_t(i);
  const auto& c = req.candidates;
  std::nth_element(order->begin(), order->begin() + keep, order->end(), [&](int32_t a, int32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return c[size_t(begin + a)].id < c[size_t(begin + b)].id;
  });
  for (int64_t r = 0; r < keep; ++r) plan->set(size_t(begin + (*order)[size_t(r)]), Tier::kFull);
}

int64_t per_head_quota(const RoutingRequest& req) {
  const RoutingBudget& b = req.budget;
  if (b.window_full == 0) return std::numeric_limits<int64_t>::max();
  return int64_t(b.full_bytes / b.window_full) / std::max(req.n_heads, 1);
}

}  // namespace snapkv

PolicyNeeds SnapKVPolicy::needs() const {
  PolicyNeeds n;
  n.per_layer = true;
  n.obs_window = o_.window;
  n.cumulative_scores = false;
  return n;
}

void SnapKVPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  plan->reset(req);
  const int64_t quota = snapkv::per_head_quota(req);
  for (int h = 0; h < req.n_heads; ++h) {
    snapkv::head_scores(req, h, o_.kernel, o_.pool, &score_);
    snapkv::keep_top(req, req.cand_begin(h), req.n_cand(h), score_.data(), quota, &order_, plan);
  }
}

}  // namespace qevict
