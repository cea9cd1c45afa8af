// CriticalKV and CriticalAdaKV: the policies against brute-force transcriptions of kvpress's
// two-stage rules on random requests, and the cache running them (value norms through a
// bound W_O) against the independent model of obs_family.h.
#include "kvcache/policies/criticalkv_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/random_wo.h"
#include "kvcache/obs_family.h"

namespace qevict {
namespace {

using obs_family::RouteInput;
using obs_family::RuleOutput;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Ranks of head h's candidates by (score desc, position asc).
std::vector<int> ranked(const std::vector<double>& s, const std::vector<int32_t>& pos) {
  std::vector<int> idx;
  obs_family::rank_desc(s, pos, &idx, 0);
  return idx;
}

bool near(double a, double b) {
  if (std::isinf(a) || std::isinf(b) || a == b) return false;
  return std::fabs(a - b) <= 1e-4 * std::max(std::fabs(a), std::fabs(b)) + 1e-12;
}

// kvpress's rules, transcribed with R always-kept tokens per head (the window) counted in
// K; B history tokens per head on average; SnapKV avgpool k = 5 as the base scores.
RuleOutput critical_rule(const RouteInput& in, int64_t B, int R, bool adaptive) {
  const int H = int(in.cand.size());
  int64_t n_all = 0;
  for (const auto& c : in.cand) n_all += int64_t(c.size());
  B = std::min(B, n_all);
  auto share = [&](double ratio, int64_t k) {
    return std::clamp<int64_t>(int64_t(ratio * double(k + R)) - R, 0, k);
  };
  std::vector<std::vector<double>> s(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) s[size_t(h)] = obs_family::snap_scores_ref(in, h, 5, false);
  RuleOutput out;
  out.ambiguous.assign(size_t(H), false);
  // Forces the top n of head h to +inf; flags a near tie at the boundary.
  auto force = [&](int h, int64_t n) {
    auto& v = s[size_t(h)];
    const std::vector<int> idx = ranked(v, in.cand[size_t(h)]);
    n = std::min<int64_t>(n, int64_t(v.size()));
    if (n > 0 && n < int64_t(v.size()) &&
        near(v[size_t(idx[size_t(n - 1)])], v[size_t(idx[size_t(n)])]))
      out.ambiguous[size_t(h)] = true;
    for (int64_t r = 0; r < n; ++r) v[size_t(idx[size_t(r)])] = kInf;
  };
  std::vector<int64_t> budget(size_t(H), B);
  if (adaptive) {
    for (int h = 0; h < H; ++h) force(h, share(0.2, B));
    // Global top H·B by (score desc, head asc, position asc): selection sort.
    std::vector<std::pair<int, int>> all;  // (head, index)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < int(s[size_t(h)].size()); ++i) all.push_back({h, i});
    auto before = [&](std::pair<int, int> a, std::pair<int, int> b) {
      const double x = s[size_t(a.first)][size_t(a.second)],
                   y = s[size_t(b.first)][size_t(b.second)];
      if (x != y) return x > y;
      if (a.first != b.first) return a.first < b.first;
      return a.second < b.second;
    };
    for (size_t a = 0; a < all.size(); ++a)
      for (size_t b = a + 1; b < all.size(); ++b)
        if (before(all[b], all[a])) std::swap(all[a], all[b]);
    const int64_t top = std::min<int64_t>(int64_t(H) * B, int64_t(all.size()));
    std::fill(budget.begin(), budget.end(), 0);
    for (int64_t r = 0; r < top; ++r) ++budget[size_t(all[size_t(r)].first)];
    if (top > 0 && top < int64_t(all.size())) {
      const auto a = all[size_t(top - 1)], b = all[size_t(top)];
      if (a.first != b.first &&
          near(s[size_t(a.first)][size_t(a.second)], s[size_t(b.first)][size_t(b.second)]))
        std::fill(out.ambiguous.begin(), out.ambiguous.end(), true);
    }
  }
  for (int h = 0; h < H; ++h) {
    force(h, share(0.5, budget[size_t(h)]));
    std::vector<double> s2(s[size_t(h)].size());
    for (size_t i = 0; i < s2.size(); ++i)
      s2[i] = std::isinf(s[size_t(h)][i]) ? kInf : (s[size_t(h)][i] + 1e-4) * in.nu[size_t(h)][i];
    std::vector<int> idx;
    if (obs_family::rank_desc(s2, in.cand[size_t(h)], &idx, budget[size_t(h)]))
      out.ambiguous[size_t(h)] = true;
    std::set<int32_t> keep;
    for (int64_t r = 0; r < std::min<int64_t>(budget[size_t(h)], int64_t(idx.size())); ++r)
      keep.insert(in.cand[size_t(h)][size_t(idx[size_t(r)])]);
    out.keep.push_back(keep);
  }
  return out;
}

TEST(CriticalKVPolicy, MatchesBruteForceRules) {
  std::mt19937 rng(17);
  for (const bool adaptive : {false, true}) {
    int checked = 0;
    for (int trial = 0; trial < 300; ++trial) {
      const int H = 1 + int(rng() % 3), g = 1 + int(rng() % 3), n_obs = 1 + int(rng() % 4);
      const int64_t quota = int64_t(rng() % 30);
      const int R = int(rng() % 12);
      const RoutingRequest req = obs_family::random_request(rng, H, g, n_obs, quota, false);
      CriticalKVOptions o;
      o.adaptive = adaptive;
      CriticalKVPolicy pol(o, R);
      EXPECT_EQ(pol.name(), adaptive ? "criticaladakv" : "criticalkv");
      RoutingPlan plan;
      pol.plan(req, &plan);
      ASSERT_TRUE(check_plan(req, plan).is_ok()) << check_plan(req, plan).message();
      const RuleOutput want = critical_rule(obs_family::as_input(req), quota, R, adaptive);
      for (int h = 0; h < H; ++h) {
        if (want.ambiguous[size_t(h)]) continue;
        ++checked;
        ASSERT_EQ(obs_family::kept_of(req, plan, h), want.keep[size_t(h)])
            << (adaptive ? "criticaladakv" : "criticalkv") << " trial " << trial << " head " << h
            << " quota " << quota << " R " << R;
      }
    }
    EXPECT_GT(checked, 400);
  }
}

// Stage 2 matters: a token with a low attention score but a large value norm beats one with
// a higher score and a tiny norm, unless stage 1 forced the latter.
TEST(CriticalKVPolicy, ValueNormsReorderTheSecondStage) {
  RoutingRequest req;
  req.n_heads = 1;
  req.group = 1;
  req.n_obs = 1;
  for (int i = 0; i < 4; ++i)
    req.candidates.push_back({i * 10, i * 10, 0.0, Tier::kLocal, false, 0});
  req.head_begin = {0, 4};
  // Avg pooling (k = 5, padding counted) over 4 candidates gives 0.3, 0.3, 0.3, 0.14: the
  // first three tie exactly and rank by position, 0 > 1 > 2 > 3.
  req.obs = {0.8f, 0.6f, 0.1f, 0.0f};
  req.value_norm = {1.0f, 0.01f, 100.0f, 0.5f};
  req.budget.window_full = 1;
  req.budget.full_bytes = 2;  // K = 2 history tokens
  // R = 0: stage 1 forces ⌊0.5·2⌋ = 1 token (candidate 0); stage 2: (s + ε)·ν picks 2.
  CriticalKVPolicy pol({}, 0);
  RoutingPlan plan;
  pol.plan(req, &plan);
  EXPECT_EQ(obs_family::kept_of(req, plan, 0), (std::set<int32_t>{0, 20}));
  // R = 2: K counts the 2 always-kept tokens, stage 1 gets ⌊0.5·4⌋ − 2 = 0: by (s + ε)·ν,
  // 20 then 0 ((0.3 + ε)·100, (0.3 + ε)·1, then 0.14·0.5 and 0.3·0.01).
  CriticalKVPolicy pol2({}, 2);
  pol2.plan(req, &plan);
  EXPECT_EQ(obs_family::kept_of(req, plan, 0), (std::set<int32_t>{0, 20}));
  req.value_norm = {0.01f, 1.0f, 100.0f, 0.5f};
  pol2.plan(req, &plan);
  EXPECT_EQ(obs_family::kept_of(req, plan, 0), (std::set<int32_t>{10, 20}));
  pol.plan(req, &plan);  // R = 0: candidate 0 is forced by stage 1
  EXPECT_EQ(obs_family::kept_of(req, plan, 0), (std::set<int32_t>{0, 20}));
}

TEST(CriticalKVCache, MatchesBruteForceModelAndHoldsTheBudget) {
  const KvShape s = obs_family::small_shape(2, 4, 2, 8);
  const int recent = 4;
  std::mt19937 wo_rng(5);
  const test::RandomWo wo(s, 12, wo_rng, 5);
  for (const bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "criticaladakv" : "criticalkv");
    KvCacheParams p =
        obs_family::family_params(adaptive ? "criticaladakv" : "criticalkv", 18, recent, 4);
    obs_family::DriveOptions o;
    o.calls = {35, 31};
    o.n_prompt = 66;
    o.calls.insert(o.calls.end(), 30, 1);
    o.seed = 13;
    o.wo = &wo.proj;
    o.wo_f64 = wo.f64;
    o.n_embd = 12;
    CriticalKVOptions co;
    co.snap = {8, 5, ObsPool::kAvg};
    co.adaptive = adaptive;
    obs_family::Driver drv(s, p, 200, std::make_unique<CriticalKVPolicy>(co, recent));
    const auto res = drv.run(
        o, 8, [&](const RouteInput& in) { return critical_rule(in, 14, recent, adaptive); });
    if (HasFailure()) return;
    EXPECT_LT(res.ambiguous_heads * 10, res.checked_heads);
    EXPECT_GT(res.evictions, 0);
    if (adaptive) {
      EXPECT_TRUE(res.heads_differ);
    }
  }
}

TEST(CriticalKVCache, RoutingWithoutOutputProjectionIsAnError) {
  const KvShape s = obs_family::small_shape(1, 2, 1, 8);
  KvCacheParams p = obs_family::family_params("criticalkv", 10, 2, 4, "chunk");
  auto c = HeadKvCacheTestPeer::make(s, 100, p);
  ThreadPool pool(1);
  std::vector<float> q(size_t(30) * s.q_width(), 0.5f), k(size_t(30) * s.kv_width(), 0.25f),
      v(k.size(), 1.0f), out(q.size());
  ASSERT_TRUE(c->begin(30).is_ok());
  c->attend(0, q.data(), k.data(), v.data(), out.data(), pool);
  const Status st = c->commit();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("output projection"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace qevict
