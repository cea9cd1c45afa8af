// DefensiveKVPolicy (see defensivekv_policy.h). O(G·w·n + H·n log(H·n)) per layer.
#include "kvcache/policies/defensivekv_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvcache/policies/adakv_policy.h"

namespace qevict {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

PolicyNeeds DefensiveKVPolicy::needs() const {
  PolicyNeeds n;
  n.per_layer = true;
  n.obs_window = o_.window;
  n.obs_max_kernel = o_.kernel;
  n.value_norms = true;
  n.cumulative_scores = false;
  n.cross_layer = o_.over_layers;
  return n;
}

void DefensiveKVPolicy::scores(const RoutingRequest& req, std::vector<double>* out) {
  const int H = req.n_heads, g = req.group, w = req.n_obs;
  out->assign(req.candidates.size(), 0.0);
  if (req.candidates.empty() || w == 0) return;
  // The window bias (a scalar per layer): the mean over query heads and window queries of
  // the attention on each head's last w candidates (the reference's last w prefix columns).
  double bias = 0.0;
  for (int h = 0; h < H; ++h) {
    const int64_t n = req.n_cand(h), from = std::max<int64_t>(0, n - o_.window);
    for (int j = 0; j < g; ++j)
      for (int r = 0; r < w; ++r) {
        const float* a = req.obs_row(h, j, r);
        for (int64_t i = from; i < n; ++i) bias += a[i];
      }
  }
  bias /= double(H) * g * w;
  // ν summed over the heads that hold each position (all heads at the end of the prompt):
  // an H-way walk over the heads' position-sorted candidates.
  nu_sum_.assign(req.candidates.size(), 0.0);
  for (int h = 0; h < H; ++h) {
    const int64_t b = req.cand_begin(h), n = req.n_cand(h);
    for (int o = 0; o < H; ++o) {
      const int64_t ob = req.cand_begin(o), on = req.n_cand(o);
      int64_t k = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t p = req.candidates[size_t(b + i)].id;
        while (k < on && req.candidates[size_t(ob + k)].id < p) ++k;
        if (k < on && req.candidates[size_t(ob + k)].id == p)
          nu_sum_[size_t(b + i)] += req.value_norm[size_t(ob + k)];
      }
    }
  }
  for (int h = 0; h < H; ++h) {
    const int64_t b = req.cand_begin(h), n = req.n_cand(h);
    if (n == 0) continue;
    row_.resize(size_t(n));
    pooled_.resize(size_t(n));
    mx_.assign(size_t(n), 0.0);
    ave_.assign(size_t(n), 0.0);
    // Defensive aggregation: each (query head, query) row pooled and rescaled to its
    // pre-pool sum; the max over rows.
    for (int j = 0; j < g; ++j)
      for (int r = 0; r < w; ++r) {
        const float* a = req.obs_row(h, j, r);
        double base = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          row_[size_t(i)] = a[i];
          base += a[i];
          ave_[size_t(i)] += a[i];
        }
        if (!req.obs_max.empty()) continue;  // decode: the cache kept the max (below)
        snapkv::pool1d(row_.data(), n, o_.kernel, ObsPool::kAvg, pooled_.data());
        double psum = 0.0;
        for (int64_t i = 0; i < n; ++i) psum += pooled_[size_t(i)];
        const double scale = psum > 0.0 ? base / psum : 0.0;
        for (int64_t i = 0; i < n; ++i)
          mx_[size_t(i)] = std::max(mx_[size_t(i)], pooled_[size_t(i)] * scale);
      }
    if (!req.obs_max.empty())
      for (int64_t i = 0; i < n; ++i) mx_[size_t(i)] = req.obs_max[size_t(b + i)];
    double mean = 0.0;
    for (double m : mx_) mean += m;
    mean /= double(n);
    double* s = out->data() + b;
    for (int64_t i = 0; i < n; ++i) {
      const double nu = req.value_norm[size_t(b + i)], den = nu_sum_[size_t(b + i)];
      s[i] = std::max(mx_[size_t(i)], mean) * (den > 0.0 ? nu / den : 0.0);
    }
    // Stage 1: the tokens before the mean attention's cumulative share first reaches
    // 0.9 − bias (ranked by that share, older first on ties), at most the head's budget.
    double total = 0.0;
    for (double x : ave_) total += x;
    order_.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) order_[size_t(i)] = int32_t(i);
    std::sort(order_.begin(), order_.end(), [&](int32_t x, int32_t y) {
      if (ave_[size_t(x)] != ave_[size_t(y)]) return ave_[size_t(x)] > ave_[size_t(y)];
      return req.candidates[size_t(b + x)].id < req.candidates[size_t(b + y)].id;
    });
    const double threshold = o_.mass - bias;
    int64_t count = 0;  // argmax(cumsum >= threshold): 0 when never reached
    double cum = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      cum += total > 0.0 ? ave_[size_t(order_[size_t(r)])] / total : 0.0;
      if (cum >= threshold) {
        count = r;
        break;
      }
    }
    // The reference caps the count at int(m·(1 − cr) − w), m = n − w its prefix length
    // (efficient_defensivekv_press.py:L67 on values[..., :-w], L218): with 1 − cr = C / n,
    // C = K + R the head's capacity, that is ⌊(n − R)·C / n⌋ − R, at most K.
    const int64_t quota = std::max<int64_t>(0, snapkv::per_head_quota(req));
    const double n_all = double(std::max<int64_t>(req.n_past, 1));
    const int64_t cap = std::clamp<int64_t>(
        int64_t(std::floor(double(req.n_past - recent_) * double(quota + recent_) / n_all)) -
            recent_,
        0, quota);
    count = std::min(count, cap);
    for (int64_t r = 0; r < count; ++r) s[order_[size_t(r)]] = kInf;
  }
}

void DefensiveKVPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  plan->reset(req);
  const int H = req.n_heads;
  head_score_.resize(size_t(H));
  const std::vector<int64_t>* counts = &budget_;
  std::vector<double> all;
  const size_t l = size_t(req.layer);
  if (o_.over_layers && l < layer_score_.size() && layer_begin_[l] == req.head_begin &&
      layer_score_[l].size() == req.candidates.size()) {
    // Scores and per-head budgets from the prepare() pass over every layer.
    all = layer_score_[l];
    counts = &layer_counts_[l];
  } else {  // DefensiveKV (or a request no prepare() pass saw: the per-layer rule)
    scores(req, &all);
    for (int h = 0; h < H; ++h)
      head_score_[size_t(h)].assign(all.begin() + req.cand_begin(h),
                                    all.begin() + req.cand_begin(h) + req.n_cand(h));
    const int64_t quota =
        std::min<int64_t>(snapkv::per_head_quota(req), int64_t(req.candidates.size()));
    AdaKVPolicy::allocate(head_score_, quota, 0.0, &budget_);  // one global top-H·K, no floor
  }
  for (int h = 0; h < H; ++h)
    snapkv::keep_top(req, req.cand_begin(h), req.n_cand(h), all.data() + req.cand_begin(h),
                     (*counts)[size_t(h)], &order_, plan);
}

void DefensiveKVPolicy::prepare(const RoutingRequest& req) {
  if (req.layer == 0) {
    layer_score_.clear();
    layer_begin_.clear();
  }
  layer_score_.resize(size_t(req.layer) + 1);
  layer_begin_.resize(size_t(req.layer) + 1);
  scores(req, &layer_score_[size_t(req.layer)]);
  layer_begin_[size_t(req.layer)] = req.head_begin;
}

void DefensiveKVPolicy::prepare_done(int64_t total_tokens) {
  // One global top over every layer's and head's scores: (score desc, layer, head, index).
  const size_t L = layer_score_.size();
  layer_tokens_.assign(L, 0);
  layer_counts_.assign(L, {});
  struct Item {
    double s;
    int32_t l, h, i;
  };
  std::vector<Item> items;
  for (size_t l = 0; l < L; ++l) {
    const auto& hb = layer_begin_[l];
    const int H = int(hb.size()) - 1;
    layer_counts_[l].assign(size_t(std::max(H, 0)), 0);
    for (int h = 0; h < H; ++h)
      for (int64_t i = hb[size_t(h)]; i < hb[size_t(h) + 1]; ++i)
        items.push_back({layer_score_[l][size_t(i)], int32_t(l), h, int32_t(i)});
  }
  const int64_t top = std::clamp<int64_t>(total_tokens, 0, int64_t(items.size()));
  if (top > 0) {
    std::nth_element(items.begin(), items.begin() + (top - 1), items.end(),
                     [](const Item& a, const Item& b) {
                       if (a.s != b.s) return a.s > b.s;
                       if (a.l != b.l) return a.l < b.l;
                       if (a.h != b.h) return a.h < b.h;
                       return a.i < b.i;
                     });
  }
  for (int64_t r = 0; r < top; ++r) {
    ++layer_counts_[size_t(items[size_t(r)].l)][size_t(items[size_t(r)].h)];
    ++layer_tokens_[size_t(items[size_t(r)].l)];
  }
}

int64_t DefensiveKVPolicy::layer_budget(int layer, int n_layers, int n_heads, int64_t heavy,
                                        int64_t n_hist) const {
  if (!o_.over_layers || size_t(layer) >= layer_tokens_.size())
    return RoutingPolicy::layer_budget(layer, n_layers, n_heads, heavy, n_hist);
  return layer_tokens_[size_t(layer)];
}

}  // namespace qevict
