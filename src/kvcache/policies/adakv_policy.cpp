// AdaKVPolicy (see adakv_policy.h). O(H·n log(H·n)) per layer.
#include "kvcache/policies/adakv_policy.h"

#include <algorithm>
#include <cmath>

namespace qevict {

void AdaKVPolicy::allocate(const std::vector<std::vector<double>>& scores, int64_t base,
                           double alpha, std::vector<int64_t>* counts) {
  const int H = int(scores.size());
  counts->assign(size_t(H), 0);
  if (H == 0) return;
  // Global top-H·B over (score desc, head asc, position asc): c_h.
  struct Item {
    double s;
    int h;
    int32_t i;
  };
  thread_local std::vector<Item> all;
  all.clear();
  for (int h = 0; h < H; ++h)
    for (size_t i = 0; i < scores[size_t(h)].size(); ++i)
      all.push_back({scores[size_t(h)][i], h, int32_t(i)});
  const int64_t top = std::min<int64_t>(int64_t(H) * base, int64_t(all.size()));
  std::vector<int64_t> c(size_t(H), 0);
  if (top > 0) {
    std::nth_element(all.begin(), all.begin() + (top - 1), all.end(),
                     [](const Item& a, const Item& b) {
                       if (a.s != b.s) return a.s > b.s;
                       if (a.h != b.h) return a.h < b.h;
                       return a.i < b.i;
                     });
    for (int64_t r = 0; r < top; ++r) ++c[size_t(all[size_t(r)].h)];
  }
  const int64_t floor_cap = int64_t(double(base) * alpha);  // int(B·α)
  std::vector<double> raw(static_cast<size_t>(H));
  int64_t sum = 0;
  for (int h = 0; h < H; ++h) {
    raw[size_t(h)] = double(c[size_t(h)]) * (1.0 - alpha) + double(floor_cap);
    (*counts)[size_t(h)] = int64_t(std::nearbyint(raw[size_t(h)]));  // half to even
    sum += (*counts)[size_t(h)];
  }
  // Hold the layer's H·B: take back what rounding added, from the largest round-ups.
  while (sum > int64_t(H) * base) {
    int worst = -1;
    for (int h = 0; h < H; ++h) {
      if ((*counts)[size_t(h)] == 0) continue;
      const double up = double((*counts)[size_t(h)]) - raw[size_t(h)];
      const double w = worst < 0 ? 0 : double((*counts)[size_t(worst)]) - raw[size_t(worst)];
      if (worst < 0 || up >= w) worst = h;
    }
    --(*counts)[size_t(worst)];
    --sum;
  }
}

PolicyNeeds AdaKVPolicy::needs() const {
  PolicyNeeds n;
  n.per_layer = true;
  n.obs_window = o_.snap.window;
  n.cumulative_scores = false;
  return n;
}

void AdaKVPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  plan->reset(req);
  const int64_t base =
      std::min<int64_t>(snapkv::per_head_quota(req), int64_t(req.candidates.size()));
  score_.resize(size_t(req.n_heads));
  for (int h = 0; h < req.n_heads; ++h)
    snapkv::head_scores(req, h, o_.snap.kernel, o_.snap.pool, &score_[size_t(h)]);
  if (o_.share == AdaKVOptions::Share::kSafeguard) {
    // kvpress: n_safe = int(n_kept·α) per head, the window first; its history share here.
    const int64_t n_safe =
        std::clamp<int64_t>(int64_t(o_.alpha * double(base + recent_)) - recent_, 0, base);
    for (int h = 0; h < req.n_heads; ++h) {
      std::vector<double>& s = score_[size_t(h)];
      const int64_t m = int64_t(s.size()), k = std::min(n_safe, m), b = req.cand_begin(h);
      if (k == 0) continue;
      order_.resize(size_t(m));
      for (int64_t i = 0; i < m; ++i) order_[size_t(i)] = int32_t(i);
      std::nth_element(order_.begin(), order_.begin() + (k - 1), order_.end(),
                       [&](int32_t x, int32_t y) {
                         if (s[size_t(x)] != s[size_t(y)]) return s[size_t(x)] > s[size_t(y)];
                         return req.candidates[size_t(b + x)].id < req.candidates[size_t(b + y)].id;
                       });
      for (int64_t r = 0; r < k; ++r) s[size_t(order_[size_t(r)])] = HUGE_VAL;
    }
    allocate(score_, base, 0.0, &budget_);  // the global top over what is left
  } else {
    allocate(score_, base, o_.alpha, &budget_);
  }
  for (int h = 0; h < req.n_heads; ++h)
    snapkv::keep_top(req, req.cand_begin(h), req.n_cand(h), score_[size_t(h)].data(),
                     budget_[size_t(h)], &order_, plan);
}

}  // namespace qevict
