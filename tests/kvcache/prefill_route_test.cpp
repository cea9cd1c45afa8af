// --prefill-route end (SPEC §4): the windowed and per-head caches route nothing while the
// prompt is read, route exactly once when it ends (end_prompt() or the first decode step),
// and hold ≤ budget afterwards; a needle window that only the question (the last queries)
// attends to survives with `end` and is evicted with `chunk`, and ends in F with `staged`;
// `chunk` is unchanged by the end_prompt() hook.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/needle_driver.h"
#include "kvcache/options.h"
#include "kvcache/params.h"
#include "kvcache/policies/qevict_policy.h"

namespace qevict {
namespace {

KvShape shape() { return test::needle_shape(); }

std::unique_ptr<SequenceKvCache> make(const KvShape& s, int64_t n_ctx, const KvCacheParams& p) {
  auto c = make_kv_cache(s, n_ctx, p);
  EXPECT_TRUE(c.has_value()) << c.error();
  return c.has_value() ? std::move(*c) : nullptr;
}

using test::NeedleDriver;
using test::Role;

KvCacheParams qevict_params(const std::string& route, int window = 0) {
  KvCacheParams p;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  p.prefill_route = test::route_of(route);
  p.prefill_window = window;
  return p;
}

// The prompt in chunks of 100 (400 tokens), nothing routed; then end_prompt() routes once.
TEST(PrefillRouteEnd, RoutesNothingUntilThePromptEndsThenOnce) {
  NeedleDriver d;
  ThreadPool pool(2);
  for (const std::string policy : {"qevict", "h2o"}) {
    for (int window : {0, 32}) {
      if (policy == "h2o" && window > 0) continue;  // H2O ranks by its own cumulative score
      SCOPED_TRACE(policy + " window " + std::to_string(window));
      KvCacheParams p = qevict_params("end", window);
      p.policy = policy;
      KvParamsGiven given;
      given.prefill_window = true;  // 0: Eq. 1, not qevict's default window
      ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
      auto c = make(d.s, 420, p);
      ASSERT_NE(c, nullptr);
      size_t held_before = 0;
      for (int chunk = 0; chunk < 4; ++chunk) {
        d.call(*c, 100, Role::kRandom, pool);
        const KvReport r = report_of(*c);
        EXPECT_EQ(r.routing_events, 0) << "after chunk " << chunk;
        EXPECT_EQ(r.total().evictions, 0);
        EXPECT_EQ(r.total().demotions, 0);
        held_before = r.bytes_held;
      }
      KvReport r = report_of(*c);
      // The whole prompt is held in 16 bits: far more than the budget (SPEC §4's price).
      EXPECT_GT(r.layers[0].bytes_budgeted, r.budget.total);
      EXPECT_GE(r.peak_bytes_held, held_before);
      ASSERT_TRUE(c->end_prompt().is_ok());
      r = report_of(*c);
      EXPECT_EQ(r.routing_events, 1);
      EXPECT_GT(r.total().evictions, 0);
      for (int l = 0; l < d.s.n_layers; ++l) EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total);
      EXPECT_LT(r.bytes_held, held_before) << "pools give the prompt's memory back";
      EXPECT_GE(r.peak_bytes_held, held_before) << "the peak stays visible";
      ASSERT_TRUE(c->end_prompt().is_ok());  // nothing pending: no second event
      EXPECT_EQ(report_of(*c).routing_events, 1);
      // Decode: routing every Ω as before.
      for (int t = 0; t < 16; ++t) d.call(*c, 1, Role::kRandom, pool);
      r = report_of(*c);
      EXPECT_EQ(r.routing_events, 1 + 16 / p.route_every);
      for (int l = 0; l < d.s.n_layers; ++l) EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total);
    }
  }
}

// A caller that never calls end_prompt(): the first decode step routes the prompt (what the
// paper's code does), once.
TEST(PrefillRouteEnd, FirstDecodeStepRoutesWhenNotTold) {
  NeedleDriver d;
  ThreadPool pool(1);
  for (int window : {0, 32}) {
    auto c = make(d.s, 420, qevict_params("end", window));
    ASSERT_NE(c, nullptr);
    for (int chunk = 0; chunk < 3; ++chunk) d.call(*c, 128, Role::kRandom, pool);
    EXPECT_EQ(report_of(*c).routing_events, 0);
    d.call(*c, 1, Role::kRandom, pool);
    const KvReport r = report_of(*c);
    EXPECT_EQ(r.routing_events, 1) << "window " << window;
    for (int l = 0; l < d.s.n_layers; ++l) EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total);
  }
}

// The needle: window 2 gets almost no attention from the haystack queries and nearly all of
// the question's (the last 32 prompt tokens). With `chunk` it is evicted long before the
// question is read; with `end` (either score) it survives the one routing event, and a
// question asked at decode time reads its value back.
TEST(PrefillRouteEnd, NeedleSeenOnlyByTheQuestionSurvivesEndNotChunk) {
  ThreadPool pool(2);
  struct Case {
    std::string route;
    int window;
    bool survives;
  };
  for (const Case& cs : {Case{"chunk", 0, false}, Case{"end", 0, true}, Case{"end", 32, true}}) {
    SCOPED_TRACE(cs.route + " window " + std::to_string(cs.window));
    NeedleDriver d;
    auto c = make(d.s, 440, qevict_params(cs.route, cs.window));
    ASSERT_NE(c, nullptr);
    for (int chunk = 0; chunk < 4; ++chunk) d.call(*c, 92, Role::kHaystack, pool);
    d.call(*c, 32, Role::kQuestion, pool);  // the prompt ends with the question
    ASSERT_TRUE(c->end_prompt().is_ok());
    const KvReport r = report_of(*c, ReportDetail::kTiers);
    for (int l = 0; l < d.s.n_layers; ++l) {
      EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total);
      const Tier t = r.position_tiers[size_t(l)][size_t(d.needle0)];
      EXPECT_EQ(t != Tier::kEvicted, cs.survives) << "layer " << l << " tier " << int(t);
    }
    EXPECT_GT(r.total().evictions, 0) << "the budget must force a choice";
    if (cs.route == "end")
      EXPECT_EQ(r.routing_events, 1);
    else
      EXPECT_EQ(r.routing_events, 5);
    // Ask again while decoding: the needle's value (10·e5) comes back only if it was kept.
    const std::vector<float> o = d.call(*c, 1, Role::kQuestion, pool);
    if (cs.survives)
      EXPECT_GT(o[5], 5.0f);
    else
      EXPECT_LT(std::fabs(o[5]), 1.0f);
  }
}

// staged (issue 52): the same needle, staged at low bits while the haystack is read (the
// question's queries see its low-bit keys), is promoted to F by the prompt's one routing
// event, and read back while decoding.
TEST(PrefillRouteStaged, NeedleAttendedByTheLastQueriesEndsInF) {
  ThreadPool pool(2);
  NeedleDriver d;
  KvCacheParams p = qevict_params("staged", 32);
  p.pool = 2;  // qevict's default with a prefill window
  auto c = make(d.s, 440, p);
  ASSERT_NE(c, nullptr);
  for (int chunk = 0; chunk < 4; ++chunk) d.call(*c, 92, Role::kHaystack, pool);
  d.call(*c, 32, Role::kQuestion, pool);
  KvReport r = report_of(*c, ReportDetail::kTiers);
  EXPECT_EQ(r.routing_events, 0);
  for (int l = 0; l < d.s.n_layers; ++l)
    EXPECT_EQ(int(r.position_tiers[size_t(l)][size_t(d.needle0)]), int(Tier::kQuant))
        << "staged, layer " << l;
  ASSERT_TRUE(c->end_prompt().is_ok());
  r = report_of(*c, ReportDetail::kTiers);
  EXPECT_EQ(r.routing_events, 1);
  for (int l = 0; l < d.s.n_layers; ++l) {
    EXPECT_LE(r.layers[l].bytes_budgeted, r.budget.total);
    EXPECT_EQ(int(r.position_tiers[size_t(l)][size_t(d.needle0)]), int(Tier::kFull))
        << "layer " << l;
    EXPECT_EQ(r.layers[l].promotions, r.layers[l].windows_full) << "layer " << l;
    EXPECT_GT(r.layers[l].evictions, 0) << "the budget forces a choice";
  }
  const std::vector<float> o = d.call(*c, 1, Role::kQuestion, pool);
  EXPECT_GT(o[5], 5.0f);
}

// `chunk` (the default) is untouched by the end_prompt() hook: same outputs bit for bit,
// same routing events, whether or not the caller says the prompt has ended.
TEST(PrefillRouteChunk, EndPromptHookChangesNothing) {
  ThreadPool pool(2);
  for (const std::string policy : {"qevict", "h2o"}) {
    KvCacheParams p = qevict_params("chunk");
    p.policy = policy;
    KvParamsGiven given;
    given.prefill_route = true;
    ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
    ASSERT_STREQ(to_string(p.prefill_route), "chunk") << policy;
    NeedleDriver da, db;
    auto a = make(da.s, 420, p), b = make(db.s, 420, p);
    for (int chunk = 0; chunk < 3; ++chunk) {
      da.call(*a, 100, Role::kRandom, pool);
      db.call(*b, 100, Role::kRandom, pool);
    }
    ASSERT_TRUE(b->end_prompt().is_ok());
    for (int t = 0; t < 20; ++t) {
      const auto oa = da.call(*a, 1, Role::kRandom, pool);
      const auto ob = db.call(*b, 1, Role::kRandom, pool);
      ASSERT_EQ(oa, ob) << policy << " step " << t;
    }
    EXPECT_EQ(report_of(*a).routing_events, report_of(*b).routing_events);
    EXPECT_EQ(report_of(*a).routing_events, 3 + 20 / p.route_every) << policy;
  }
}

TEST(PrefillRoute, ParamsAreValidated) {
  KvCacheParams p = qevict_params("chunk");
  EXPECT_TRUE(p.validate().is_ok());
  KvParamsGiven given;  // a route is typed where it is parsed: a wrong name never reaches p
  EXPECT_FALSE(set_kv_option(&p, &given, "prefill_route", "late").is_ok());
  EXPECT_TRUE(p.validate().is_ok());
  p.prefill_route = PrefillRoute::kChunk;
  p.prefill_window = 32;  // the window scores the one routing of `end`
  EXPECT_FALSE(p.validate().is_ok());
  p.prefill_route = PrefillRoute::kEnd;
  EXPECT_TRUE(p.validate().is_ok());
  p.prefill_route = PrefillRoute::kStaged;  // end's scoring, staged prompt
  EXPECT_TRUE(p.validate().is_ok());
  p.prefill_route = PrefillRoute::kEnd;
  p.prefill_window = -1;
  EXPECT_FALSE(p.validate().is_ok());
  p.prefill_window = 32;
  p.policy = "h2o";  // per-head: H2O's own score
  EXPECT_FALSE(p.validate().is_ok());
  p.prefill_window = 0;
  EXPECT_TRUE(p.validate().is_ok());
}

// qevict's default ranking of the `end` routing is the last 32 queries (chosen from the eval
// suite); a given --prefill-window, 0 (Eq. 1) included, is kept; `chunk` and the other
// windowed policies are left at 0.
TEST(PrefillRoute, QevictEndDefaultsToAnObservationWindowOf32) {
  KvCacheParams p = qevict_params("chunk");  // the struct's own default route
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_STREQ(to_string(p.prefill_route), "end");  // qevict's default, chosen from the suite
  EXPECT_EQ(p.prefill_window, 32);
  EXPECT_EQ(p.pool, 2);  // with the window scorer, windows rank with their neighbours
  EXPECT_TRUE(p.validate().is_ok());
  KvParamsGiven given;
  given.prefill_route = true;
  given.prefill_window = true;
  p = qevict_params("end", 0);  // Eq. 1: no pooling unless asked for
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  EXPECT_EQ(p.prefill_window, 0);
  EXPECT_EQ(p.pool, 0);
  p = qevict_params("end", 8);
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  EXPECT_EQ(p.prefill_window, 8);
  EXPECT_EQ(p.pool, 2);
  given.pool = true;  // an explicit pool (0 included) wins
  p = qevict_params("end", 8);
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  EXPECT_EQ(p.pool, 0);
  given.pool = false;
  p = qevict_params("chunk");  // chunk when asked for: Eq. 1, no window, no pooling
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  EXPECT_STREQ(to_string(p.prefill_route), "chunk");
  EXPECT_EQ(p.prefill_window, 0);
  EXPECT_EQ(p.pool, 0);
  EXPECT_TRUE(p.validate().is_ok());
  p = qevict_params("chunk");
  p.policy = "streaming";  // the baselines keep their own routes
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_STREQ(to_string(p.prefill_route), "chunk");
  p = qevict_params("end");
  p.policy = "streaming";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_EQ(p.prefill_window, 0);
}

// The cache's one-line description says how it ranks windows, so that --kv-stats and the
// diagnose/eval tables tell the default (prompt-end window, pooled) from the paper's Eq. 1.
TEST(PrefillRoute, DescriptionNamesTheScorer) {
  const auto describe = [](KvCacheParams p) {
    EXPECT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
    auto c = make(shape(), 400, p);
    return c ? c->describe() : std::string();
  };
  KvCacheParams p = qevict_params("end");
  const std::string def = describe(p);
  EXPECT_EQ(def.rfind("qevict (prompt-end window of 32 queries, max-pooled with 2 windows either "
                      "side) (budget ",
                      0),
            0u)
      << def;
  p.pool_side = PoolSide::kAfter;
  EXPECT_NE(describe(p).find("max-pooled with 2 windows before)"), std::string::npos);
  KvParamsGiven given;
  given.prefill_route = given.prefill_window = true;
  p = qevict_params("chunk");
  EXPECT_TRUE(apply_policy_defaults(&p, given).is_ok());
  auto eq1 = make(shape(), 400, p);
  ASSERT_TRUE(eq1);
  EXPECT_EQ(eq1->describe().rfind("qevict (budget ", 0), 0u) << eq1->describe();
  p.score = ScoreMode::kAge;
  auto age = make(shape(), 400, p);
  ASSERT_TRUE(age);
  EXPECT_EQ(age->describe().rfind("qevict (age-normalised scores) (budget ", 0), 0u)
      << age->describe();
}

// After a prompt-end observation window restarted the scores, --kv-score age divides a
// window's score by the queries since the window's start, not since the window was written.
TEST(PrefillRoute, AgeRankCountsQueriesSinceTheScoresRestarted) {
  RoutingCandidate c;
  c.score = 3.0;
  c.pos0 = 100;
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kAge, c, 1000, 0), 3.0 / 900);
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kAge, c, 1000, 968), 3.0 / 32);
  c.pos0 = 980;  // younger than the window: its own age
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kAge, c, 1000, 968), 3.0 / 20);
  EXPECT_DOUBLE_EQ(QEvictPolicy::rank_score(ScoreMode::kSum, c, 1000, 968), 3.0);
}

// --kv-trace: the JSONL trace appears under its name only when the cache is destroyed (written
// through an AtomicFile), with one line per routing event and layer.
TEST(RoutingTraceFile, AppearsWholeWhenTheCacheIsDestroyed) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("qevict_trace_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "trace.jsonl").string();
  NeedleDriver d;
  ThreadPool pool(1);
  KvCacheParams p = qevict_params("chunk");
  p.trace_path = path;
  {
    auto c = make(d.s, 300, p);
    ASSERT_NE(c, nullptr);
    for (int chunk = 0; chunk < 2; ++chunk) d.call(*c, 100, Role::kRandom, pool);
    for (int t = 0; t < 8; ++t) d.call(*c, 1, Role::kRandom, pool);
    EXPECT_FALSE(fs::exists(path)) << "the trace must not appear while it is being written";
    EXPECT_GT(report_of(*c).routing_events, 0);
  }
  ASSERT_TRUE(fs::exists(path));
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_EQ(line.rfind("{\"event\":", 0), 0u) << line;
    EXPECT_NE(line.find("\"tiers\":\""), std::string::npos) << line;
  }
  EXPECT_GT(lines, 0);
  EXPECT_EQ(lines % d.s.n_layers, 0) << "one line per routing event and layer";
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1u) << "no temporary file left beside the trace";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qevict
