// The policy registry and what a new policy needs: one policy class, one registry row, its
// tests. A toy policy ("keep the oldest windows") is registered here, in the test only, and
// runs through the factory, the store and the attention loop like the built-in ones; a
// policy whose plan breaks the budget is refused by the store before anything changes.
#include "kvcache/registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/kv_shape.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"

namespace qevict {
namespace {

// The toy rule: the oldest candidates take F while it fits, the next oldest Q, the rest E.
class KeepOldestPolicy final : public RoutingPolicy {
 public:
  void plan(const RoutingRequest& req, RoutingPlan* plan) override {
    order_.resize(req.candidates.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = int32_t(i);
    std::sort(order_.begin(), order_.end(),
              [&](int32_t a, int32_t b) { return req.candidates[a].id < req.candidates[b].id; });
    fill_tiers_in_order(order_, req, plan);
  }
  std::string name() const override { return "oldest"; }

 private:
  std::vector<int32_t> order_;
};

// A broken rule: keeps every candidate in F whatever the budget.
class KeepEverythingPolicy final : public RoutingPolicy {
 public:
  void plan(const RoutingRequest& req, RoutingPlan* plan) override {
    plan->reset(req);
    for (size_t i = 0; i < req.candidates.size(); ++i) plan->set(i, Tier::kFull);
  }
  std::string name() const override { return "greedy"; }
};

void register_toys() {
  static bool done = false;
  if (done) return;
  done = true;
  PolicyInfo oldest;
  oldest.name = "oldest";
  oldest.summary = "test only: keep the oldest windows";
  oldest.source = "tests/kvcache/registry_test.cpp";
  oldest.kind = CacheKind::kWindowed;
  oldest.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
    return std::make_unique<KeepOldestPolicy>();
  };
  ASSERT_TRUE(register_policy(oldest).is_ok());
  PolicyInfo greedy = oldest;
  greedy.name = "greedy";
  greedy.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
    return std::make_unique<KeepEverythingPolicy>();
  };
  ASSERT_TRUE(register_policy(greedy).is_ok());
}

KvShape shape() { return test::rope_shape(2, 4, 2, 16); }

// One forward call of n random tokens through every layer.
Status step(SequenceKvCache& c, const KvShape& s, int64_t n, ThreadPool& pool, std::mt19937& rng,
            std::vector<float>* last_out) {
  std::normal_distribution<float> nd;
  QEVICT_RETURN_IF_ERROR(c.begin(n));
  for (int l = 0; l < s.n_layers; ++l) {
    std::vector<float> q(size_t(n) * s.q_width()), k(size_t(n) * s.kv_width()), v(k.size()),
        o(q.size());
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
    *last_out = o;
  }
  return c.commit();
}

TEST(PolicyRegistry, BuiltInsAndLookups) {
  for (const char* name : {"full", "qevict", "streaming", "h2o"}) {
    const PolicyInfo* row = find_policy(name);
    ASSERT_NE(row, nullptr) << name;
    EXPECT_FALSE(row->summary.empty()) << name;
    EXPECT_FALSE(row->source.empty()) << name;
    EXPECT_EQ(row->kind == CacheKind::kFull, !row->make_policy) << name;
  }
  EXPECT_EQ(find_policy("lru"), nullptr);
  EXPECT_NE(policy_names(", ").find("qevict, streaming"), std::string::npos);
  PolicyInfo dup;
  dup.name = "qevict";
  dup.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> { return nullptr; };
  EXPECT_FALSE(register_policy(dup).is_ok()) << "names are unique";
  PolicyInfo incomplete;
  incomplete.name = "no-rule";
  EXPECT_FALSE(register_policy(incomplete).is_ok()) << "a budgeted policy needs a rule";
}

// A new policy: one class, one row (registered by the test), and it runs through
// make_kv_cache, the store and the attention loop: the budget holds after every routing
// event, and the kept windows are exactly the oldest ones that fit.
TEST(PolicyRegistry, ToyPolicyRunsEndToEnd) {
  register_toys();
  const KvShape s = shape();
  KvCacheParams p;
  p.policy = "oldest";
  p.budget_fraction = 0.3;
  ASSERT_TRUE(p.validate().is_ok());
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  auto made = make_kv_cache(s, 600, p);
  ASSERT_TRUE(made.has_value()) << made.error();
  SequenceKvCache& c = **made;
  EXPECT_NE(c.describe().find("oldest"), std::string::npos) << c.describe();
  ThreadPool pool(2);
  std::mt19937 rng(77);
  std::vector<float> out;
  int64_t n_past = 0;
  for (int64_t n : {int64_t(150), int64_t(90)}) {
    ASSERT_TRUE(step(c, s, n, pool, rng, &out).is_ok());
    n_past += n;
  }
  while (n_past < 600) {
    ASSERT_TRUE(step(c, s, 1, pool, rng, &out).is_ok());
    ++n_past;
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
    const KvReport r = report_of(c, ReportDetail::kTiers);
    for (int l = 0; l < s.n_layers; ++l) {
      ASSERT_LE(r.layers[l].bytes_budgeted, r.budget.total) << n_past;
      // Routed windows: F for the oldest, then Q, then E — tiers never go back in age order.
      const auto wt = r.position_tiers[size_t(l)];
      int last = 0;  // 0 F, 1 Q, 2 E
      for (int64_t pos = r.budget.sink; pos < n_past; pos += r.budget.window) {
        const Tier t = wt[size_t(pos)];
        if (t == Tier::kLocal) break;
        const int rank = t == Tier::kFull ? 0 : t == Tier::kQuant ? 1 : 2;
        ASSERT_GE(rank, last) << "layer " << l << " position " << pos << " n_past " << n_past;
        last = rank;
      }
    }
  }
  const KvReport r = report_of(c);
  EXPECT_GT(r.layers[0].windows_full, 0);
  EXPECT_GT(r.layers[0].windows_quant, 0);
  EXPECT_GT(r.layers[0].windows_evicted, 0);
  EXPECT_GT(r.routing_events, 40);
}

// The store checks every plan against the budget before it touches anything: a rule that
// keeps everything fails the commit with a clear error, and the cache is unchanged.
TEST(PolicyRegistry, StoreRefusesAPlanOverTheBudget) {
  register_toys();
  const KvShape s = shape();
  KvCacheParams p;
  p.policy = "greedy";
  p.budget_fraction = 0.3;
  auto made = make_kv_cache(s, 400, p);
  ASSERT_TRUE(made.has_value()) << made.error();
  SequenceKvCache& c = **made;
  ThreadPool pool(1);
  std::mt19937 rng(5);
  std::vector<float> out;
  ASSERT_TRUE(step(c, s, 40, pool, rng, &out).is_ok()) << "everything fits: nothing to refuse";
  const KvReport before = report_of(c, ReportDetail::kTiers);
  const Status st = step(c, s, 300, pool, rng, &out);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("over the budget"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("greedy"), std::string::npos) << st.message();
  const KvReport after = report_of(c, ReportDetail::kTiers);
  EXPECT_EQ(after.layers[0].evictions, before.layers[0].evictions);
  EXPECT_EQ(after.layers[0].demotions, 0);
}

TEST(CheckPlan, RejectsMalformedPlans) {
  RoutingRequest req;
  req.budget.window_full = 100;
  req.budget.window_quant = 30;
  req.budget.full_bytes = 200;
  req.budget.quant_bytes = 60;
  for (int i = 0; i < 4; ++i) req.candidates.push_back({int32_t(i), 5 + 8 * i, 0.0, Tier::kLocal});
  RoutingPlan plan;
  plan.reset(req);
  EXPECT_TRUE(check_plan(req, plan).is_ok()) << "all evicted";
  plan.set(0, Tier::kFull);
  plan.set(1, Tier::kFull);
  plan.set(2, Tier::kQuant);
  plan.set(3, Tier::kQuant);
  EXPECT_TRUE(check_plan(req, plan).is_ok()) << "exactly the budget";
  plan.set(3, Tier::kFull);  // F 300 + Q 30 > 260
  EXPECT_FALSE(check_plan(req, plan).is_ok());
  plan.set(3, Tier::kLocal);
  EXPECT_FALSE(check_plan(req, plan).is_ok()) << "kLocal is not a routing target";
  plan.set(3, Tier::kEvicted);
  plan.entries[2].id = 9;
  EXPECT_FALSE(check_plan(req, plan).is_ok()) << "entries answer candidates in order";
  plan.reset(req);
  plan.entries.pop_back();
  EXPECT_FALSE(check_plan(req, plan).is_ok()) << "every candidate answered";
  // F may use the bytes Q does not: three F windows (300) within F + Q (260)? No.
  plan.reset(req);
  plan.set(0, Tier::kFull);
  plan.set(1, Tier::kFull);
  EXPECT_TRUE(check_plan(req, plan).is_ok());
  req.budget.full_bytes = 150;  // 200 > 150 but 200 ≤ 150 + 60
  EXPECT_TRUE(check_plan(req, plan).is_ok());
}

}  // namespace
}  // namespace qevict
