// `qevict diagnose --variants` accepts every registered baseline: variant_params gives each
// its registry defaults at the run's budget and prefill route, and the cache builds.
#include <gtest/gtest.h>

#include "common/kv_names.h"
#include "eval/diagnose.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/kvquant_policy.h"

namespace qevict::eval {
namespace {

TEST(DiagnoseVariants, AcceptsTheIssue10Baselines) {
  KvShape s;
  s.n_layers = 2;
  s.n_q_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  DiagnoseOptions o;  // budget 0.2 of 512 + 256 tokens
  for (const char* name : {"snapkv", "pyramidkv", "adakv", "criticalkv", "criticaladakv",
                           "defensivekv", "layer-defensivekv"}) {
    for (const char* route : {"chunk", "end"}) {
      o.base.prefill_route = test::route_of(route);
      auto p = variant_params(name, o);
      ASSERT_TRUE(p.has_value()) << name << ": " << p.error();
      EXPECT_EQ(p->policy, name);
      EXPECT_STREQ(to_string(p->prefill_route), route)
          << name << ": the run's route for every variant";
      EXPECT_DOUBLE_EQ(p->budget_fraction, 0.2) << name;
      EXPECT_EQ(p->sink, 0) << name;
      EXPECT_EQ(p->local, 32) << name;
      auto c = make_kv_cache(s, o.prefill + o.gen, *p);
      ASSERT_TRUE(c.has_value()) << name << ": " << c.error();
      KvReport r;
      (*c)->report(&r);
      EXPECT_TRUE(r.per_head) << name;
      EXPECT_GT(r.budget.head_heavy, 0) << name;
    }
  }
  // A quantizer runs at its byte point: the run's budget is not passed on (it would be refused),
  // the run's prefill route is.
  auto quantizer = [&](const char* name, const char* route) -> KvCacheParams {
    o.base.prefill_route = test::route_of(route);
    auto p = variant_params(name, o);
    EXPECT_TRUE(p.has_value()) << name << ": " << p.error();
    if (!p) return {};
    EXPECT_EQ(p->policy, name);
    EXPECT_STREQ(to_string(p->prefill_route), route) << name;
    EXPECT_EQ(p->budget_fraction, 0.0) << name;
    auto c = make_kv_cache(s, o.prefill + o.gen, *p);
    EXPECT_TRUE(c.has_value()) << name << ": " << c.error();
    if (!c) return *p;
    KvReport r;
    (*c)->report(&r, ReportDetail::kTiers);
    EXPECT_EQ(r.budget.kind, CacheKind::kQuantized) << name;
    EXPECT_EQ(r.position_tiers.size(), size_t(s.n_layers)) << name;
    return *p;
  };
  for (const char* route : {"chunk", "end"}) {
    const KvCacheParams kivi = quantizer("kivi", route);
    EXPECT_EQ(kivi.quant.residual, 128);
    EXPECT_EQ(kivi.quant.group, 32);
    const KvCacheParams zip = quantizer("zipcache", route);
    EXPECT_EQ(zip.quant.gap, 100);
    EXPECT_DOUBLE_EQ(zip.quant.low_share, 0.4);
  }
  {  // kvquant: its registry defaults; the cache needs the calibration that base carries
    auto p = variant_params("kvquant", o);
    ASSERT_TRUE(p.has_value()) << p.error();
    EXPECT_EQ(p->quant.bits, 3);
    EXPECT_DOUBLE_EQ(p->quant.outlier_share, 0.01);
    EXPECT_EQ(p->quant.f16_first, 1);
    EXPECT_EQ(p->budget_fraction, 0.0);
    EXPECT_FALSE(make_kv_cache(s, o.prefill + o.gen, *p).has_value());
    KvQuantConfig c;
    std::vector<float> k(size_t(64) * s.kv_width(), 0.0f), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = float((i * 37) % 101) / 50.0f - 1.0f;
      v[i] = float((i * 53) % 97) / 48.0f - 1.0f;
    }
    auto cal = std::make_shared<std::vector<KvQuantLayerCalib>>();
    for (int l = 0; l < s.n_layers; ++l)
      cal->push_back(kvquant_calibrate(c, k.data(), v.data(), 64, s.kv_width()));
    o.base.quant.kvquant_calib = cal;
    for (const char* route : {"chunk", "end"}) quantizer("kvquant", route);
  }
  auto bad = variant_params("snapkv-typo", o);
  EXPECT_FALSE(bad.has_value());
}

}  // namespace
}  // namespace qevict::eval
