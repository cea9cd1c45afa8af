// Tests the diagnostics hooks (SPEC §8): AttentionObserver, position_tiers, routing_events.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/kv_shape.h"
#include "core/f16.h"
#include "kernels/kv_quant.h"
#include "kvcache/cache_peers.h"
#include "kvcache/full_cache.h"
#include "kvcache/params.h"
#include "kvcache/tiered_cache.h"

namespace qevict {
namespace {

KvShape gqa_shape() { return test::plain_shape(2, 4, 2, 16); }  // group 2, no RoPE

class Recorder final : public AttentionObserver {
 public:
  struct Call {
    int layer;
    int64_t n_keys;
    std::vector<float> probs;  // [n_kv_heads][n_keys]
  };
  explicit Recorder(int n_kv_heads) : n_kv_heads_(n_kv_heads) {}
  void on_attention(int layer, int64_t n_keys, const float* probs) override {
    calls.push_back({layer, n_keys, std::vector<float>(probs, probs + n_kv_heads_ * n_keys)});
  }
  std::vector<Call> calls;

 private:
  int n_kv_heads_;
};

// Random q/k/v for one forward call of n tokens through every layer. Keeps the f16-rounded
// keys of every position ([layer][pos][kv_width]) and the queries of the call
// ([layer][n][q_width]).
struct Driver {
  KvShape shape = gqa_shape();
  std::mt19937 rng{777};
  std::normal_distribution<float> dist{0.0f, 1.0f};
  std::vector<std::vector<float>> keys;     // f16-rounded
  std::vector<std::vector<float>> queries;  // of the last call

  void step(SequenceKvCache& c, int64_t n, ThreadPool& pool) {
    const int qw = shape.q_width(), kvw = shape.kv_width();
    const int64_t p0 = c.n_past();
    keys.resize(shape.n_layers);
    queries.assign(shape.n_layers, {});
    ASSERT_TRUE(c.begin(n).is_ok());
    for (int l = 0; l < shape.n_layers; ++l) {
      std::vector<float> q(n * qw), k(n * kvw), v(n * kvw), o(n * qw);
      for (auto& x : q) x = 2.0f * dist(rng);
      for (auto& x : k) x = 2.0f * dist(rng);
      for (auto& x : v) x = dist(rng);
      keys[l].resize(size_t(p0 + n) * kvw);
      for (size_t i = 0; i < k.size(); ++i)
        keys[l][size_t(p0) * kvw + i] = f16_to_f32(f32_to_f16(k[i]));
      queries[l] = q;
      c.attend(l, q.data(), k.data(), v.data(), o.data(), pool);
    }
    EXPECT_TRUE(c.commit().is_ok());
  }
};

// Brute force in double: probs[h][j] = (1/g) Σ_{query heads of h} Σ_t softmax_t(j) over the
// causal keys [0, p0 + t] of query token t.
std::vector<double> brute_probs(const KvShape& s, const std::vector<float>& keys,
                                const std::vector<float>& q, int64_t p0, int64_t n_new) {
  const int d = s.head_dim, g = s.group(), kvw = s.kv_width(), qw = s.q_width();
  const int64_t n_keys = p0 + n_new;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> out(size_t(s.n_kv_heads) * n_keys, 0.0);
  for (int h = 0; h < s.n_kv_heads; ++h) {
    for (int j = 0; j < g; ++j) {
      for (int64_t t = 0; t < n_new; ++t) {
        const float* qh = q.data() + t * qw + (h * g + j) * d;
        const int64_t n = p0 + t + 1;
        std::vector<double> sc(n);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < n; ++i) {
          double dot = 0.0;
          for (int c = 0; c < d; ++c) dot += double(qh[c]) * keys[size_t(i) * kvw + h * d + c];
          sc[i] = dot * scale;
          m = std::max(m, sc[i]);
        }
        double l = 0.0;
        for (int64_t i = 0; i < n; ++i) l += std::exp(sc[i] - m);
        for (int64_t i = 0; i < n; ++i) out[size_t(h) * n_keys + i] += std::exp(sc[i] - m) / l / g;
      }
    }
  }
  return out;
}

TEST(AttentionObserver, FullCacheReportsCausalProbabilitiesPerKvHead) {
  Driver d;
  ThreadPool pool(2);
  const int64_t n_ctx = 300;
  FullKvCache c(d.shape, n_ctx);
  Recorder rec(d.shape.n_kv_heads);
  c.set_attention_observer(&rec);
  const double eps = std::numeric_limits<float>::epsilon();
  double worst = 0.0;
  size_t n_calls = 0;
  // A 37-token prefill, a 19-token chunk, decode steps, then a chunk that crosses the
  // 256-token page and more decode steps.
  std::vector<int64_t> calls = {37, 19, 1, 1, 1, 1, 1, 190, 1, 1, 1, 1, 1, 1, 1, 1};
  for (int64_t n_new : calls) {
    const int64_t p0 = c.n_past();
    d.step(c, n_new, pool);
    ASSERT_EQ(rec.calls.size(), n_calls + d.shape.n_layers) << "one report per attend()";
    for (int l = 0; l < d.shape.n_layers; ++l) {
      const Recorder::Call& call = rec.calls[n_calls + l];
      EXPECT_EQ(call.layer, l);
      ASSERT_EQ(call.n_keys, p0 + n_new);
      ASSERT_EQ(call.probs.size(), size_t(d.shape.n_kv_heads) * call.n_keys);
      const std::vector<double> want = brute_probs(d.shape, d.keys[l], d.queries[l], p0, n_new);
      for (int h = 0; h < d.shape.n_kv_heads; ++h) {
        // Each row sums to n_new. The f32 report accumulates n_new softmaxes of up to
        // n_keys terms: at most ~n_new * n_keys * eps of rounding in the sum.
        double sum = 0.0;
        for (int64_t i = 0; i < call.n_keys; ++i) sum += call.probs[size_t(h) * call.n_keys + i];
        EXPECT_NEAR(sum, double(n_new), std::max(1e-4, double(n_new * call.n_keys) * eps))
            << "layer " << l << " head " << h << " n_past " << p0 << " n_new " << n_new;
        // Per position: 1e-5 for one query; each of the n_new summed float terms adds up to
        // ~4 eps of its value. Reports the worst position with both values.
        double row_worst = 0.0, row_got = 0.0, row_want = 0.0;
        int64_t row_at = -1;
        for (int64_t i = 0; i < call.n_keys; ++i) {
          const double w = want[size_t(h) * call.n_keys + i];
          const double got = call.probs[size_t(h) * call.n_keys + i];
          const double r = std::fabs(got - w) / (1e-5 + 4.0 * double(n_new) * eps * w);
          if (r > row_worst) {
            row_worst = r;
            row_got = got;
            row_want = w;
            row_at = i;
          }
        }
        ASSERT_LE(row_worst, 1.0) << "layer " << l << " head " << h << " position " << row_at
                                  << ": got " << row_got << " want " << row_want << " (n_past "
                                  << p0 << ", n_new " << n_new << ")";
        worst = std::max(worst, row_worst);
        // Causal: the newest key gets mass only from the last query.
        EXPECT_GT(call.probs[size_t(h) * call.n_keys + call.n_keys - 1], 0.0f);
      }
    }
    n_calls += d.shape.n_layers;
  }
  EXPECT_LE(worst, 1.0);

  // nullptr stops the reports.
  c.set_attention_observer(nullptr);
  d.step(c, 1, pool);
  d.step(c, 3, pool);
  EXPECT_EQ(rec.calls.size(), n_calls);
}

TEST(PositionTiers, TieredCacheReportsSinkWindowTiersAndLocal) {
  const KvShape shape = gqa_shape();
  KvCacheParams p;
  p.policy = "qevict";
  p.sink = 3;
  p.window = 4;
  p.local = 8;
  p.q = 0.5;
  p.route_every = 3;
  // M_f = 2 * n_kv_heads * ω * head_dim * 2 B + the 32-B entry = 544; fixed = S * 128 +
  // (ceil((L + Ω - 1)/ω) + 1) * M_f = 384 + 4 * 544 = 2560.
  // B_hist = 2176: K_f = floor(0.5 * 2176 / 544) = 2, K_q = floor(0.5 * 2176 / M_q), M_q =
  // the low-bit window + the entry.
  const QuantLayout ql{p.bits, shape.n_kv_heads, shape.head_dim, p.window, 0};
  const int64_t m_f = 2 * shape.n_kv_heads * p.window * shape.head_dim * 2 + 32;
  const int64_t fixed =
      p.sink * 128 + ((p.local + p.route_every - 1 + p.window - 1) / p.window + 1) * m_f;
  ASSERT_EQ(m_f, 544);
  ASSERT_EQ(fixed, 2560);
  p.budget_bytes = fixed + 2176;
  const int64_t k_f = 2, k_q = int64_t(1088 / (ql.window_bytes() + 32));
  ASSERT_GE(k_q, 1);
  auto c = TieredKvCacheTestPeer::make(shape, 400, p);
  ASSERT_NE(c, nullptr);
  const WindowStore& store = TieredKvCacheTestPeer(*c).store();
  KvReport rep = report_of(*c, ReportDetail::kTiers);
  ASSERT_EQ(rep.budget.capacity_full, k_f) << c->describe();
  ASSERT_EQ(rep.budget.capacity_quant, k_q) << c->describe();
  EXPECT_FALSE(rep.per_head);
  EXPECT_EQ(rep.routing_events, 0);

  Driver d;
  ThreadPool pool(2);
  const int64_t S = p.sink, W = p.window, L = p.local;
  int64_t events = 0, decode_since_route = 0, n_routed_at = 0;
  // Prefill, decode steps, a second chunk, more decode steps (Ω = 3).
  std::vector<int64_t> calls = {61};
  for (int i = 0; i < 5; ++i) calls.push_back(1);
  calls.push_back(7);
  for (int i = 0; i < 40; ++i) calls.push_back(1);
  bool saw_f = false, saw_q = false, saw_e = false;
  for (int64_t n_new : calls) {
    d.step(*c, n_new, pool);
    const int64_t n_past = c->n_past();
    if (n_new > 1 || ++decode_since_route == p.route_every) {
      ++events;
      decode_since_route = 0;
      n_routed_at = n_past;
    }
    rep = report_of(*c, ReportDetail::kTiers);
    ASSERT_EQ(rep.routing_events, events) << "after a call of " << n_new << " at " << n_past;
    // Windows wholly outside the local region at the last routing event have been routed;
    // windows still in the local region are kLocal.
    const int64_t aged_now = std::max<int64_t>(0, (n_past - L - S) / W);
    const int64_t routed = std::max<int64_t>(0, (n_routed_at - L - S) / W);
    for (int l = 0; l < shape.n_layers; ++l) {
      ASSERT_EQ(store.n_windows(l), (n_past - S + W - 1) / W);
      ASSERT_EQ(rep.window_scores[size_t(l)].size(), size_t(store.n_windows(l)));
      int64_t n_f = 0, n_q = 0;
      for (int32_t w = 0; w < store.n_windows(l); ++w) {
        const Tier t = store.window(l, w).tier;
        if (w < routed) {
          EXPECT_NE(t, Tier::kLocal) << "window " << w << " routed at n_past " << n_routed_at;
        }
        if (w >= aged_now) {
          EXPECT_EQ(t, Tier::kLocal) << "window " << w << " still local at n_past " << n_past;
        }
        n_f += t == Tier::kFull;
        n_q += t == Tier::kQuant;
        saw_f |= t == Tier::kFull;
        saw_q |= t == Tier::kQuant;
        saw_e |= t == Tier::kEvicted;
      }
      EXPECT_LE(n_f, k_f) << "n_past " << n_past;
      EXPECT_LE(n_q, k_q) << "n_past " << n_past;
      {
        const std::vector<Tier>& tiers = rep.position_tiers[size_t(l)];
        ASSERT_EQ(tiers.size(), size_t(n_past));
        for (int64_t j = 0; j < n_past; ++j) {
          const Tier want = j < S ? Tier::kLocal : store.window(l, int32_t((j - S) / W)).tier;
          ASSERT_EQ(tier_char(tiers[j]), tier_char(want))
              << "layer " << l << " position " << j << " n_past " << n_past;
        }
      }
    }
  }
  EXPECT_TRUE(saw_f);
  EXPECT_TRUE(saw_q);
  EXPECT_TRUE(saw_e);
  EXPECT_EQ(events, 2 + 1 + 13);  // two chunks; 5 decode steps → 1 event; 40 → 13 events
}

class TierMassRecorder final : public TierMassObserver {
 public:
  struct Call {
    int layer;
    int64_t n_keys;
    double mass[4];
  };
  void on_tier_mass(int layer, int64_t n_keys, const double* mass) override {
    calls.push_back({layer, n_keys, {mass[0], mass[1], mass[2], mass[3]}});
  }
  std::vector<Call> calls;
};

// Brute force in double of a tiered cache's attention by tier for one call: the causal keys
// [0, p0 + t] of query token t that the cache holds (positions before the call: not evicted
// in `tiers`, the map before the call; the call's own: local), softmax per query head, summed
// per tier over the tokens and averaged over the query heads.
std::vector<double> brute_tier_mass(const KvShape& s, const std::vector<float>& keys,
                                    const std::vector<float>& q, int64_t p0, int64_t n_new,
                                    const std::vector<Tier>& tiers) {
  const int d = s.head_dim, g = s.group(), kvw = s.kv_width(), qw = s.q_width();
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> out(4, 0.0);
  for (int h = 0; h < s.n_kv_heads; ++h)
    for (int j = 0; j < g; ++j)
      for (int64_t t = 0; t < n_new; ++t) {
        const float* qh = q.data() + t * qw + (h * g + j) * d;
        std::vector<std::pair<double, Tier>> sc;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i <= p0 + t; ++i) {
          const Tier tier = i < p0 ? tiers[size_t(i)] : Tier::kLocal;
          if (tier == Tier::kEvicted) continue;
          double dot = 0.0;
          for (int x = 0; x < d; ++x) dot += double(qh[x]) * keys[size_t(i) * kvw + h * d + x];
          sc.push_back({dot * scale, tier});
          m = std::max(m, dot * scale);
        }
        double l = 0.0;
        for (const auto& e : sc) l += std::exp(e.first - m);
        for (const auto& e : sc) out[int(e.second)] += std::exp(e.first - m) / l / s.n_q_heads;
      }
  return out;
}

// The tiered cache's own attention by tier (TierMassObserver): with F and E only (q = 0) it
// is the exact attention over the windows it holds, split by the tiers of the report before
// the call; with a low-bit tier every call's masses sum to its queries, none on E, and Q
// windows get mass exactly when the layer holds some.
TEST(TierMassObserver, TieredCacheReportsEachCallsMassByTier) {
  for (const double q_share : {0.0, 0.5}) {
    SCOPED_TRACE(q_share);
    const KvShape shape = gqa_shape();
    KvCacheParams p;
    p.policy = "qevict";
    p.sink = 3;
    p.window = 4;
    p.local = 8;
    p.q = q_share;
    p.route_every = 3;
    p.budget_bytes = 2560 + 2176;  // as PositionTiers: K_f = 4 (q = 0) or 2, with K_q ≥ 1
    auto c = TieredKvCacheTestPeer::make(shape, 400, p);
    ASSERT_NE(c, nullptr);
    TierMassRecorder rec;
    c->set_tier_mass_observer(&rec);
    Driver d;
    ThreadPool pool(2);
    std::vector<int64_t> calls = {61};
    for (int i = 0; i < 5; ++i) calls.push_back(1);
    calls.push_back(7);
    for (int i = 0; i < 40; ++i) calls.push_back(1);
    double worst = 0.0;
    bool saw_q = false, saw_e = false;
    for (int64_t n_new : calls) {
      const int64_t p0 = c->n_past();
      const KvReport before = report_of(*c, ReportDetail::kTiers);
      const size_t first = rec.calls.size();
      d.step(*c, n_new, pool);
      ASSERT_EQ(rec.calls.size(), first + shape.n_layers) << "one report per attend()";
      for (int l = 0; l < shape.n_layers; ++l) {
        const TierMassRecorder::Call& call = rec.calls[first + size_t(l)];
        EXPECT_EQ(call.layer, l);
        ASSERT_EQ(call.n_keys, p0 + n_new);
        const std::vector<Tier>& tiers = before.position_tiers[size_t(l)];
        const bool holds_q = std::count(tiers.begin(), tiers.end(), Tier::kQuant) > 0;
        saw_q |= holds_q;
        saw_e |= std::count(tiers.begin(), tiers.end(), Tier::kEvicted) > 0;
        EXPECT_EQ(call.mass[int(Tier::kEvicted)], 0.0);
        EXPECT_EQ(call.mass[int(Tier::kQuant)] > 0.0, holds_q) << "n_past " << p0 << " layer " << l;
        EXPECT_NEAR(call.mass[0] + call.mass[1] + call.mass[2] + call.mass[3], double(n_new),
                    1e-4 * double(n_new));
        if (q_share > 0.0) continue;
        const std::vector<double> want =
            brute_tier_mass(shape, d.keys[size_t(l)], d.queries[size_t(l)], p0, n_new, tiers);
        for (int t = 0; t < 4; ++t) {
          const double err = std::fabs(call.mass[t] - want[size_t(t)]);
          worst = std::max(worst, err / double(n_new));
          ASSERT_LE(err, 1e-4 * double(n_new))
              << "tier " << tier_char(Tier(t)) << " n_past " << p0 << " n_new " << n_new
              << " layer " << l << ": got " << call.mass[t] << " want " << want[size_t(t)];
        }
      }
    }
    EXPECT_EQ(saw_q, q_share > 0.0);
    EXPECT_TRUE(saw_e);
    if (q_share == 0.0) {
      EXPECT_GT(worst, 0.0) << "the brute force ran";
    }
    // nullptr stops the reports.
    c->set_tier_mass_observer(nullptr);
    const size_t n = rec.calls.size();
    d.step(*c, 1, pool);
    EXPECT_EQ(rec.calls.size(), n);
  }
}

TEST(PositionTiers, DefaultsDescribeACacheThatKeepsEverything) {
  Driver d;
  ThreadPool pool(2);
  FullKvCache c(d.shape, 100);
  EXPECT_TRUE(report_of(c, ReportDetail::kTiers).position_tiers[0].empty());
  for (int64_t n_new : {int64_t(23), int64_t(1), int64_t(1), int64_t(9), int64_t(1)}) {
    d.step(c, n_new, pool);
    const KvReport rep = report_of(c, ReportDetail::kTiers);
    ASSERT_EQ(rep.position_tiers.size(), size_t(d.shape.n_layers));
    for (int l = 0; l < d.shape.n_layers; ++l) {
      const auto& tiers = rep.position_tiers[size_t(l)];
      ASSERT_EQ(tiers.size(), size_t(c.n_past()));
      for (size_t j = 0; j < tiers.size(); ++j)
        ASSERT_EQ(tiers[j], Tier::kFull) << "layer " << l << " position " << j;
    }
  }
  const KvReport rep = report_of(c);
  EXPECT_FALSE(rep.per_head);
  EXPECT_EQ(rep.routing_events, 0);
  EXPECT_FALSE(rep.budget.budgeted());
}

}  // namespace
}  // namespace qevict
