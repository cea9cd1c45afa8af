// End-to-end: the lockstep diagnostics runner on the real model. FullKV's tokens are its own
// greedy continuation; with a budget that holds everything no variant misses any mass; with
// a small budget every number is in range and the structural facts hold (no Q tier in F+E
// variants, nothing returns to F once evicted, per-head tiers for H2O).
#include "eval/diagnose.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e/real_model_fixture.h"
#include "kvcache/full_cache.h"
#include "model/model.h"

namespace qevict {
namespace {

class Diagnose : public RealModelTest {
 protected:
  nlohmann::json run(const eval::DiagnoseOptions& o) {
    auto r = eval::run_diagnose(*model_, pool_, tokens_, o, nullptr);
    EXPECT_TRUE(r.has_value()) << r.error();
    return r.has_value() ? *r : nlohmann::json();
  }
};

TEST_F(Diagnose, GeneratedTokensAreFullKvGreedy) {
  eval::DiagnoseOptions o;
  o.prefill = 80;
  o.gen = 12;
  o.chunk = 32;
  o.budget = 0.8;
  o.variants = {"R3"};
  const auto j = run(o);
  // Independent greedy decode on a FullKV cache.
  const int32_t V = model_->config().n_vocab;
  FullKvCache c(model_->kv_shape(), o.prefill + o.gen);
  std::vector<float> z(static_cast<size_t>(V));
  std::vector<BatchSegment> s{{&c, tokens_.data(), o.prefill, false, z.data()}};
  ASSERT_TRUE(model_->forward(s, pool_).is_ok());
  std::vector<int32_t> want;
  for (int64_t t = 0; t < o.gen; ++t) {
    int32_t tok = int32_t(std::max_element(z.begin(), z.end()) - z.begin());
    want.push_back(tok);
    std::vector<BatchSegment> d{{&c, &tok, 1, false, z.data()}};
    ASSERT_TRUE(model_->forward(d, pool_).is_ok());
  }
  EXPECT_EQ(j["full"]["generated_tokens"].get<std::vector<int32_t>>(), want);
}

TEST_F(Diagnose, BudgetHoldingEverythingMissesNothing) {
  // KL ~1e-6 (f32 rounding) on the exact decode path; the 8-bit path's activation rounding
  // amplifies the same differences to ~3e-3.
  const MatmulPaths no_q8(/*amx=*/true, /*q8=*/false);
  eval::DiagnoseOptions o;
  o.prefill = 96;
  o.gen = 24;
  o.chunk = 32;
  o.budget = 1.5;
  o.variants = {"R2", "R3", "streaming", "h2o"};
  const auto j = run(o);
  for (const auto& name : o.variants) {
    const auto& v = j["variants"][name];
    SCOPED_TRACE(name);
    for (double f : v["fmm"].get<std::vector<double>>()) EXPECT_EQ(f, 0.0);
    EXPECT_EQ(v["mass_by_tier"]["evicted"].get<double>(), 0.0);
    EXPECT_EQ(v["mass_by_tier"]["quant"].get<double>(), 0.0);
    EXPECT_EQ(v["top1_agreement"].get<double>(), 1.0);
    EXPECT_LT(v["mean_kl"].get<double>(), 1e-3);
  }
}

TEST_F(Diagnose, SmallBudgetNumbersAreInRange) {
  eval::DiagnoseOptions o;
  o.prefill = 256;
  o.gen = 32;
  o.chunk = 64;
  // R4's sink + three local windows of 32 (ceil((L + Ω - 1)/ω) + 1: the local region and the
  // window that opens between two routing events) need 35 % of 288 tokens.
  o.budget = 0.4;
  const auto j = run(o);
  ASSERT_EQ(j["config"]["variants"].size(), 6u);
  for (const auto& name : o.variants) {
    const auto& v = j["variants"][name];
    SCOPED_TRACE(name);
    const auto fmm = v["fmm"].get<std::vector<double>>();
    ASSERT_EQ(fmm.size(), size_t(o.gen));
    for (double f : fmm) {
      EXPECT_GE(f, 0.0);
      EXPECT_LE(f, 1.0);
    }
    const auto& m = v["mass_by_tier"];
    const double sum = m["full"].get<double>() + m["quant"].get<double>() +
                       m["evicted"].get<double>() + m["local"].get<double>();
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_GT(m["evicted"].get<double>(), 0.0) << "a 30 % budget must evict something";
    const double churn = v["churn"]["kept"].get<double>();
    EXPECT_TRUE(churn == -1.0 || (churn >= 0.0 && churn <= 1.0));
    EXPECT_EQ(v["per_head"].get<bool>(), name == "h2o");
  }
  // F + E variants have no Q tier and nothing can return to F once it left (it was evicted).
  for (const char* name : {"R1", "R2", "streaming", "h2o"}) {
    EXPECT_EQ(j["variants"][name]["mass_by_tier"]["quant"].get<double>(), 0.0) << name;
    EXPECT_EQ(j["variants"][name]["lir"]["returned"].get<int64_t>(), 0) << name;
  }
  // The low-bit tier holds mass, and counting it as evicted can only raise FMM.
  const auto& r3 = j["variants"]["R3"];
  EXPECT_GT(r3["mass_by_tier"]["quant"].get<double>(), 0.0);
  EXPECT_GE(r3["fmm_q_as_evicted_mean"].get<double>(), r3["fmm_mean"].get<double>());
  const double cos = r3["score_cosine"]["global"].get<double>();
  EXPECT_GT(cos, 0.5);
  EXPECT_LE(cos, 1.0 + 1e-9);
  EXPECT_TRUE(j.contains("oracle"));
  EXPECT_GE(j["oracle"]["cumulative"]["windows"].get<int64_t>(), 1);
  EXPECT_FALSE(j["oscillation"]["strict"]["events"].empty());
  EXPECT_FALSE(eval::diagnose_markdown(j).empty());
}

TEST_F(Diagnose, BadOptionsAreClearErrors) {
  eval::DiagnoseOptions o;
  o.variants = {"R9"};
  auto r = eval::run_diagnose(*model_, pool_, tokens_, o, nullptr);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().find("unknown variant"), std::string::npos) << r.error();
  o.variants = {"R3"};
  o.prefill = int64_t(tokens_.size()) + 1;
  r = eval::run_diagnose(*model_, pool_, tokens_, o, nullptr);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().find("fewer than"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace qevict
