// Tests StreamingPolicy vs a brute-force rule, the streaming cache, and policy defaults.
#include "kvcache/policies/streaming_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/kv_shape.h"
#include "core/f16.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

// ---------------------------------------------------------------------------------------
// StreamingPolicy

// Brute force of the rule, written as prefix sums rather than a running budget: order the
// candidates newest first; F takes the longest newest-first prefix whose summed costs
// (M_f, plus M_q for a ledger in strict mode) fit full_bytes; Q takes the next
// floor(quant_bytes / M_q) candidates (none when M_q = 0); the rest are evicted.
std::vector<Tier> streaming_model(const std::vector<RoutingCandidate>& in, const RoutingBudget& b) {
  const size_t n = in.size();
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t(0));
  for (size_t i = 0; i < n; ++i)  // selection sort by window id, descending: obviously right
    for (size_t j = i + 1; j < n; ++j)
      if (in[idx[j]].id > in[idx[i]].id) std::swap(idx[i], idx[j]);
  size_t n_full = 0, cum = 0;
  for (size_t r = 0; r < n; ++r) {
    cum += b.window_full + (b.strict_ledger && in[idx[r]].has_ledger ? b.window_quant : 0);
    if (cum > b.full_bytes) break;
    n_full = r + 1;
  }
  const size_t n_quant =
      b.window_quant > 0 ? std::min(n - n_full, b.quant_bytes / b.window_quant) : 0;
  std::vector<Tier> out(n, Tier::kEvicted);
  for (size_t r = 0; r < n; ++r)
    out[idx[r]] = r < n_full ? Tier::kFull : r < n_full + n_quant ? Tier::kQuant : Tier::kEvicted;
  return out;
}

std::string plan_string(const std::vector<RoutingCandidate>& in, const std::vector<Tier>& t) {
  std::string s;
  for (size_t i = 0; i < in.size(); ++i)
    s += std::to_string(in[i].id) + (in[i].has_ledger ? "L" : "") + ":" + tier_char(t[i]) + " ";
  return s;
}

TEST(StreamingPolicy, MatchesBruteForceRuleAndIgnoresScores) {
  std::mt19937 rng(31337);
  std::uniform_real_distribution<double> score(0.0, 10.0);
  StreamingPolicy pol;
  EXPECT_EQ(pol.name(), "streaming");
  int n_full_seen = 0, n_quant_seen = 0, n_evicted_seen = 0;
  for (int trial = 0; trial < 240; ++trial) {
    const int n = int(rng() % 41);  // 0..40 candidates
    // Distinct window ids drawn from [0, 200), in random order.
    std::vector<int32_t> ids(200);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<RoutingCandidate> in(n);
    for (int i = 0; i < n; ++i) {
      in[i].id = ids[i];
      in[i].score = score(rng);
      in[i].tier = Tier(rng() % 3);  // kLocal, kFull or kQuant
      in[i].has_ledger = rng() % 2;
    }
    RoutingBudget b;
    b.window_full = 100 + rng() % 50;
    b.window_quant = trial % 3 == 0 ? 0 : 10 + rng() % 40;  // with and without a low-bit tier
    b.strict_ledger = (trial / 3) % 2;
    size_t all_full = 0;
    for (const auto& c : in)
      all_full += b.window_full + (b.strict_ledger && c.has_ledger ? b.window_quant : 0);
    switch (trial % 4) {
      case 0:  // nothing
        b.full_bytes = 0;
        b.quant_bytes = 0;
        break;
      case 1:  // everything fits in F
        b.full_bytes = all_full + rng() % 100;
        b.quant_bytes = rng() % 1000;
        break;
      case 2:  // in between, both tiers
        b.full_bytes = rng() % (all_full + 1);
        b.quant_bytes = rng() % (size_t(n) * b.window_quant + 1);
        break;
      default:  // in between, no low-bit bytes
        b.full_bytes = rng() % (all_full + 1);
        b.quant_bytes = 0;
        break;
    }
    std::vector<Tier> out;
    out = plan_tiers(pol, in, b);
    const std::vector<Tier> want = streaming_model(in, b);
    ASSERT_EQ(out.size(), size_t(n));
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(tier_char(out[i]), tier_char(want[i]))
          << "trial " << trial << " candidate " << i << " (window " << in[i].id << ", ledger "
          << in[i].has_ledger << ") full_bytes " << b.full_bytes << " quant_bytes " << b.quant_bytes
          << " M_f " << b.window_full << " M_q " << b.window_quant << " strict " << b.strict_ledger
          << "\n got  " << plan_string(in, out) << "\n want " << plan_string(in, want);
    for (Tier t : out) {
      n_full_seen += t == Tier::kFull;
      n_quant_seen += t == Tier::kQuant;
      n_evicted_seen += t == Tier::kEvicted;
    }
    if (trial % 4 == 1) {
      for (Tier t : out) ASSERT_EQ(t, Tier::kFull) << "trial " << trial;
    }

    // Scores must not matter: permuted scores and fresh random scores give the same plan.
    std::vector<RoutingCandidate> permuted = in;
    std::vector<double> scores(n);
    for (int i = 0; i < n; ++i) scores[i] = in[i].score;
    std::shuffle(scores.begin(), scores.end(), rng);
    for (int i = 0; i < n; ++i) permuted[i].score = scores[i];
    std::vector<Tier> out_p;
    out_p = plan_tiers(pol, permuted, b);
    ASSERT_EQ(out_p, out) << "trial " << trial << ": permuted scores changed the plan";
    for (auto& c : permuted) c.score = -score(rng);
    out_p = plan_tiers(pol, permuted, b);
    ASSERT_EQ(out_p, out) << "trial " << trial << ": new scores changed the plan";

    // Nor does the order of the candidates: the plan follows each window.
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<RoutingCandidate> reordered(n);
    for (int i = 0; i < n; ++i) reordered[i] = in[perm[i]];
    out_p = plan_tiers(pol, reordered, b);
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(out_p[i], out[perm[i]]) << "trial " << trial << " window " << in[perm[i]].id;
  }
  // The random budgets exercised every outcome.
  EXPECT_GT(n_full_seen, 100);
  EXPECT_GT(n_quant_seen, 100);
  EXPECT_GT(n_evicted_seen, 100);
}

// Hand case: in strict mode the second-newest window's ledger makes it miss F; an older
// window that would fit the bytes left must still not take F (the recent window is
// contiguous); the next newest go to Q while it lasts, the oldest is evicted.
TEST(StreamingPolicy, OnceAWindowMissesFullNothingOlderTakesFull) {
  StreamingPolicy pol;
  std::vector<RoutingCandidate> in(5);
  for (int i = 0; i < 5; ++i) in[i].id = i;  // 4 is the newest
  in[3].has_ledger = true;
  in[0].score = 100.0;  // scores are ignored
  RoutingBudget b;
  b.window_full = 100;
  b.window_quant = 50;
  b.full_bytes = 220;   // 4 takes 100; 3 needs 150 > 120 left; 2 would fit 120 but must not
  b.quant_bytes = 149;  // two low-bit windows
  b.strict_ledger = true;
  std::vector<Tier> out;
  out = plan_tiers(pol, in, b);
  const std::vector<Tier> want = {Tier::kEvicted, Tier::kEvicted, Tier::kQuant, Tier::kQuant,
                                  Tier::kFull};
  EXPECT_EQ(plan_string(in, out), plan_string(in, want));
  // Not strict: the ledger is free, 4 and 3 fit F, then 2 and 1 go to Q, 0 is evicted.
  b.strict_ledger = false;
  out = plan_tiers(pol, in, b);
  const std::vector<Tier> want_lax = {Tier::kEvicted, Tier::kQuant, Tier::kQuant, Tier::kFull,
                                      Tier::kFull};
  EXPECT_EQ(plan_string(in, out), plan_string(in, want_lax));
}

// ---------------------------------------------------------------------------------------
// Streaming cache

KvShape small_shape() { return test::plain_shape(2, 4, 2, 16); }  // keys are not rotated

// Brute-force attention in double for one query token over the keys/values at the positions
// `keys` (f16-rounded, [pos][kv_width]); compares with `got` [n_q_heads * head_dim].
// Tolerance (f32 kernel vs double): each score carries at most ~d·eps·Σ|q_c k_c|/sqrt(d) of
// rounding, each exp weight a relative error of about twice that plus a few eps, which moves
// the output by at most twice that relative error times max|v|; summing n values adds n·eps.
// Returns the worst |got - want| / tol; `worst_at` describes it (index and both values).
double attention_error(const KvShape& s, const float* q, const std::vector<float>& keys_f16,
                       const std::vector<float>& vals_f16, const std::vector<int64_t>& keys,
                       const float* got, std::string* worst_at) {
  const int d = s.head_dim, g = s.group(), kvw = s.kv_width();
  const double scale = 1.0 / std::sqrt(double(d));
  const double eps = std::numeric_limits<float>::epsilon();
  double worst = 0.0;
  for (int hq = 0; hq < s.n_q_heads; ++hq) {
    const int hk = hq / g;
    const float* qh = q + hq * d;
    std::vector<double> sc(keys.size());
    double m = -std::numeric_limits<double>::infinity(), sabs = 0.0, vmax = 0.0;
    for (size_t i = 0; i < keys.size(); ++i) {
      const float* k = keys_f16.data() + size_t(keys[i]) * kvw + hk * d;
      double dot = 0.0, dabs = 0.0;
      for (int c = 0; c < d; ++c) {
        dot += double(qh[c]) * k[c];
        dabs += std::fabs(double(qh[c]) * k[c]);
      }
      sc[i] = dot * scale;
      sabs = std::max(sabs, dabs * scale);
      m = std::max(m, sc[i]);
      const float* v = vals_f16.data() + size_t(keys[i]) * kvw + hk * d;
      for (int c = 0; c < d; ++c) vmax = std::max(vmax, std::fabs(double(v[c])));
    }
    double l = 0.0;
    std::vector<double> o(d, 0.0);
    for (size_t i = 0; i < keys.size(); ++i) {
      const double w = std::exp(sc[i] - m);
      l += w;
      const float* v = vals_f16.data() + size_t(keys[i]) * kvw + hk * d;
      for (int c = 0; c < d; ++c) o[c] += w * v[c];
    }
    const double tol = vmax * eps * (4.0 * (d * sabs + 4.0) + 2.0 * double(keys.size()) + 16.0);
    for (int c = 0; c < d; ++c) {
      const double want = o[c] / l, have = got[hq * d + c];
      const double r = std::fabs(have - want) / tol;
      if (r > worst) {
        worst = r;
        *worst_at = "q head " + std::to_string(hq) + " dim " + std::to_string(c) + ": got " +
                    std::to_string(have) + " want " + std::to_string(want) + " tol " +
                    std::to_string(tol) + " (" + std::to_string(keys.size()) + " keys)";
      }
    }
  }
  return worst;
}

TEST(StreamingCache, KeepsSinkPlusConstantRecentWindowAndAttendsOverExactlyThose) {
  const KvShape shape = small_shape();
  KvCacheParams p;
  p.policy = "streaming";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  ASSERT_EQ(p.sink, 4);
  ASSERT_EQ(p.window, 1);
  ASSERT_EQ(p.route_every, 1);
  ASSERT_EQ(p.q, 0.0);
  const int64_t S = p.sink, L = p.local;  // L stays SPEC's 32
  // Byte formula (kvcache/budget.cpp):
  //   token_bytes = 2 (K,V) * n_kv_heads * head_dim * 2 B = 128, M_f = ω * token_bytes + the
  //   window's 32-B entry = 160, fixed = S * token_bytes + (ceil((L + Ω - 1)/ω) + 1) * M_f =
  //   4*128 + 33*160 = 5792 (Ω = 1), K_f = floor((1 - q) * (B - fixed) / M_f).
  const int64_t token_bytes = 2 * shape.n_kv_heads * shape.head_dim * 2;
  ASSERT_EQ(token_bytes, 128);
  const int64_t m_f = p.window * token_bytes + 32;
  const int64_t fixed =
      S * token_bytes + ((L + p.route_every - 1 + p.window - 1) / p.window + 1) * m_f;
  ASSERT_EQ(fixed, 5792);
  const int64_t k_f = 10;
  p.budget_bytes = fixed + k_f * m_f + 77;  // 77 spare bytes: less than one more window
  // Recent window R = L local tokens + K_f token-windows in F (q = 0: no low-bit tier).
  const int64_t R = L + k_f;

  for (int64_t prefill : {int64_t(30), int64_t(61)}) {
    SCOPED_TRACE("prefill " + std::to_string(prefill));
    const int64_t n_ctx = 160;
    auto made = make_kv_cache(shape, n_ctx, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    SequenceKvCache* c = made->get();
    ASSERT_EQ(report_of(*c).budget.kind, CacheKind::kWindowed);
    EXPECT_EQ(report_of(*c).budget.capacity_full, k_f) << c->describe();
    EXPECT_EQ(report_of(*c).budget.capacity_quant, 0) << c->describe();

    ThreadPool pool(2);
    std::mt19937 rng(4242);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int kvw = shape.kv_width(), qw = shape.q_width();
    // f16-rounded keys/values of every position, per layer: [layer][pos][kv_width].
    std::vector<std::vector<float>> hist_k(shape.n_layers, std::vector<float>(n_ctx * kvw)),
        hist_v = hist_k;
    std::vector<char> kept;  // expected retained positions before the step
    double worst = 0.0;
    int64_t n_past = 0;
    int64_t steps = 0;
    while (n_past < prefill + 70) {
      const int64_t n_new = n_past == 0 ? prefill : 1;
      ASSERT_TRUE(c->begin(n_new).is_ok());
      for (int l = 0; l < shape.n_layers; ++l) {
        std::vector<float> q(n_new * qw), k(n_new * kvw), v(n_new * kvw), o(n_new * qw);
        for (auto& x : q) x = 1.5f * dist(rng);
        for (auto& x : k) x = 1.5f * dist(rng);
        for (auto& x : v) x = dist(rng);
        for (size_t i = 0; i < k.size(); ++i) {
          hist_k[l][n_past * kvw + i] = f16_to_f32(f32_to_f16(k[i]));
          hist_v[l][n_past * kvw + i] = f16_to_f32(f32_to_f16(v[i]));
        }
        c->attend(l, q.data(), k.data(), v.data(), o.data(), pool);
        for (int64_t t = 0; t < n_new; ++t) {
          // Causal: the retained history plus this call's tokens up to t.
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < n_past; ++j)
            if (kept[j]) keys.push_back(j);
          for (int64_t j = n_past; j <= n_past + t; ++j) keys.push_back(j);
          std::string at;
          const double r = attention_error(shape, q.data() + t * qw, hist_k[l], hist_v[l], keys,
                                           o.data() + t * qw, &at);
          ASSERT_LE(r, 1.0) << "layer " << l << " position " << n_past + t << ", worst at " << at;
          worst = std::max(worst, r);
        }
      }
      ASSERT_TRUE(c->commit().is_ok());
      n_past += n_new;
      ++steps;
      ASSERT_EQ(c->n_past(), n_past);
      const KvReport rep = report_of(*c, ReportDetail::kTiers);
      EXPECT_EQ(rep.routing_events, steps) << "Ω = 1: every call routes";
      EXPECT_FALSE(rep.per_head);

      // Expected: sink [0, S), local = the newest L (never routed), F = the K_f before them,
      // everything in between evicted. Once n_past > S + R the kept count is S + R.
      const int64_t local_begin = std::max(S, n_past - L);
      const int64_t recent_begin = std::max(S, n_past - R);
      kept.assign(size_t(n_past), 0);
      for (int64_t j = 0; j < n_past; ++j) kept[j] = j < S || j >= recent_begin;
      const int64_t n_kept = std::count(kept.begin(), kept.end(), 1);
      EXPECT_EQ(n_kept, S + std::min(n_past - S, R)) << "n_past " << n_past;
      for (int l = 0; l < shape.n_layers; ++l) {
        {
          const std::vector<Tier>& tiers = rep.position_tiers[size_t(l)];
          ASSERT_EQ(tiers.size(), size_t(n_past));
          for (int64_t j = 0; j < n_past; ++j) {
            const Tier want = j < S               ? Tier::kLocal
                              : j >= local_begin  ? Tier::kLocal
                              : j >= recent_begin ? Tier::kFull
                                                  : Tier::kEvicted;
            ASSERT_EQ(tier_char(tiers[j]), tier_char(want))
                << "layer " << l << " position " << j << " n_past " << n_past << " (sink " << S
                << ", recent window [" << recent_begin << ", " << n_past << "), local from "
                << local_begin << ")";
          }
        }
      }
      const KvLayerReport& st = rep.layers[0];
      EXPECT_LE(st.windows_full, k_f);
      EXPECT_EQ(st.windows_quant, 0);
      for (int l = 0; l < shape.n_layers; ++l)
        EXPECT_LE(rep.layers[l].bytes_budgeted, rep.budget.total) << "n_past " << n_past;
    }
    EXPECT_GE(steps, 61);
    EXPECT_GT(n_past, S + R);  // the window filled and rolled
    EXPECT_GT(report_of(*c).layers[0].evictions, 0);
    EXPECT_LE(worst, 1.0);
  }
}

// ---------------------------------------------------------------------------------------
// Policy defaults and the factory

void expect_same_params(const KvCacheParams& a, const KvCacheParams& b, const std::string& what) {
  EXPECT_EQ(a.policy, b.policy) << what;
  EXPECT_EQ(a.q, b.q) << what;
  EXPECT_EQ(a.window, b.window) << what;
  EXPECT_EQ(a.route_every, b.route_every) << what;
  EXPECT_EQ(a.sink, b.sink) << what;
  EXPECT_EQ(a.local, b.local) << what;
  EXPECT_EQ(a.bits, b.bits) << what;
  EXPECT_EQ(a.value_bits, b.value_bits) << what;
  EXPECT_EQ(a.value_group, b.value_group) << what;
  EXPECT_EQ(a.strict_ledger, b.strict_ledger) << what;
  EXPECT_EQ(a.budget_fraction, b.budget_fraction) << what;
  EXPECT_EQ(a.budget_bytes, b.budget_bytes) << what;
}

KvCacheParams odd_params(const std::string& policy) {
  KvCacheParams p;
  p.policy = policy;
  p.q = 0.4;
  p.window = 16;
  p.route_every = 5;
  p.sink = 7;
  p.local = 48;
  p.bits = 4;
  p.budget_fraction = 0.25;
  return p;
}

KvParamsGiven all_given() {
  KvParamsGiven g;
  g.window = g.route_every = g.sink = g.local = g.q = g.bits = true;
  return g;
}

TEST(PolicyDefaults, StreamingSetsAuthorsDefaultsButKeepsGivenFields) {
  KvCacheParams p = odd_params("streaming");
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_EQ(p.sink, 4);
  EXPECT_EQ(p.window, 1);
  EXPECT_EQ(p.route_every, 1);
  EXPECT_EQ(p.q, 0.0);
  EXPECT_EQ(p.local, 48);  // not a streaming default
  EXPECT_EQ(p.bits, 4);

  p = odd_params("streaming");
  ASSERT_TRUE(apply_policy_defaults(&p, all_given()).is_ok());
  expect_same_params(p, odd_params("streaming"), "streaming, everything given");

  // Each flag protects its own field only.
  struct Case {
    const char* name;
    bool KvParamsGiven::*flag;
  };
  for (const Case& cs :
       {Case{"sink", &KvParamsGiven::sink}, Case{"window", &KvParamsGiven::window},
        Case{"route_every", &KvParamsGiven::route_every}, Case{"q", &KvParamsGiven::q}}) {
    KvParamsGiven g;
    g.*cs.flag = true;
    p = odd_params("streaming");
    ASSERT_TRUE(apply_policy_defaults(&p, g).is_ok()) << cs.name;
    const std::string n = cs.name;
    EXPECT_EQ(p.sink, n == "sink" ? 7 : 4) << n;
    EXPECT_EQ(p.window, n == "window" ? 16 : 1) << n;
    EXPECT_EQ(p.route_every, n == "route_every" ? 5 : 1) << n;
    EXPECT_EQ(p.q, n == "q" ? 0.4 : 0.0) << n;
  }
}

TEST(PolicyDefaults, H2oSetsTokenLevelDefaultsAndRejectsTierOptions) {
  KvCacheParams p = odd_params("h2o");
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_EQ(p.sink, 0);
  EXPECT_EQ(p.route_every, 1);
  EXPECT_TRUE(p.local_half_budget);
  EXPECT_EQ(p.window, 1);
  EXPECT_EQ(p.q, 0.0);

  // Given sink, Ω and local are kept.
  KvParamsGiven g;
  g.sink = g.route_every = g.local = true;
  p = odd_params("h2o");
  ASSERT_TRUE(apply_policy_defaults(&p, g).is_ok());
  EXPECT_EQ(p.sink, 7);
  EXPECT_EQ(p.route_every, 5);
  EXPECT_EQ(p.local, 48);
  EXPECT_EQ(p.window, 1);
  EXPECT_EQ(p.q, 0.0);

  // Window, q and bits have no meaning for h2o: giving any of them is an error.
  for (bool KvParamsGiven::*flag :
       {&KvParamsGiven::window, &KvParamsGiven::q, &KvParamsGiven::bits}) {
    KvParamsGiven bad;
    bad.*flag = true;
    p = odd_params("h2o");
    const Status st = apply_policy_defaults(&p, bad);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("h2o"), std::string::npos) << st.message();
  }
}

TEST(PolicyDefaults, FullChangesNothingAndQevictOnlyItsLowBitLayout) {
  for (const char* policy : {"qevict", "full"}) {
    const bool qevict = std::string(policy) == "qevict";
    for (const KvParamsGiven& g : {KvParamsGiven{}, all_given()}) {
      // What the row may change: qevict's low-bit layout (keys 4, values 2) unless --kv-bits
      // was given; nothing else, and nothing at all for full.
      auto expected = [&](KvCacheParams p) {
        if (qevict && !g.bits) {
          p.bits = 4;
          p.value_bits = 2;
        }
        return p;
      };
      KvCacheParams p = odd_params(policy);
      ASSERT_TRUE(apply_policy_defaults(&p, g).is_ok()) << policy;
      expect_same_params(p, expected(odd_params(policy)), policy);
      KvCacheParams d;  // SPEC defaults stay too
      d.policy = policy;
      KvCacheParams e = d;
      ASSERT_TRUE(apply_policy_defaults(&e, g).is_ok()) << policy;
      expect_same_params(e, expected(d), std::string(policy) + " defaults");
    }
  }
}

TEST(PolicyDefaults, QevictLowBitLayoutYieldsToEachFlag) {
  struct Case {
    bool bits_given;
    int bits;
    bool vbits_given;
    int value_bits;
    int want_bits, want_value_bits;
  };
  for (const Case& c : {Case{false, 2, false, 0, 4, 2},   // nothing given: K4V2
                        Case{true, 2, false, 0, 2, 0},    // --kv-bits 2: the paper's INT2
                        Case{true, 4, false, 0, 4, 0},    // --kv-bits 4: INT4
                        Case{true, 0, false, 0, 0, 0},    // --kv-bits auto
                        Case{false, 2, true, 4, 4, 4},    // --kv-value-bits 4 alone: INT4
                        Case{true, 2, true, 4, 2, 4}}) {  // K2V4
    KvCacheParams p;
    p.policy = "qevict";
    p.bits = c.bits;
    p.value_bits = c.value_bits;
    KvParamsGiven g;
    g.bits = c.bits_given;
    g.value_bits = c.vbits_given;
    ASSERT_TRUE(apply_policy_defaults(&p, g).is_ok());
    EXPECT_EQ(p.bits, c.want_bits) << c.bits_given << c.bits << c.vbits_given << c.value_bits;
    EXPECT_EQ(p.value_bits, c.want_value_bits)
        << c.bits_given << c.bits << c.vbits_given << c.value_bits;
  }
}

TEST(PolicyDefaults, H2oWithHalfBudgetLocalSplitsTheHeadCapacity) {
  const KvShape shape = small_shape();
  // Per token of a head: K + V f16, int32 position, f64 cumulative score (H2O's state).
  const size_t m = size_t(2 * 16 * 2 + 4 + 8);
  for (int sink : {0, 3}) {
    KvCacheParams p;
    p.policy = "h2o";
    KvParamsGiven g;
    g.sink = sink != 0;
    p.sink = sink;
    ASSERT_TRUE(apply_policy_defaults(&p, g).is_ok());
    ASSERT_TRUE(p.local_half_budget);
    // floor(B / n_kv_heads / M) = 42 tokens per head (with spare bytes below one token), of
    // which Ω = 1 is the token decode adds before routing: capacity C = 41.
    const int64_t C = 41;
    p.budget_bytes = int64_t((C + 1) * m * shape.n_kv_heads + m - 1);
    auto made = make_kv_cache(shape, 1000, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    SequenceKvCache* h = made->get();
    const KvReport r = report_of(*h, ReportDetail::kTiers);
    ASSERT_EQ(r.budget.kind, CacheKind::kPerHead) << h->describe();
    EXPECT_EQ(r.budget.head_token_bytes, m);
    const int64_t recent = (C - sink) / 2;  // floor((C - S) / 2)
    EXPECT_EQ(r.budget.head_capacity, C);
    EXPECT_EQ(r.budget.head_heavy, C - sink - recent);
    const std::string want = std::to_string(sink) + " sink + " + std::to_string(recent) +
                             " recent + " + std::to_string(C - sink - recent) + " heavy tokens";
    EXPECT_NE(h->describe().find(want), std::string::npos) << h->describe() << "\nwant " << want;
    EXPECT_TRUE(r.per_head);
  }
}

TEST(PolicyDefaults, FactoryErrors) {
  const KvShape shape = small_shape();
  KvCacheParams p;
  p.policy = "lru";
  p.budget_fraction = 0.5;
  auto made = make_kv_cache(shape, 100, p);
  ASSERT_FALSE(made.has_value());
  for (const char* name : {"lru", "full", "qevict", "streaming", "h2o"})
    EXPECT_NE(made.error().find(name), std::string::npos) << made.error();

  // h2o with a budget below one token per head (C = 0: no heavy hitter fits).
  p = KvCacheParams();
  p.policy = "h2o";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  const size_t m = size_t(2 * shape.head_dim * 2 + 4 + 8);  // one token of one head (H2O)
  p.budget_bytes = int64_t(m * shape.n_kv_heads - 1);
  made = make_kv_cache(shape, 100, p);
  ASSERT_FALSE(made.has_value());
  EXPECT_NE(made.error().find("budget"), std::string::npos) << made.error();
  // A given sink + local that fill the heads also leave no heavy hitter (11 tokens held per
  // head: capacity 10 and the Ω = 1 decode token).
  p.budget_bytes = int64_t(m * shape.n_kv_heads * 11);
  p.sink = 4;
  p.local = 6;
  p.local_half_budget = false;
  made = make_kv_cache(shape, 100, p);
  ASSERT_FALSE(made.has_value());
  EXPECT_NE(made.error().find("heavy"), std::string::npos) << made.error();
  p.local = 5;  // one heavy token: accepted
  made = make_kv_cache(shape, 100, p);
  EXPECT_TRUE(made.has_value()) << made.error();

  // The streaming cache needs the sink and local region covered.
  p = KvCacheParams();
  p.policy = "streaming";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  p.budget_bytes = 4736;  // exactly sink + local: nothing left for history
  made = make_kv_cache(shape, 100, p);
  ASSERT_FALSE(made.has_value());
  EXPECT_NE(made.error().find("sink"), std::string::npos) << made.error();
}

}  // namespace
}  // namespace qevict
