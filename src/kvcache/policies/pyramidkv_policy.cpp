// PyramidKVPolicy (see pyramidkv_policy.h).
#include "kvcache/policies/pyramidkv_policy.h"

#include <cmath>

namespace qevict {

namespace {

// round(num / den) half to even (Python's round), den > 0.
int64_t round_half_even(int64_t num, int64_t den) {
  int64_t q = num / den, r = num % den;
  if (r < 0) r += den, --q;
  if (2 * r > den || (2 * r == den && q % 2 != 0)) ++q;
  return q;
}

}  // namespace

int64_t PyramidKVPolicy::layer_tokens(int layer, int n_layers, int64_t mean, int64_t n, int w,
                                      int beta) {
  // kvpress's formula in exact arithmetic, every quantity times β: min = T/β → T, max =
  // 2T − T/β → 2Tβ − T. (kvpress computes in floats; at an exact half its rounding can go
  // either way, and the layers' sum off by one token: here pairs of layers sum to 2T.)
  const int64_t T = mean, b = beta;
  int64_t min_b = T, max_b = 2 * T * b - T;
  if (max_b >= (n - w) * b) {
    max_b = (n - w) * b;
    min_b = 2 * T * b - max_b;
  }
  if (n_layers < 2 || !(n * b >= max_b && max_b >= min_b && min_b >= int64_t(w) * b))
    return T;  // SnapKV's uniform budget
  // max − l·(max − min)/(L − 1) = (max_b·(L−1) − l·(max_b − min_b)) / (β·(L−1)).
  const int64_t den = b * (n_layers - 1);
  return round_half_even(max_b * (n_layers - 1) - int64_t(layer) * (max_b - min_b), den);
}

int64_t PyramidKVPolicy::layer_budget(int layer, int n_layers, int n_heads, int64_t heavy,
                                      int64_t n_hist) const {
  const int64_t mean = heavy + recent_;
  const int64_t n = n_hist + recent_;
  return int64_t(n_heads) * (layer_tokens(layer, n_layers, mean, n, recent_, o_.beta) - recent_);
}

PolicyNeeds PyramidKVPolicy::needs() const {
  PolicyNeeds n;
  n.per_layer = true;
  n.obs_window = o_.snap.window;
  n.cumulative_scores = false;
  return n;
}

void PyramidKVPolicy::plan(const RoutingRequest& req, RoutingPlan* plan) {
  // The cache gives this layer's budget (layer_budget) in req.budget: SnapKV within it.
  plan->reset(req);
  const int64_t quota = snapkv::per_head_quota(req);
  for (int h = 0; h < req.n_heads; ++h) {
    snapkv::head_scores(req, h, o_.snap.kernel, o_.snap.pool, &score_);
    snapkv::keep_top(req, req.cand_begin(h), req.n_cand(h), score_.data(), quota, &order_, plan);
  }
}

}  // namespace qevict
