// Shared prefill (engine/prefill_share.h): a prompt recorded through one cache and replayed
// into another leaves that cache as feeding it the same calls would — FullKV, qevict, H2O and
// StreamingLLM with --prefill-route end (qevict and H2O from the recording's shared masses),
// the SnapKV family, KIVI and ZipCache (tokens only) — with the routing event at end_prompt() and
// the decode steps after it bit-identical; caches that compress during prefill, non-empty targets
// and open calls are refused.
#include "engine/prefill_share.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "common/random_wo.h"
#include "kvcache/factory.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

KvShape shape() { return test::rope_shape(3, 4, 2, 16); }

std::unique_ptr<SequenceKvCache> make(int64_t n_ctx, const std::string& policy, double budget,
                                      const std::string& route, int64_t prefill_window = 0,
                                      double adapt = 0.0) {
  KvCacheParams p;
  p.policy = policy;
  p.adapt = adapt;
  p.prefill_window = prefill_window;
  p.budget_fraction = budget;
  p.prefill_route = test::route_of(route);
  KvParamsGiven given;  // the policy's own defaults for the rest (KIVI's group, H2O's Ω...)
  given.prefill_route = given.prefill_window = true;
  EXPECT_TRUE(apply_policy_defaults(&p, given).is_ok()) << policy;
  if (policy == "kivi") p.quant.group = 16;  // KIVI's 32 is more than this head_dim
  auto c = make_kv_cache(shape(), n_ctx, p);
  EXPECT_TRUE(c.has_value()) << c.error();
  return c.has_value() ? std::move(*c) : nullptr;
}

// Random q/k/v of one call of n tokens, every layer: f32 [n_layers][n][width].
struct Call {
  int64_t n = 0;
  std::vector<float> q, k, v;
};
Call random_call(int64_t n, std::mt19937& rng) {
  const KvShape s = shape();
  std::normal_distribution<float> g(0.0f, 1.5f);
  Call c;
  c.n = n;
  c.q.resize(size_t(s.n_layers) * n * s.q_width());
  c.k.resize(size_t(s.n_layers) * n * s.kv_width());
  c.v.resize(c.k.size());
  for (float& x : c.q) x = g(rng);
  for (float& x : c.k) x = g(rng);
  for (float& x : c.v) x = g(rng);
  return c;
}

// Runs one call through `cache`; returns every layer's output, concatenated.
std::vector<float> run(SequenceKvCache& cache, const Call& c, ThreadPool& pool) {
  const KvShape s = shape();
  EXPECT_TRUE(cache.begin(c.n).is_ok());
  const size_t qn = size_t(c.n) * s.q_width(), kvn = size_t(c.n) * s.kv_width();
  std::vector<float> out(size_t(s.n_layers) * qn);
  for (int l = 0; l < s.n_layers; ++l)
    cache.attend(l, c.q.data() + l * qn, c.k.data() + l * kvn, c.v.data() + l * kvn,
                 out.data() + l * qn, pool);
  EXPECT_TRUE(cache.commit().is_ok());
  return out;
}

struct Case {
  std::string policy;
  double budget;
  int64_t prefill_window = 0;  // qevict's observation window (its masses come from replay)
  double adapt = 0.0;          // --kv-adapt (its KL from every query's replayed masses)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.policy << "@" << c.budget << " window " << c.prefill_window << " adapt " << c.adapt;
}

class PrefillShare : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillShare, ReplayedCacheDecodesBitIdenticallyToFedCache) {
  ThreadPool pool(2);
  const int64_t n_ctx = 400;
  std::mt19937 rng(7);
  // Awkward chunks: a full one, a ragged one, one token.
  std::vector<Call> prompt = {random_call(128, rng), random_call(77, rng), random_call(1, rng)};
  std::vector<Call> decode;
  for (int i = 0; i < 40; ++i) decode.push_back(random_call(1, rng));

  // The source is FullKV, recorded; the target is the case's policy.
  auto source = make(n_ctx, "full", 0.0, "chunk");
  RecordingKvCache rec(source.get(), shape());
  for (const Call& c : prompt) run(rec, c, pool);
  EXPECT_EQ(rec.n_recorded(), 206);
  EXPECT_GT(rec.recorded_bytes(), size_t(206) * 3 * (64 + 2 * 32) * sizeof(float) - 1);

  const Case& cs = GetParam();
  auto fed = make(n_ctx, cs.policy, cs.budget, "end", cs.prefill_window, cs.adapt);
  auto replayed = make(n_ctx, cs.policy, cs.budget, "end", cs.prefill_window, cs.adapt);
  for (const Call& c : prompt) run(*fed, c, pool);
  ASSERT_TRUE(rec.replay(replayed.get(), pool).is_ok());
  EXPECT_EQ(replayed->n_past(), fed->n_past());
  ASSERT_TRUE(fed->end_prompt().is_ok());
  ASSERT_TRUE(replayed->end_prompt().is_ok());
  if (cs.adapt > 0.0) {  // the same statistic from the replay's masses, the same choice
    KvReport a, b;
    fed->report(&a, ReportDetail::kSummary);
    replayed->report(&b, ReportDetail::kSummary);
    ASSERT_EQ(a.prompt_focus.size(), size_t(shape().n_layers));
    ASSERT_EQ(b.prompt_focus.size(), a.prompt_focus.size());
    for (size_t l = 0; l < a.prompt_focus.size(); ++l) {
      EXPECT_GT(a.prompt_focus[l].kl, 0.0) << "layer " << l;
      EXPECT_NEAR(b.prompt_focus[l].kl, a.prompt_focus[l].kl, 1e-6 * (1 + a.prompt_focus[l].kl));
    }
    EXPECT_EQ(b.adapted, a.adapted);
    EXPECT_EQ(a.adapted, "coverage") << "random queries look nowhere in particular";
  }
  // The same storage (scratch differs: a replay without attention grows none of it).
  auto storage = [](const SequenceKvCache& c, size_t* held) {
    KvReport r;
    c.report(&r, ReportDetail::kSummary);
    *held = r.bytes_held;
    std::vector<size_t> per_layer;
    for (const auto& l : r.layers) per_layer.push_back(l.bytes_allocated);
    return per_layer;
  };
  size_t held_fed = 0, held_replayed = 0;
  EXPECT_EQ(storage(*replayed, &held_replayed), storage(*fed, &held_fed));
  EXPECT_LE(held_replayed, held_fed);
  for (const Call& c : decode) {
    const std::vector<float> a = run(*fed, c, pool), b = run(*replayed, c, pool);
    ASSERT_EQ(a, b) << "decode step at position " << fed->n_past();
  }
  EXPECT_EQ(storage(*replayed, &held_replayed), storage(*fed, &held_fed));
  EXPECT_LE(held_replayed, held_fed + 1024);  // decode scratch may grow in another order
}

INSTANTIATE_TEST_SUITE_P(Policies, PrefillShare,
                         ::testing::Values(Case{"full", 0.0}, Case{"qevict", 0.2}, Case{"h2o", 0.3},
                                           Case{"streaming", 0.3}, Case{"snapkv", 0.5},
                                           Case{"adakv", 0.5},
                                           // a window spanning the last two calls (77 + 1)
                                           Case{"qevict", 0.2, 32},
                                           // --kv-adapt: the coverage tier chosen from the
                                           // replayed masses of every query
                                           Case{"qevict", 0.2, 32, 50.0},
                                           // quantizers holding the prompt to its end (stored
                                           // without attention; ZipCache's probes still read it)
                                           Case{"kivi", 0.0}, Case{"zipcache", 0.0}),
                         [](const auto& info) {
                           return info.param.policy +
                                  (info.param.prefill_window > 0
                                       ? "_window" + std::to_string(info.param.prefill_window)
                                       : "") +
                                  (info.param.adapt > 0 ? "_adapt" : "");
                         });

// CriticalKV scores by value norms through W_O: the replayed cache gets the new tokens' norms
// from the recording (computed once, in f16 as the cache stores values) and routes as the fed
// cache that computed its own.
TEST(PrefillShare, ValueNormsFromTheRecordingRouteAsTheCachesOwn) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const test::RandomWo wo(shape(), 24, rng);
  std::vector<Call> prompt = {random_call(128, rng), random_call(77, rng)};
  auto source = make(400, "full", 0.0, "chunk");
  RecordingKvCache rec(source.get(), shape());
  rec.set_output_projection(&wo.proj);
  for (const Call& c : prompt) run(rec, c, pool);
  for (const std::string policy : {"criticalkv", "defensivekv"}) {
    SCOPED_TRACE(policy);
    auto fed = make(400, policy, 0.4, "end");
    auto replayed = make(400, policy, 0.4, "end");
    ASSERT_TRUE(replayed->prompt_replay_value_norms());
    fed->set_output_projection(&wo.proj);
    for (const Call& c : prompt) run(*fed, c, pool);
    ASSERT_TRUE(rec.replay(replayed.get(), pool).is_ok());
    ASSERT_TRUE(fed->end_prompt().is_ok());
    ASSERT_TRUE(replayed->end_prompt().is_ok());
    for (int i = 0; i < 40; ++i) {
      const Call c = random_call(1, rng);
      const std::vector<float> a = run(*fed, c, pool), b = run(*replayed, c, pool);
      ASSERT_EQ(a, b) << "decode step at position " << fed->n_past();
    }
  }
  EXPECT_GT(rec.mass_bytes(), size_t(205) * shape().n_layers * shape().n_kv_heads * 4 - 1);
}

TEST(PrefillShareErrors, RefusesCompressingDuringPrefillNonEmptyTargetsAndOpenCalls) {
  ThreadPool pool(1);
  std::mt19937 rng(3);
  auto source = make(200, "full", 0.0, "chunk");
  RecordingKvCache rec(source.get(), shape());
  run(rec, random_call(20, rng), pool);

  auto chunked = make(200, "qevict", 0.5, "chunk");
  const Status s = rec.replay(chunked.get(), pool);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("--prefill-route end"), std::string::npos) << s.message();

  auto busy = make(200, "full", 0.0, "chunk");
  run(*busy, random_call(3, rng), pool);
  EXPECT_FALSE(rec.replay(busy.get(), pool).is_ok());

  ASSERT_TRUE(rec.begin(2).is_ok());
  auto fresh = make(200, "full", 0.0, "chunk");
  EXPECT_FALSE(rec.replay(fresh.get(), pool).is_ok());
}

}  // namespace
}  // namespace qevict
