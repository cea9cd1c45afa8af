// End-to-end: the tiered cache on the real model. With a budget covering the full cache it
// gives FullKV's logits (up to the order of float sums); with a small budget it keeps
// within budget while routing really happens, and stays finite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e/real_model_fixture.h"
#include "engine/generator.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/params.h"
#include "kvcache/policies/routing_policy.h"
#include "kvcache/registry.h"
#include "model/model.h"

namespace qevict {
namespace {

class TieredModel : public RealModelTest {
 protected:
  // Prefill `prefill` tokens in chunks of 128, then one token per call; all logits.
  std::vector<float> run(SequenceKvCache& c, int64_t n, int64_t prefill) {
    const int32_t V = model_->config().n_vocab;
    std::vector<float> logits(size_t(n) * V);
    for (int64_t i = 0; i < n;) {
      const int64_t step = i < prefill ? std::min<int64_t>(128, prefill - i) : 1;
      std::vector<BatchSegment> segs{{&c, tokens_.data() + i, step, true, logits.data() + i * V}};
      EXPECT_TRUE(model_->forward(segs, pool_).is_ok());
      i += step;
    }
    return logits;
  }
};

TEST_F(TieredModel, FullBudgetGivesFullKvLogits) {
  // The claim is agreement to f32 rounding: the 8-bit decode path would turn the attention's
  // last-bit differences into flipped activation codes (logits apart by up to ~1).
  const MatmulPaths no_q8(/*amx=*/true, /*q8=*/false);
  const int64_t n = 320;
  FullKvCache full(model_->kv_shape(), n);
  KvCacheParams p;
  p.policy = "qevict";
  // 1.1, not 1.0: the local region is reserved as ceil((L+Ω-1)/ω)+1 whole windows, so at exactly
  // the full cache's bytes up to one aged window may not fit in F.
  p.budget_fraction = 1.1;
  auto tiered = make_kv_cache(model_->kv_shape(), n, p);
  ASSERT_TRUE(tiered.has_value()) << tiered.error();
  const auto a = run(full, n, 256);
  const auto b = run(**tiered, n, 256);
  const int32_t V = model_->config().n_vocab;
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    int32_t ia = 0, ib = 0;
    for (int32_t v = 0; v < V; ++v) {
      worst = std::max(worst, double(std::fabs(a[t * V + v] - b[t * V + v])));
      if (a[t * V + v] > a[t * V + ia]) ia = v;
      if (b[t * V + v] > b[t * V + ib]) ib = v;
    }
    EXPECT_EQ(ia, ib) << "position " << t;
  }
  // Identical keys/values; only float summation order differs (8-token blocks vs pages).
  // Measured: 3.3e-2 at worst over 320 positions, mean KL ~6e-7 -- the same size as FullKV's own
  // distance to a float64 forward pass (1e-6), i.e. float noise amplified through 30 layers.
  EXPECT_LT(worst, 0.1) << "largest logit difference";
  std::printf("budget 1.1 vs FullKV: largest logit difference %.2e over %lld positions\n", worst,
              (long long)n);
  KvReport r;
  (*tiered)->report(&r);
  EXPECT_EQ(r.layers[0].evictions, 0);
}

TEST_F(TieredModel, SmallBudgetRoutesAndStaysWithinBudget) {
  const int64_t n = 600;
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  auto c = make_kv_cache(model_->kv_shape(), n, p);
  ASSERT_TRUE(c.has_value()) << c.error();
  const auto logits = run(**c, n, 384);
  for (float z : logits) ASSERT_TRUE(std::isfinite(z));
  KvReport s;
  (*c)->report(&s);
  for (int l = 0; l < model_->config().n_layers; ++l)
    EXPECT_LE(s.layers[l].bytes_budgeted, s.budget.total);
  EXPECT_GT(s.layers[0].windows_quant, 0);
  EXPECT_GT(s.layers[0].windows_evicted, 0);
  EXPECT_GT(s.routing_events, 20);
}

// --prefill-route end on the real model through the generation loop: the 640-token prompt
// is held in full (the peak shows it), compressed once when it is in, and from then on the
// cache holds ≤ budget while decode goes on routing (SPEC §3–4).
TEST_F(TieredModel, PrefillRouteEndHoldsThePromptThenTheBudget) {
  for (int window : {0, 32}) {
    KvCacheParams p;
    p.policy = "qevict";
    p.budget_fraction = 0.2;
    p.prefill_route = PrefillRoute::kEnd;
    p.prefill_window = window;
    auto c = make_kv_cache(model_->kv_shape(), 680, p);
    ASSERT_TRUE(c.has_value()) << c.error();
    std::vector<GenerationRequest> reqs(1);
    reqs[0].cache = c->get();
    reqs[0].prompt.assign(tokens_.begin(), tokens_.begin() + 640);
    reqs[0].n_predict = 1;  // sampled from the prefill's logits: no decode call yet
    GenerateOptions go;
    go.prefill_chunk = 256;
    ASSERT_TRUE(generate(*model_, pool_, reqs, go, nullptr, nullptr).is_ok());
    KvReport r;
    (*c)->report(&r);
    EXPECT_EQ(r.routing_events, 1) << "window " << window;
    for (int l = 0; l < model_->config().n_layers; ++l)
      EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total) << "layer " << l;
    // The prompt was held in full: every token's K and V in 16 bits, in every layer.
    EXPECT_GE(r.peak_bytes_held, 640 * r.budget.token_bytes * r.layers.size());
    EXPECT_LT(r.bytes_held, r.peak_bytes_held);
    // Decode on: routing every Ω, within budget + the window that may age in between.
    reqs[0].prompt.assign(1, reqs[0].output[0]);
    reqs[0].n_predict = 24;
    ASSERT_TRUE(generate(*model_, pool_, reqs, go, nullptr, nullptr).is_ok());
    (*c)->report(&r);
    EXPECT_GE(r.routing_events, 3);
    for (int l = 0; l < model_->config().n_layers; ++l)
      EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total + r.budget.window_full);
  }
}

// A policy added by a test alone (one class, one registry row) runs the real model through
// the same factory, store and attention loop as the built-in ones.
class KeepNewestFirstPolicy final : public RoutingPolicy {
 public:
  void plan(const RoutingRequest& req, RoutingPlan* plan) override {
    order_.resize(req.candidates.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = int32_t(order_.size() - 1 - i);
    fill_tiers_in_order(order_, req, plan);  // candidates come oldest first
  }
  std::string name() const override { return "test-recency"; }

 private:
  std::vector<int32_t> order_;
};

TEST_F(TieredModel, APolicyRegisteredByATestRunsTheModel) {
  PolicyInfo row;
  row.name = "test-recency";
  row.summary = "test only: newest windows first";
  row.source = "tests/e2e/tiered_model_test.cpp";
  row.kind = CacheKind::kWindowed;
  row.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
    return std::make_unique<KeepNewestFirstPolicy>();
  };
  ASSERT_TRUE(register_policy(row).is_ok());
  KvCacheParams p;
  p.policy = "test-recency";
  p.budget_fraction = 0.25;
  const int64_t n = 300;
  auto c = make_kv_cache(model_->kv_shape(), n, p);
  ASSERT_TRUE(c.has_value()) << c.error();
  const auto logits = run(**c, n, 256);
  for (float z : logits) ASSERT_TRUE(std::isfinite(z));
  KvReport r;
  (*c)->report(&r);
  EXPECT_NE(r.describe.find("test-recency"), std::string::npos) << r.describe;
  EXPECT_GT(r.layers[0].windows_quant, 0);
  EXPECT_GT(r.layers[0].windows_evicted, 0);
  for (int l = 0; l < model_->config().n_layers; ++l)
    EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total + r.budget.window_full);
}

// Shared prefill through generate(): FullKV and qevict/H2O with --prefill-route end replay
// one FullKV prefill and generate what each generates from its own prefill. FullKV replays
// bit-identically; the tiered cache's own prefill rounds differently (8-token blocks vs
// pages), so its greedy tokens are compared, over a routed decode.
TEST_F(TieredModel, SharedPrefillGeneratesWhatOwnPrefillDoes) {
  // Exact paths: the own prefill batches three prompts (3 x 44 tokens in the last chunk, past
  // the 32-token AMX threshold) where the shared one feeds one (44), and the matmul paths
  // round differently on each side of it (flipped H2O's last greedy token).
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  const std::vector<int32_t> prompt(tokens_.begin(), tokens_.begin() + 300);
  const int n_predict = 24;
  auto make = [&](const std::string& policy, double budget) {
    KvCacheParams p;
    p.policy = policy;
    p.budget_fraction = budget;
    p.prefill_route = PrefillRoute::kEnd;
    auto c = make_kv_cache(model_->kv_shape(), 300 + n_predict, p);
    EXPECT_TRUE(c.has_value()) << c.error();
    return std::move(*c);
  };
  const std::vector<std::pair<std::string, double>> variants = {
      {"full", 0.0}, {"qevict", 0.2}, {"h2o", 0.2}};
  std::vector<std::unique_ptr<SequenceKvCache>> own, shared;
  auto requests = [&](std::vector<std::unique_ptr<SequenceKvCache>>& caches, bool share) {
    std::vector<GenerationRequest> reqs;
    for (size_t i = 0; i < variants.size(); ++i) {
      caches.push_back(make(variants[i].first, variants[i].second));
      GenerationRequest r;
      r.cache = caches.back().get();
      r.prompt = prompt;
      r.n_predict = n_predict;
      r.sampling.temperature = 0.0f;
      r.share_prefill_of = share && i > 0 ? 0 : -1;
      reqs.push_back(std::move(r));
    }
    return reqs;
  };
  auto a = requests(own, false), b = requests(shared, true);
  GenerationStats sa, sb;
  GenerateOptions go;
  go.prefill_chunk = 128;
  ASSERT_TRUE(generate(*model_, pool_, a, go, nullptr, &sa).is_ok());
  ASSERT_TRUE(generate(*model_, pool_, b, go, nullptr, &sb).is_ok());
  EXPECT_EQ(sa.n_prompt, 900);
  EXPECT_EQ(sb.n_prompt, 300);
  EXPECT_EQ(sb.n_prompt_shared, 600);
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_EQ(b[i].output, a[i].output) << variants[i].first;
    KvReport r;
    shared[i]->report(&r);
    if (i > 0) {
      EXPECT_GT(r.routing_events, 0) << variants[i].first;
    }
  }
}

// Replaying a shared prefill into many caches holds at most GenerateOptions::replay_group
// whole prompts at once: each group ends its prompt (compresses) before the next is
// replayed. With a group of 2, six qevict sharers peak at the source + 2 whole prompts + 4
// compressed caches; with a group of 6, at the source + 6 whole prompts. The outputs do not
// depend on the grouping.
TEST_F(TieredModel, SharedPrefillHoldsAtMostAReplayGroupOfWholePrompts) {
  const std::vector<int32_t> prompt(tokens_.begin(), tokens_.begin() + 400);
  constexpr int kSharers = 6;
  auto make = [&](const std::string& policy) {
    KvCacheParams p;
    p.policy = policy;
    p.budget_fraction = policy == "full" ? 0.0 : 0.2;
    p.prefill_route = PrefillRoute::kEnd;
    auto c = make_kv_cache(model_->kv_shape(), 400 + 4, p);
    EXPECT_TRUE(c.has_value()) << c.error();
    return std::move(*c);
  };
  struct Run {
    std::vector<std::unique_ptr<SequenceKvCache>> caches;
    std::vector<GenerationRequest> reqs;
    GenerationStats st;
  };
  auto run = [&](int n_sharers, int group, int n_predict) {
    Run x;
    for (int i = 0; i <= n_sharers; ++i) {
      x.caches.push_back(make(i == 0 ? "full" : "qevict"));
      GenerationRequest r;
      r.cache = x.caches.back().get();
      r.prompt = prompt;
      r.n_predict = n_predict;
      r.sampling.temperature = 0.0f;
      r.share_prefill_of = i > 0 ? 0 : -1;
      x.reqs.push_back(std::move(r));
    }
    GenerateOptions go;
    go.prefill_chunk = 128;
    go.replay_group = group;
    EXPECT_TRUE(generate(*model_, pool_, x.reqs, go, nullptr, &x.st).is_ok());
    return x;
  };
  // The source alone, and one cache holding the whole prompt: the peak of a lone qevict
  // cache's own prefill, sampled before it ends its prompt.
  const size_t source = run(0, 1, 0).st.peak_prompt_bytes;
  Run lone;
  lone.caches.push_back(make("qevict"));
  GenerationRequest r;
  r.cache = lone.caches.back().get();
  r.prompt = prompt;
  r.n_predict = 0;
  lone.reqs.push_back(r);
  ASSERT_TRUE(generate(*model_, pool_, lone.reqs, GenerateOptions(), nullptr, &lone.st).is_ok());
  const size_t whole = lone.st.peak_prompt_bytes, compressed = lone.caches[0]->bytes_held();
  ASSERT_GT(whole, 2 * compressed);

  Run two = run(kSharers, 2, 4), all = run(kSharers, kSharers, 4);
  EXPECT_EQ(two.st.n_prompt_shared, kSharers * 400);
  EXPECT_LE(two.st.peak_prompt_bytes,
            size_t(1.05 * double(source + 2 * whole + (kSharers - 2) * compressed)));
  EXPECT_GE(all.st.peak_prompt_bytes, size_t(0.95 * double(source + kSharers * whole)));
  for (int i = 0; i <= kSharers; ++i) EXPECT_EQ(two.reqs[i].output, all.reqs[i].output) << i;
}

}  // namespace
}  // namespace qevict
