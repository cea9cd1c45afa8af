// SnapKV: the policy against a brute-force model of its rule on random requests, and the
// per-head cache running it against an independent model (obs_family.h): kept sets at every
// routing event, attention over kept tokens only, finite outputs, budget after every call.
#include "kvcache/policies/snapkv_policy.h"

#include <gtest/gtest.h>

#include <random>

#include "common/kv_names.h"
#include "kvcache/obs_family.h"

namespace qevict {
namespace {

using obs_family::as_input;
using obs_family::kept_of;
using obs_family::random_request;
using obs_family::RouteInput;
using obs_family::RuleOutput;

// SnapKV's rule, brute force: per head, the top `quota` candidates by the pooled score.
RuleOutput snapkv_rule(const RouteInput& in, int64_t quota, int k, bool max_pool) {
  RuleOutput out;
  for (size_t h = 0; h < in.cand.size(); ++h) {
    const std::vector<double> s = obs_family::snap_scores_ref(in, int(h), k, max_pool);
    std::vector<int> idx;
    out.ambiguous.push_back(obs_family::rank_desc(s, in.cand[h], &idx, quota));
    std::set<int32_t> keep;
    for (int64_t r = 0; r < std::min<int64_t>(quota, int64_t(idx.size())); ++r)
      keep.insert(in.cand[h][size_t(idx[size_t(r)])]);
    out.keep.push_back(keep);
  }
  return out;
}

TEST(SnapKVPolicy, MatchesBruteForceRule) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    // Ties: one query of one query head and scores of quarters, so both implementations'
    // sums are exact and only the tie-breaking (older first) decides.
    const bool max_pool = trial % 2, ties = trial % 5 == 0;
    const int H = 1 + int(rng() % 3), g = ties ? 1 : 1 + int(rng() % 3);
    const int n_obs = ties ? 1 : 1 + int(rng() % 5);
    const int64_t quota = trial % 7 == 0 ? 0 : int64_t(rng() % 30);
    const int k = max_pool ? 7 : 5;
    const RoutingRequest req = random_request(rng, H, g, n_obs, quota, ties);
    SnapKVPolicy pol({32, k, max_pool ? ObsPool::kMax : ObsPool::kAvg});
    RoutingPlan plan;
    pol.plan(req, &plan);
    ASSERT_TRUE(check_plan(req, plan).is_ok()) << check_plan(req, plan).message();
    const RuleOutput want = snapkv_rule(as_input(req), quota, k, max_pool);
    for (int h = 0; h < H; ++h) {
      if (want.ambiguous[size_t(h)]) continue;
      ASSERT_EQ(kept_of(req, plan, h), want.keep[size_t(h)]) << "trial " << trial << " head " << h;
    }
  }
}

TEST(SnapKVPolicy, PoolsAlongTheKeyAxis) {
  // One head, one query head, one query: a single spike at candidate 5. Avg pooling k = 5
  // spreads it to 3..7 (each 1/5), max pooling k = 7 to 2..8; the rest score 0 and lose the
  // (score, older first) order to them.
  RoutingRequest req;
  req.n_heads = 1;
  req.group = 1;
  req.n_obs = 1;
  for (int i = 0; i < 12; ++i) req.candidates.push_back({i, i, 0.0, Tier::kLocal, false, 0});
  req.head_begin = {0, 12};
  req.obs.assign(12, 0.0f);
  req.obs[5] = 1.0f;
  req.budget.window_full = 10;
  req.budget.full_bytes = 50;  // 5 tokens
  RoutingPlan plan;
  SnapKVPolicy avg({32, 5, ObsPool::kAvg});
  avg.plan(req, &plan);
  EXPECT_EQ(kept_of(req, plan, 0), (std::set<int32_t>{3, 4, 5, 6, 7}));
  req.budget.full_bytes = 70;  // 7 tokens
  SnapKVPolicy mx({32, 7, ObsPool::kMax});
  mx.plan(req, &plan);
  EXPECT_EQ(kept_of(req, plan, 0), (std::set<int32_t>{2, 3, 4, 5, 6, 7, 8}));
}

TEST(SnapKVPolicy, RegistryDefaultsAreTheAuthors) {
  KvCacheParams p;
  p.policy = "snapkv";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_EQ(p.budget_tokens, 2048);  // max_capacity_prompt of init_snapkv
  EXPECT_EQ(p.local, 32);            // the observation window's tokens stay
  EXPECT_EQ(p.sink, 0);
  EXPECT_EQ(p.route_every, 32);
  EXPECT_STREQ(to_string(p.prefill_route), "end");
  EXPECT_TRUE(p.validate().is_ok());
  const KvShape s = obs_family::small_shape();
  auto b = compute_budget(CacheKind::kPerHead, s, 10000, p);
  ASSERT_TRUE(b.has_value()) << b.error();
  EXPECT_EQ(b->head_capacity, 2048);
  EXPECT_EQ(b->head_heavy, 2048 - 32);
  // A budget given wins over the default capacity.
  KvCacheParams q;
  q.policy = "snapkv";
  q.budget_fraction = 0.2;
  ASSERT_TRUE(apply_policy_defaults(&q, KvParamsGiven{}).is_ok());
  EXPECT_EQ(q.budget_tokens, 0);
  KvParamsGiven window;
  window.window = true;
  EXPECT_FALSE(apply_policy_defaults(&q, window).is_ok());
}

// The cache: prompt in chunks (routed once at its end, the default), then decode with the
// rule re-applied every Ω steps. Budget: 20 tokens per head = 8 recent + 12 history.
TEST(SnapKVCache, MatchesBruteForceModelAndHoldsTheBudget) {
  const KvShape s = obs_family::small_shape();
  for (const std::string route : {"end", "chunk"}) {
    SCOPED_TRACE("prefill-route " + route);
    const int w = 8;
    KvCacheParams p = obs_family::family_params("snapkv", 20, w, 5, route);
    // The observation window in these tests: w = 8 (the policy's default is 32; the rule is
    // the same), so the cache runs a policy made here rather than the registry's.
    obs_family::DriveOptions o;
    o.calls = {30, 25, 11};
    o.n_prompt = 66;
    o.calls.insert(o.calls.end(), 40, 1);
    o.seed = 7;
    const int64_t n_ctx = 200;
    obs_family::Driver drv(s, p, n_ctx,
                           std::make_unique<SnapKVPolicy>(SnapKVOptions{w, 5, ObsPool::kAvg}));
    const int64_t quota = 12;
    const auto res =
        drv.run(o, w, [&](const RouteInput& in) { return snapkv_rule(in, quota, 5, false); });
    if (HasFailure()) return;
    EXPECT_GE(res.routing_events, route == "end" ? 1 + 40 / 5 : 3 + 40 / 5);
    EXPECT_LT(res.ambiguous_heads * 10, res.checked_heads);
    EXPECT_TRUE(res.sets_differ) << "KV heads never kept different tokens";
    EXPECT_GT(res.evictions, 0);
  }
}

}  // namespace
}  // namespace qevict
