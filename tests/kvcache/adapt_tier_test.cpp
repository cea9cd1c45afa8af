// --kv-adapt (issue 51): at the prompt's first routing the tiered cache measures where its
// observation window looked (PromptFocus) and, when no question about the text is in view
// (focus below the threshold), switches its low-bit tier to the coverage tier (INT2, one-byte
// key scales, q 0.95) within the same budget; a prompt that ends with a question keeps the
// configured tier. The choice survives a session save/load, and clear() returns to the
// configured tier.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/kv_shape.h"
#include "core/byte_io.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/needle_driver.h"
#include "kvcache/options.h"
#include "kvcache/params.h"

namespace qevict {
namespace {

using test::NeedleDriver;
using test::Role;

// The toy needle prompt (tests/kvcache/needle_driver.h): 400 tokens of haystack with the
// needle, then 32 tokens that are a question (queries 6·e0, logit 24 on the needle) or more
// text, and the prompt's end.
struct Driver : NeedleDriver {
  Driver() : NeedleDriver(7) {}
  void call(SequenceKvCache& c, int64_t n, bool question, ThreadPool& pool) {
    NeedleDriver::call(c, n, question ? Role::kQuestion : Role::kHaystack, pool);
  }
  void prompt(SequenceKvCache& c, bool question, ThreadPool& pool) {
    for (int chunk = 0; chunk < 4; ++chunk) call(c, 100, false, pool);
    call(c, 32, question, pool);
    ASSERT_TRUE(c.end_prompt().is_ok());
  }
};

KvCacheParams params(double adapt) {
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  p.adapt = adapt;
  EXPECT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());  // end, window 32, K4V2
  return p;
}

std::unique_ptr<SequenceKvCache> make(const KvShape& s, const KvCacheParams& p) {
  auto c = make_kv_cache(s, 480, p);
  EXPECT_TRUE(c.has_value()) << c.error();
  return c.has_value() ? std::move(*c) : nullptr;
}

TEST(AdaptTier, FocusSaysWhetherThePromptEndPointsIntoTheText) {
  ThreadPool pool(2);
  for (bool question : {true, false}) {
    SCOPED_TRACE(question ? "question" : "text");
    Driver d;
    auto c = make(d.s, params(1e-6));  // KL is measured by caches that adapt
    ASSERT_NE(c, nullptr);
    d.prompt(*c, question, pool);
    const KvReport r = report_of(*c);
    ASSERT_EQ(r.prompt_focus.size(), size_t(d.s.n_layers));
    for (const PromptFocus& f : r.prompt_focus) {
      // The question looks where the text never does (its needle window); the text's tail
      // looks where the text does (toy: 1.65 and 0.009 nats).
      if (question) {
        EXPECT_GT(f.kl, 1.0);
      } else {
        EXPECT_LT(f.kl, 0.1);
      }
      EXPECT_LE(f.top1, f.top4 + 1e-12);
      EXPECT_LE(f.top4, f.top16 + 1e-12);
      EXPECT_LE(f.top16, f.history + 1e-12);
      EXPECT_LE(f.history, 1.0 + 1e-9);
      if (question) {
        EXPECT_GT(f.top4, 0.8) << "the question's attention is on the needle's window";
      } else {
        EXPECT_LT(f.top4, 0.1) << "the text's tail attends to its sink and its newest tokens";
      }
      EXPECT_LE(f.far4, f.top4 + 1e-12);
    }
  }
}

TEST(AdaptTier, ATextWithoutAQuestionGetsTheCoverageTierWithinTheSameBudget) {
  ThreadPool pool(2);
  const KvCacheParams base = params(0.3);
  const KvCacheParams cov = coverage_params(base);
  for (bool question : {true, false}) {
    SCOPED_TRACE(question ? "question" : "text");
    Driver d;
    auto c = make(d.s, base);
    ASSERT_NE(c, nullptr);
    const KvReport before = report_of(*c);
    EXPECT_TRUE(before.adapted.empty());
    d.prompt(*c, question, pool);
    const KvReport r = report_of(*c, ReportDetail::kTiers);
    EXPECT_EQ(r.adapted, question ? "configured" : "coverage");
    EXPECT_EQ(r.budget.total, before.budget.total) << "the budget is the same either way";
    auto want = compute_budget(CacheKind::kWindowed, d.s, 480, question ? base : cov);
    ASSERT_TRUE(want.has_value());
    EXPECT_EQ(r.budget.window_quant, want->window_quant);
    EXPECT_EQ(r.budget.capacity_quant, want->capacity_quant);
    EXPECT_EQ(r.budget.capacity_full, want->capacity_full);
    EXPECT_NE(r.describe.find(question ? "INT4 keys, INT2 values" : "INT2"), std::string::npos)
        << r.describe;
    int64_t kept = 0, evicted = 0;
    for (int l = 0; l < d.s.n_layers; ++l) {
      EXPECT_LE(r.layers[size_t(l)].bytes_budgeted, r.budget.total) << "layer " << l;
      kept += r.layers[size_t(l)].windows_full + r.layers[size_t(l)].windows_quant;
      evicted += r.layers[size_t(l)].windows_evicted;
    }
    // Coverage holds more windows of the text than the configured tier can.
    auto configured = compute_budget(CacheKind::kWindowed, d.s, 480, base);
    ASSERT_TRUE(configured.has_value());
    const int64_t most = d.s.n_layers * (configured->capacity_full + configured->capacity_quant);
    if (!question) {
      EXPECT_GT(kept, most + most / 2) << evicted << " evicted";
    } else {
      EXPECT_LE(kept, most);
    }
    // Decode goes on within the budget in the chosen layout.
    for (int t = 0; t < 16; ++t) d.call(*c, 1, false, pool);
    const KvReport after = report_of(*c);
    EXPECT_EQ(after.adapted, r.adapted) << "decided once per sequence";
    for (int l = 0; l < d.s.n_layers; ++l)
      EXPECT_LE(after.layers[size_t(l)].bytes_budgeted, after.budget.total);
  }
}

TEST(AdaptTier, TheChoiceSurvivesSaveAndLoadAndClearGoesBack) {
  ThreadPool pool(2);
  Driver d;
  const KvCacheParams base = params(0.3);
  auto c = make(d.s, base);
  ASSERT_NE(c, nullptr);
  d.prompt(*c, false, pool);
  ASSERT_EQ(report_of(*c).adapted, "coverage");
  ByteWriter w;
  ASSERT_TRUE(c->save_state(w).is_ok());
  auto fresh = make(d.s, base);
  ASSERT_NE(fresh, nullptr);
  ByteReader rd(w.bytes());
  ASSERT_TRUE(fresh->load_state(rd).is_ok());
  const KvReport a = report_of(*c), b = report_of(*fresh);
  EXPECT_EQ(b.adapted, "coverage");
  EXPECT_EQ(b.describe, a.describe);
  EXPECT_EQ(b.budget.window_quant, a.budget.window_quant);
  ASSERT_EQ(b.prompt_focus.size(), a.prompt_focus.size());
  EXPECT_EQ(b.prompt_focus[0].top4, a.prompt_focus[0].top4);
  // The same next steps give the same outputs in both.
  Driver d2 = d;
  d.call(*c, 1, true, pool);
  d2.call(*fresh, 1, true, pool);
  EXPECT_EQ(report_of(*c).total().promotions, report_of(*fresh).total().promotions);

  // A cache that does not adapt refuses a coverage state.
  auto plain = make(d.s, params(0.0));
  ByteReader rd2(w.bytes());
  EXPECT_FALSE(plain->load_state(rd2).is_ok());

  // clear(): a new sequence starts in the configured tier and decides again.
  c->clear();
  const KvReport cl = report_of(*c);
  EXPECT_TRUE(cl.adapted.empty());
  EXPECT_TRUE(cl.prompt_focus.empty());
  EXPECT_EQ(cl.budget.window_quant, report_of(*make(d.s, base)).budget.window_quant);
  d.prompt(*c, true, pool);
  EXPECT_EQ(report_of(*c).adapted, "configured");
}

TEST(AdaptTier, ParamsAreValidated) {
  KvCacheParams p = params(0.3);
  EXPECT_TRUE(p.validate().is_ok());
  p.adapt = 100.5;
  EXPECT_FALSE(p.validate().is_ok());
  p.adapt = -0.1;
  EXPECT_FALSE(p.validate().is_ok());
  p = params(0.3);
  p.prefill_route = PrefillRoute::kStaged;  // staged quantizes before the prompt ends
  EXPECT_FALSE(p.validate().is_ok());
  p = params(0.3);
  p.prefill_window = 0;  // no observation window to measure
  EXPECT_FALSE(p.validate().is_ok());
  KvCacheParams s;
  s.policy = "snapkv";
  s.budget_fraction = 0.2;
  s.adapt = 0.3;
  EXPECT_FALSE(s.validate().is_ok());
  // The option parser (CLI, eval variants, Python, server).
  KvCacheParams q;
  KvParamsGiven g;
  ASSERT_TRUE(set_kv_option(&q, &g, "adapt", "0.25").is_ok());
  EXPECT_DOUBLE_EQ(q.adapt, 0.25);
  ASSERT_TRUE(set_kv_option(&q, &g, "--kv-adapt", "0").is_ok());
  EXPECT_DOUBLE_EQ(q.adapt, 0.0);
  EXPECT_FALSE(set_kv_option(&q, &g, "adapt", "x").is_ok());
}

}  // namespace
}  // namespace qevict
