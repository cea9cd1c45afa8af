// PyramidKV: its layer budgets against kvpress's formula worked by hand and a brute-force
// transcription, their sum (equal bytes to SnapKV), and the cache running it against the
// independent model of obs_family.h (SnapKV's selection within each layer's budget).
#include "kvcache/policies/pyramidkv_policy.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kvcache/obs_family.h"

namespace qevict {
namespace {

using obs_family::RouteInput;
using obs_family::RuleOutput;

// kvpress get_layer_budget, transcribed in exact rationals (long double would round exact
// halves either way, as kvpress's floats do): values as (numerator, denominator) pairs.
int64_t pyramid_ref(int layer, int n_layers, int64_t T, int64_t n, int w, int beta) {
  struct Q {
    int64_t p, q;  // p / q, q > 0
    bool ge(const Q& o) const { return __int128(p) * o.q >= __int128(o.p) * q; }
  };
  Q mn{T, beta};
  Q mx{2 * T * beta - T, beta};
  if (mx.ge(Q{n - w, 1})) {
    mx = {n - w, 1};
    mn = {2 * T - (n - w), 1};
  }
  if (!(Q{n, 1}.ge(mx) && mx.ge(mn) && mn.ge(Q{w, 1}))) return T;
  // x = mx − layer·(mx − mn)/(L − 1), on the common denominator mx.q·(L − 1) (mn.q == mx.q).
  const int64_t den = mx.q * (n_layers - 1);
  const int64_t num = mx.p * (n_layers - 1) - int64_t(layer) * (mx.p - mn.p);
  const long double x = (long double)num / den;
  const int64_t f = int64_t(std::floor(x));
  const int64_t twice_frac = 2 * (num - f * den);  // 2·(x − f)·den
  if (twice_frac == den) return f % 2 == 0 ? f : f + 1;
  return twice_frac > den ? f + 1 : f;
}

TEST(PyramidKVPolicy, LayerBudgetsFollowKvpress) {
  // By hand: T = 800, w = 32, β = 20, n = 10000, 5 layers: min 40, max 1560, steps 380:
  // 1560, 1180, 800, 420, 40.
  const int64_t want[5] = {1560, 1180, 800, 420, 40};
  for (int l = 0; l < 5; ++l)
    EXPECT_EQ(PyramidKVPolicy::layer_tokens(l, 5, 800, 10000, 32, 20), want[l]) << l;
  // max capped at n − w: n = 1200 → max 1168, min 432, steps 184.
  EXPECT_EQ(PyramidKVPolicy::layer_tokens(0, 5, 800, 1200, 32, 20), 1168);
  EXPECT_EQ(PyramidKVPolicy::layer_tokens(4, 5, 800, 1200, 32, 20), 432);
  // min = T/β below w: SnapKV's uniform budget.
  EXPECT_EQ(PyramidKVPolicy::layer_tokens(0, 5, 600, 10000, 32, 20), 600);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int L = 2 + int(rng() % 40), w = 1 + int(rng() % 64), beta = 1 + int(rng() % 30);
    const int64_t T = w + int64_t(rng() % 5000), n = T + int64_t(rng() % 20000);
    int64_t sum = 0;
    for (int l = 0; l < L; ++l) {
      const int64_t got = PyramidKVPolicy::layer_tokens(l, L, T, n, w, beta);
      ASSERT_EQ(got, pyramid_ref(l, L, T, n, w, beta))
          << "layer " << l << " of " << L << " T " << T << " n " << n << " w " << w;
      sum += got;
    }
    // Equal bytes: the layers together keep L·T tokens per head (pairs round to 2T).
    ASSERT_EQ(sum, int64_t(L) * T) << "L " << L << " T " << T << " n " << n << " w " << w;
  }
  // layer_budget in history terms: S + L = 8 tokens per head kept outside the history, which
  // are kvpress's always-kept window: T = 800, n = 10000, w = 8: 1560 − 8 history tokens per
  // head, 3 heads.
  PyramidKVPolicy pol({}, 8);
  EXPECT_EQ(pol.layer_budget(0, 5, 3, 800 - 8, 10000 - 8), 3 * (1560 - 8));
  EXPECT_EQ(pol.layer_budget(4, 5, 3, 800 - 8, 10000 - 8), 3 * (40 - 8));
}

// SnapKV's rule within kvpress's layer budget (brute force).
RuleOutput pyramid_rule(const RouteInput& in, int recent, int beta, int k) {
  const int64_t T = in.heavy + recent;
  const int64_t quota = pyramid_ref(in.layer, in.n_layers, T, in.n_past, recent, beta) - recent;
  RuleOutput out;
  for (size_t h = 0; h < in.cand.size(); ++h) {
    const std::vector<double> s = obs_family::snap_scores_ref(in, int(h), k, false);
    std::vector<int> idx;
    out.ambiguous.push_back(obs_family::rank_desc(s, in.cand[h], &idx, quota));
    std::set<int32_t> keep;
    for (int64_t r = 0; r < std::min<int64_t>(quota, int64_t(idx.size())); ++r)
      keep.insert(in.cand[h][size_t(idx[size_t(r)])]);
    out.keep.push_back(keep);
  }
  return out;
}

// Budget 20 tokens per head on average = 4 recent + 16 history; β = 2 so that the pyramid
// (not the fallback) runs at this size: 3 layers keep 30, 20, 10 tokens per head.
TEST(PyramidKVCache, MatchesBruteForceModelAndHoldsTheBudget) {
  const KvShape s = obs_family::small_shape(3);
  const int recent = 4, beta = 2;
  KvCacheParams p = obs_family::family_params("pyramidkv", 20, recent, 4);
  obs_family::DriveOptions o;
  o.calls = {40, 26};
  o.n_prompt = 66;
  o.calls.insert(o.calls.end(), 30, 1);
  o.seed = 9;
  o.budget_over_layers = true;
  PyramidKVOptions po;
  po.snap = {8, 5, ObsPool::kAvg};
  po.beta = beta;
  obs_family::Driver drv(s, p, 200, std::make_unique<PyramidKVPolicy>(po, recent));
  const auto res =
      drv.run(o, 8, [&](const RouteInput& in) { return pyramid_rule(in, recent, beta, 5); });
  if (HasFailure()) return;
  EXPECT_GE(res.routing_events, 1 + 30 / 4);
  EXPECT_LT(res.ambiguous_heads * 10, res.checked_heads);
  // The first layer keeps more than SnapKV's 16 history tokens, the last fewer.
  const KvReport r = report_of(drv.cache());
  EXPECT_GT(r.layers[0].bytes_budgeted, r.budget.total);
  EXPECT_LT(r.layers[2].bytes_budgeted, r.layers[0].bytes_budgeted / 2);
}

}  // namespace
}  // namespace qevict
