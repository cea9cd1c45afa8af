// A budget fraction never refuses an ordinary request (issue 50 item 3): for a context smaller
// than a policy's fixed regions (sink + local windows, or sink + recent + the Ω decode tokens
// per head), the fraction's bytes are floored at the smallest budget that makes a valid cache,
// for every budgeted row of the registry; the cache then runs a prompt and its decode steps
// within that floored budget. A budget in bytes stays exact and is refused; a long context is
// not floored (its budget is the fraction's bytes, as before).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/kv_shape.h"
#include "common/random_wo.h"
#include "kvcache/budget.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

// Two layers, GQA group 2, head_dim 64 (SmolLM2's head size).
KvShape floor_shape() { return test::rope_shape(2, 4, 2, 64); }

// The budgeted rows: their names.
std::vector<std::string> budgeted_policies() {
  std::vector<std::string> out;
  for (const auto& r : policy_registry())
    if (r.kind == CacheKind::kWindowed || r.kind == CacheKind::kPerHead) out.push_back(r.name);
  return out;
}

KvCacheParams params_of(const std::string& policy, double fraction, int64_t bytes = 0) {
  KvCacheParams p;
  p.policy = policy;
  p.budget_fraction = fraction;
  p.budget_bytes = bytes;
  EXPECT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok()) << policy;
  return p;
}

// Tokens a cache needs before any history fits: windowed, the sink and the local windows;
// per-head, sink + recent + the decode tokens between routings + one heavy token.
int64_t fixed_tokens(const KvBudget& b, const KvCacheParams& p) {
  if (b.kind == CacheKind::kWindowed) return b.sink + b.local_windows * b.window;
  return b.sink + b.local + std::max(p.route_every, 1) + 1;
}

// One call of n tokens through every layer, random q/k/v.
void call(SequenceKvCache& c, const KvShape& s, int64_t n, std::mt19937& rng, ThreadPool& pool,
          const OutputProjection& wo) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  ASSERT_TRUE(c.begin(n).is_ok());
  c.set_output_projection(&wo);
  std::vector<float> q(size_t(n) * s.q_width()), k(size_t(n) * s.kv_width()), v(k.size()),
      o(q.size());
  for (int l = 0; l < s.n_layers; ++l) {
    for (auto& x : q) x = 2.0f * d(rng);
    for (auto& x : k) x = 2.0f * d(rng);
    for (auto& x : v) x = d(rng);
    c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
  }
  ASSERT_TRUE(c.commit().is_ok());
}

// What counts against the budget, worst layer, is within it.
void expect_within_budget(const SequenceKvCache& c, const std::string& where) {
  const KvReport r = report_of(c);
  EXPECT_LE(r.total().bytes_budgeted, r.budget.total) << where << ": " << r.describe;
}

// A prompt of n_prompt tokens (in chunks of 16), end_prompt, then n_gen decode steps: the
// budget holds after the prompt's routing and after every step (and after every prompt chunk
// when the policy routes by chunk; with --prefill-route end the prompt is held whole until
// its end, SPEC §4).
void run(SequenceKvCache& c, const KvShape& s, const KvCacheParams& p, int64_t n_prompt, int n_gen,
         ThreadPool& pool) {
  std::mt19937 rng(7);
  test::RandomWo wo(s, 32, rng);
  for (int64_t done = 0; done < n_prompt;) {
    const int64_t n = std::min<int64_t>(16, n_prompt - done);
    call(c, s, n, rng, pool, wo.proj);
    done += n;
    if (!p.defers_prompt()) expect_within_budget(c, "prompt " + std::to_string(done));
  }
  ASSERT_TRUE(c.end_prompt().is_ok());
  expect_within_budget(c, "end of prompt");
  for (int i = 0; i < n_gen; ++i) {
    call(c, s, 1, rng, pool, wo.proj);
    expect_within_budget(c, "decode step " + std::to_string(i));
  }
  EXPECT_EQ(c.n_past(), n_prompt + n_gen);
}

// A one-line prompt (10 tokens + 16 generated) at 20 % and 90 %: a cache is made, runs, and
// its budget is floored wherever the context is below the policy's fixed regions.
TEST(BudgetFloor, ShortContextMakesACacheForEveryBudgetedPolicy) {
  const KvShape s = floor_shape();
  ThreadPool pool(2);
  const int64_t n_prompt = 10;
  const int n_gen = 16;
  const int64_t n_ctx = n_prompt + n_gen;
  for (const std::string& name : budgeted_policies()) {
    for (double fraction : {0.2, 0.9, 0.01}) {
      SCOPED_TRACE(name + " @ " + std::to_string(fraction));
      const KvCacheParams p = params_of(name, fraction);
      auto made = make_kv_cache(s, n_ctx, p);
      ASSERT_TRUE(made.has_value()) << made.error();
      // The server admits it too (its reservation uses the same budget).
      EXPECT_TRUE(max_cache_bytes(s, n_prompt, n_gen, p, 512).has_value());
      const KvBudget b = report_of(**made).budget;
      EXPECT_EQ(b.requested,
                size_t(std::floor(fraction * double(n_ctx) * double(s.token_bytes()))));
      // Below one token per layer (1 %) nothing fits: floored whatever the policy.
      if (n_ctx < fixed_tokens(b, p) || fraction < 0.05) {
        EXPECT_TRUE(b.floored) << b.describe();
      }
      EXPECT_EQ(b.floored, b.total > b.requested) << b.describe();
      if (b.floored) {
        EXPECT_NE(b.describe().find("budget floored at " + std::to_string(b.total)),
                  std::string::npos)
            << b.describe();
        EXPECT_NE((*made)->describe().find("floored"), std::string::npos) << (*made)->describe();
      }
      run(**made, s, p, n_prompt, n_gen, pool);
    }
  }
}

// A prompt longer than the fixed regions with a fraction below them: the floored cache routes
// (evicts or quantizes history) and stays within its floored budget.
TEST(BudgetFloor, FlooredCacheRoutesWithinItsBudget) {
  const KvShape s = floor_shape();
  ThreadPool pool(2);
  const int64_t n_prompt = 120;
  const int n_gen = 40;
  for (const std::string& name : budgeted_policies()) {
    SCOPED_TRACE(name);
    const KvCacheParams p = params_of(name, 0.01);
    auto made = make_kv_cache(s, n_prompt + n_gen, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    EXPECT_TRUE(report_of(**made).budget.floored);
    run(**made, s, p, n_prompt, n_gen, pool);
    const KvReport r = report_of(**made);
    EXPECT_GT(r.routing_events, 0) << r.describe;
    const KvLayerReport t = r.total();
    EXPECT_GT(t.evictions + t.quantizations + t.windows_quant, 0) << r.describe;
  }
}

// The floored budget is the smallest valid one: the same bytes given exactly make the same
// cache; one byte less leaves a per-head cache no heavy token (refused) and a windowed cache
// no window of history (K_f = K_q = 0, which a budget in bytes may still ask for).
TEST(BudgetFloor, FlooredTotalIsTheSmallestValidBudget) {
  const KvShape s = floor_shape();
  for (const std::string& name : budgeted_policies()) {
    SCOPED_TRACE(name);
    const KvCacheParams p = params_of(name, 0.01);
    auto made = make_kv_cache(s, 26, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    const KvBudget floored = report_of(**made).budget;
    const size_t least = floored.total;
    auto exact = make_kv_cache(s, 26, params_of(name, 0.0, int64_t(least)));
    ASSERT_TRUE(exact.has_value()) << exact.error();
    const KvBudget b = report_of(**exact).budget;
    EXPECT_FALSE(b.floored);
    EXPECT_EQ(b.total, least);
    EXPECT_EQ(b.capacity_full, floored.capacity_full);
    EXPECT_EQ(b.capacity_quant, floored.capacity_quant);
    EXPECT_EQ(b.head_capacity, floored.head_capacity);
    EXPECT_EQ(b.head_heavy, floored.head_heavy);
    auto less = make_kv_cache(s, 26, params_of(name, 0.0, int64_t(least) - 1));
    if (b.kind == CacheKind::kWindowed) {
      EXPECT_GE(b.capacity_full + b.capacity_quant, 1);
      ASSERT_TRUE(less.has_value()) << less.error();
      const KvBudget l = report_of(**less).budget;
      EXPECT_EQ(l.capacity_full + l.capacity_quant, 0) << l.describe();
    } else {
      EXPECT_EQ(b.head_heavy, 1);
      ASSERT_FALSE(less.has_value()) << report_of(**less).budget.describe();
      EXPECT_NE(less.error().find("budget too small"), std::string::npos) << less.error();
    }
  }
}

// A budget in bytes is exact: one token's bytes per layer is refused with a clear message,
// for every policy.
TEST(BudgetFloor, BudgetInBytesBelowTheFixedRegionsIsRefused) {
  const KvShape s = floor_shape();
  for (const std::string& name : budgeted_policies()) {
    SCOPED_TRACE(name);
    auto made = make_kv_cache(s, 26, params_of(name, 0.0, int64_t(s.token_bytes())));
    ASSERT_FALSE(made.has_value());
    EXPECT_NE(made.error().find("--kv-budget-bytes"), std::string::npos) << made.error();
  }
}

// A long context at 20 % is not floored: the budget is the fraction's bytes, as before.
TEST(BudgetFloor, LongContextIsNotFloored) {
  const KvShape s = floor_shape();
  const int64_t n_ctx = 4096;
  for (const std::string& name : budgeted_policies()) {
    SCOPED_TRACE(name);
    const KvCacheParams p = params_of(name, 0.2);
    auto made = make_kv_cache(s, n_ctx, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    const KvBudget b = report_of(**made).budget;
    EXPECT_FALSE(b.floored);
    EXPECT_EQ(b.total, size_t(std::floor(0.2 * double(n_ctx) * double(s.token_bytes()))));
    EXPECT_EQ(b.total, b.requested);
    EXPECT_EQ(b.floor_note(), "");
    EXPECT_EQ(b.describe().find("floored"), std::string::npos) << b.describe();
  }
}

}  // namespace
}  // namespace qevict
