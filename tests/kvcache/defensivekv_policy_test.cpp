// DefensiveKV and Layer-DefensiveKV: the policy against a brute-force transcription of the
// reference's scoring and allocation on random requests, a case worked by hand for the
// defensive aggregation, and the cache running each against the independent model of
// obs_family.h (budget per layer, or over all layers for Layer-DefensiveKV).
#include "kvcache/policies/defensivekv_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>

#include "common/random_wo.h"
#include "kvcache/obs_family.h"

namespace qevict {
namespace {

using obs_family::RouteInput;
using obs_family::RuleOutput;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool near(double a, double b) {
  if (std::isinf(a) || std::isinf(b) || a == b) return false;
  return std::fabs(a - b) <= 1e-4 * std::max(std::fabs(a), std::fabs(b)) + 1e-12;
}

// The reference's scores of one layer (efficient_defensivekv_press.py), transcribed with
// K history tokens per head as the stage-1 cap and `w` for the window bias's columns.
// ambiguous[h] is set when a stage-1 boundary is a near tie.
// R: the always-kept recent tokens (the reference's window in its stage-1 cap).
std::vector<std::vector<double>> defensive_scores_ref(const RouteInput& in, int64_t K, int w,
                                                      std::vector<bool>* ambiguous, int n_recent) {
  const int H = int(in.cand.size()), g = in.group, R = in.n_obs;
  double bias = 0.0;
  for (int h = 0; h < H; ++h) {
    const size_t n = in.cand[size_t(h)].size();
    for (int j = 0; j < g; ++j)
      for (int r = 0; r < R; ++r)
        for (size_t i = n > size_t(w) ? n - w : 0; i < n; ++i) bias += in.obs_at(h, j, r, i);
  }
  bias /= double(H * g * R);
  std::map<int32_t, double> nu_sum;
  for (int h = 0; h < H; ++h)
    for (size_t i = 0; i < in.cand[size_t(h)].size(); ++i)
      nu_sum[in.cand[size_t(h)][i]] += in.nu[size_t(h)][i];
  std::vector<std::vector<double>> out(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) {
    const size_t n = in.cand[size_t(h)].size();
    std::vector<double> m(n, 0.0), ave(n, 0.0);
    for (int j = 0; j < g; ++j)
      for (int r = 0; r < R; ++r) {
        std::vector<double> row(n);
        double base = 0.0;
        for (size_t i = 0; i < n; ++i) base += row[i] = in.obs_at(h, j, r, i);
        const std::vector<double> p = obs_family::pool_ref(row, 5, false);
        double ps = 0.0;
        for (double x : p) ps += x;
        for (size_t i = 0; i < n; ++i) {
          m[i] = std::max(m[i], ps > 0 ? p[i] / ps * base : 0.0);
          ave[i] += row[i] / (g * R);
        }
      }
    if (!in.mx.empty()) m = in.mx[size_t(h)];  // decode: the running max of the cache's rows
    double mean = 0.0;
    for (double x : m) mean += x / double(n);
    std::vector<double>& s = out[size_t(h)];
    for (size_t i = 0; i < n; ++i) {
      const double den = nu_sum[in.cand[size_t(h)][i]];
      s.push_back(std::max(m[i], mean) * (den > 0 ? in.nu[size_t(h)][i] / den : 0.0));
    }
    // Stage 1: sort the normalised mean attention; cumsum; the count before it reaches
    // 0.9 − bias; at most K.
    double tot = 0.0;
    for (double x : ave) tot += x;
    std::vector<int> idx;
    obs_family::rank_desc(ave, in.cand[size_t(h)], &idx, 0);
    double cum = 0.0;
    int64_t count = 0;
    for (size_t r = 0; r < n; ++r) {
      cum += ave[size_t(idx[r])] / tot;
      if (cum >= 0.9 - bias) {
        count = int64_t(r);
        if (std::fabs(cum - (0.9 - bias)) < 1e-5) (*ambiguous)[size_t(h)] = true;
        break;
      }
    }
    // The cap: int(m(1 − cr) − R) with m = n − R the prefix, 1 − cr = (K + R) / n
    // (R = n_recent).
    const int64_t cap =
        std::clamp<int64_t>(int64_t(std::floor(double(in.n_past - n_recent) * double(K + n_recent) /
                                               double(in.n_past))) -
                                n_recent,
                            0, K);
    count = std::min(count, cap);
    if (count > 0 && size_t(count) < n &&
        near(ave[size_t(idx[size_t(count - 1)])], ave[size_t(idx[size_t(count)])]))
      (*ambiguous)[size_t(h)] = true;
    for (int64_t r = 0; r < count; ++r) s[size_t(idx[size_t(r)])] = kInf;
  }
  return out;
}

// Global top over (layer, head, index) entries by (score desc, layer, head, index).
struct Entry {
  double s;
  int l, h, i;
};
void global_top(std::vector<Entry>& all, int64_t top, bool* ambiguous) {
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b) {
      const Entry& x = all[a];
      const Entry& y = all[b];
      const bool y_first = y.s != x.s   ? y.s > x.s
                           : y.l != x.l ? y.l < x.l
                           : y.h != x.h ? y.h < x.h
                                        : y.i < x.i;
      if (y_first) std::swap(all[a], all[b]);
    }
  top = std::min<int64_t>(top, int64_t(all.size()));
  if (top > 0 && top < int64_t(all.size()) && near(all[size_t(top - 1)].s, all[size_t(top)].s))
    *ambiguous = true;
  all.resize(size_t(std::max<int64_t>(top, 0)));
}

std::vector<RuleOutput> defensive_rule(const std::vector<RouteInput>& ins, int64_t K, int w,
                                       bool over_layers, int R) {
  std::vector<RuleOutput> outs(ins.size());
  std::vector<Entry> pool;
  bool amb_all = false;
  for (size_t l = 0; l < ins.size(); ++l) {
    const int H = int(ins[l].cand.size());
    outs[l].keep.assign(size_t(H), {});
    outs[l].ambiguous.assign(size_t(H), false);
    const auto s = defensive_scores_ref(ins[l], K, w, &outs[l].ambiguous, R);
    std::vector<Entry> layer;
    for (int h = 0; h < H; ++h)
      for (size_t i = 0; i < s[size_t(h)].size(); ++i)
        layer.push_back({s[size_t(h)][i], int(l), h, int(i)});
    if (over_layers) {
      pool.insert(pool.end(), layer.begin(), layer.end());
      for (int h = 0; h < H; ++h) amb_all |= outs[l].ambiguous[size_t(h)];
      continue;
    }
    int64_t n_all = int64_t(layer.size());
    bool amb = false;
    global_top(layer, int64_t(H) * std::min(K, n_all), &amb);
    for (const Entry& e : layer)
      outs[l].keep[size_t(e.h)].insert(ins[l].cand[size_t(e.h)][size_t(e.i)]);
    if (amb) outs[l].ambiguous.assign(size_t(H), true);
  }
  if (over_layers) {
    const int H = ins.empty() ? 0 : int(ins[0].cand.size());
    global_top(pool, int64_t(ins.size()) * H * K, &amb_all);
    for (const Entry& e : pool)
      outs[size_t(e.l)].keep[size_t(e.h)].insert(ins[size_t(e.l)].cand[size_t(e.h)][size_t(e.i)]);
    if (amb_all)
      for (auto& o : outs) o.ambiguous.assign(o.ambiguous.size(), true);
  }
  return outs;
}

TEST(DefensiveKVPolicy, MatchesBruteForceRuleOnRandomRequests) {
  std::mt19937 rng(41);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int H = 1 + int(rng() % 3), g = 1 + int(rng() % 3), n_obs = 1 + int(rng() % 4);
    const int64_t K = int64_t(rng() % 25);
    RoutingRequest req = obs_family::random_request(rng, H, g, n_obs, K, false);
    // Every head holds the same positions half the time (the end of the prompt), so ν is
    // normalised over all heads; otherwise over those holding each position.
    DefensiveKVOptions o;
    o.window = 1 + int(rng() % 6);
    DefensiveKVPolicy pol(o, 0);
    EXPECT_EQ(pol.name(), "defensivekv");
    RoutingPlan plan;
    pol.plan(req, &plan);
    ASSERT_TRUE(check_plan(req, plan).is_ok()) << check_plan(req, plan).message();
    RouteInput in = obs_family::as_input(req);
    in.n_past = req.n_past;
    const int64_t quota = std::min<int64_t>(K, int64_t(req.candidates.size()));
    const RuleOutput want = defensive_rule({in}, quota, o.window, false, 0)[0];
    for (int h = 0; h < H; ++h) {
      if (want.ambiguous[size_t(h)]) continue;
      ++checked;
      ASSERT_EQ(obs_family::kept_of(req, plan, h), want.keep[size_t(h)])
          << "trial " << trial << " head " << h << " K " << K;
    }
  }
  EXPECT_GT(checked, 300);
}

// The defensive aggregation by hand: one head, two query heads, one query each, no pooling
// effect to speak of (k = 5 over 3 candidates counts the padding, and the rescale undoes
// the uniform part). Query head 0 looks at candidate 0, query head 1 at candidate 2; the mean
// would rank candidate 1 (seen a little by both) above both, the max does not.
TEST(DefensiveKVPolicy, MaxOverHeadsNotMean) {
  RoutingRequest req;
  req.n_heads = 1;
  req.group = 2;
  req.n_obs = 1;
  for (int i = 0; i < 3; ++i) req.candidates.push_back({i, i, 0.0, Tier::kLocal, false, 0});
  req.head_begin = {0, 3};
  req.obs = {0.9f, 0.3f, 0.0f,   // query head 0
             0.0f, 0.3f, 0.9f};  // query head 1
  req.value_norm = {1.0f, 1.0f, 1.0f};
  req.budget.window_full = 1;
  req.budget.full_bytes = 1;
  DefensiveKVOptions o;
  o.window = 1;
  o.kernel = 1;  // no pooling: the aggregation alone
  o.mass = 0.0;  // no stage-1 tokens
  DefensiveKVPolicy pol(o, 0);
  RoutingPlan plan;
  pol.plan(req, &plan);
  // Max: 0.9, 0.3, 0.9 → candidate 0 (older of the tie). Mean would give 0.45, 0.3, 0.45.
  EXPECT_EQ(obs_family::kept_of(req, plan, 0), (std::set<int32_t>{0}));
  req.obs = {0.5f, 0.45f, 0.0f, 0.0f, 0.45f, 0.5f};  // mean: 1 wins (0.45 > 0.25); max: 0
  pol.plan(req, &plan);
  EXPECT_EQ(obs_family::kept_of(req, plan, 0), (std::set<int32_t>{0}));
}

TEST(DefensiveKVCache, MatchesBruteForceModelAndHoldsTheBudget) {
  const KvShape s = obs_family::small_shape(3, 4, 2, 8);
  const int recent = 4, w = 8;
  std::mt19937 wo_rng(8);
  const test::RandomWo wo(s, 10, wo_rng, 3);
  for (const bool over_layers : {false, true}) {
    SCOPED_TRACE(over_layers ? "layer-defensivekv" : "defensivekv");
    KvCacheParams p =
        obs_family::family_params(over_layers ? "layer-defensivekv" : "defensivekv", 16, recent, 4);
    obs_family::DriveOptions o;
    o.calls = {33, 33};
    o.n_prompt = 66;
    o.calls.insert(o.calls.end(), 30, 1);
    o.seed = 19;
    o.wo = &wo.proj;
    o.wo_f64 = wo.f64;
    o.n_embd = 10;
    o.budget_over_layers = over_layers;
    o.obs_max_kernel = 5;
    DefensiveKVOptions dopt;
    dopt.window = w;
    dopt.over_layers = over_layers;
    obs_family::Driver drv(s, p, 200, std::make_unique<DefensiveKVPolicy>(dopt, recent));
    const auto res = drv.run_layers(o, w, [&](const std::vector<RouteInput>& ins) {
      return defensive_rule(ins, 12, w, over_layers, recent);
    });
    if (HasFailure()) return;
    EXPECT_LT(res.ambiguous_heads * 5, res.checked_heads);
    EXPECT_TRUE(res.heads_differ);
    EXPECT_GT(res.evictions, 0);
    if (over_layers) {
      const KvReport r = report_of(drv.cache());
      bool layers_differ = false;
      for (const auto& l : r.layers)
        layers_differ |= l.bytes_budgeted != r.layers[0].bytes_budgeted;
      EXPECT_TRUE(layers_differ) << "every layer kept the same bytes";
    }
  }
}

TEST(DefensiveKVPolicy, RegistryDefaultIsTheAuthorsBudget) {
  for (const char* name : {"defensivekv", "layer-defensivekv"}) {
    KvCacheParams p;
    p.policy = name;
    ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
    EXPECT_DOUBLE_EQ(p.budget_fraction, 0.2) << name;  // cr = 0.8 (evaluate.sh)
    EXPECT_EQ(p.budget_tokens, 0) << name;
    EXPECT_EQ(p.local, 32) << name;
    EXPECT_TRUE(p.validate().is_ok()) << name;
  }
}

}  // namespace
}  // namespace qevict
