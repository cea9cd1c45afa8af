// Randomized invariants of every registered cache and policy (issue 13 item 2): seeded random
// sequences of prefill chunks, decode steps, multi-token calls after the prompt, end_prompt(),
// explicit route() and clear(), on random small shapes (GQA groups 1-3, head_dim 16/32) and
// random options (budget, ω, Ω, S, L, q, bits, prefill route; quantizers: group, residual,
// bits). After every operation:
//  - n_past is what was fed; every attention output is finite;
//  - while no token has ever been quantized since the last clear, the outputs equal
//    attention (in double) over exactly the tokens the cache kept before the call plus the
//    call's own, causally; the reference is written from the interface contract, not from
//    any cache (keys and values rounded to the cache's 16-bit type);
//  - evicted positions never come back; every position of the tier map is accounted for;
//  - bytes: right after a routing event each layer's budgeted bytes are within its budget
//    (all layers together for the policies that move budget between layers); between events
//    by at most what the tokens since the last event add; the real bytes held stay within a
//    bound that does not grow with the sequence;
//  - windowed caches: the byte ledger of each tier equals its window count times the exact
//    per-window cost, and the live windows' cumulative scores are finite, non-negative and at
//    most one unit of mass per query token seen (SPEC §2: each query token spreads one unit).
// QEVICT_RANDOM_SEQUENCES sets the sequences per policy (default 10,000; the sanitizer pass of
// tools/test.sh runs fewer). A failure prints the policy, sequence seed and operation.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/bytes_bound.h"
#include "common/kv_names.h"
#include "common/random_wo.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/kvquant_cache.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

using test::RandomWo;

// Gaussian samples drawn once; a call's q/k/v are read from it at a random offset (the
// sequences' cost is then the caches', not the random number generator's).
const std::vector<float>& normal_table() {
  static const std::vector<float> t = [] {
    std::mt19937 rng(777);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(size_t(1) << 16);
    for (float& x : v) x = d(rng);
    return v;
  }();
  return t;
}

// n values a·N(0,1) from the table, starting at a random offset.
void fill_normal(std::mt19937& rng, float a, std::vector<float>* out) {
  const std::vector<float>& t = normal_table();
  size_t at = rng() % t.size();
  for (float& x : *out) {
    x = a * t[at];
    at = (at + 1) & (t.size() - 1);
  }
}

int sequences_per_policy() {
  const char* e = std::getenv("QEVICT_RANDOM_SEQUENCES");
  return e && *e ? std::max(1, std::atoi(e)) : 10000;
}

// One random configuration: shape, options, context.
struct Config {
  KvShape shape;
  KvCacheParams p;
  int64_t n_ctx = 0;
};

// Draws options for `row`; nullopt-like false when the registry row refuses them (then the
// caller draws again).
bool draw_config(const PolicyInfo& row, std::mt19937& rng, Config* c) {
  KvShape& s = c->shape;
  s.n_layers = 2;
  s.n_kv_heads = 1 + int(rng() % 2);
  s.n_q_heads = s.n_kv_heads * (1 + int(rng() % 3));
  s.head_dim = rng() % 2 ? 16 : 32;
  s.rope.n_rot = s.head_dim;
  s.rope.freq_base = 10000.0f;
  c->n_ctx = 16 + int64_t(rng() % 72);
  KvCacheParams& p = c->p;
  p = KvCacheParams{};
  p.policy = row.name;
  KvParamsGiven given;
  if (row.name == "zipcache") {  // no budget: its low bits, unimportant ratio and gap
    p.bits = rng() % 2 ? 2 : 4;
    p.q = std::array<double, 4>{0.0, 0.4, 0.7, 1.0}[rng() % 4];
    p.route_every = std::array<int, 4>{1, 3, 10, 100}[rng() % 4];
    given.bits = given.q = given.route_every = true;
    if (rng() % 2) {
      p.prefill_route = test::route_of(rng() % 2 ? "chunk" : "end");
      given.prefill_route = true;
    }
  } else if (row.name == "kvquant") {  // no budget: bits, outlier share, f16 first tokens
    p.bits = 2 + int(rng() % 3);
    p.q = std::array<double, 3>{0.0, 0.01, 0.1}[rng() % 3];
    p.sink = int(rng() % 3);
    given.bits = given.q = given.sink = true;
    // A calibration from random pre-RoPE keys and values of the test's scale.
    KvQuantConfig kc;
    kc.bits = p.bits;
    kc.sparsity = 1.0 - p.q;
    auto cal = std::make_shared<std::vector<KvQuantLayerCalib>>();
    const int64_t n_cal = 48;
    std::vector<float> ck(size_t(n_cal) * s.kv_width()), cv(ck.size());
    for (int l = 0; l < s.n_layers; ++l) {
      fill_normal(rng, 2.0f, &ck);
      fill_normal(rng, 1.0f, &cv);
      cal->push_back(kvquant_calibrate(kc, ck.data(), cv.data(), n_cal, s.kv_width()));
    }
    p.quant.kvquant_calib = cal;
  } else if (row.kind == CacheKind::kQuantized) {  // a quantizer (KIVI): no budget, its groups
    p.value_group = std::array<int, 3>{8, 16, 32}[rng() % 3];
    p.local = p.value_group * (1 + int(rng() % 2));
    p.bits = rng() % 2 ? 2 : 4;
    given.local = given.bits = true;
    if (rng() % 2) {
      p.prefill_route = test::route_of(rng() % 2 ? "chunk" : "end");
      given.prefill_route = true;
    }
  } else if (row.kind != CacheKind::kFull) {
    p.budget_fraction = 0.1 + 0.8 * double(rng() % 1000) / 1000.0;
    p.sink = int(rng() % 4);
    given.sink = true;
    p.route_every = std::array<int, 4>{1, 2, 4, 8}[rng() % 4];
    given.route_every = true;
    if (rng() % 2) {
      p.prefill_route = test::route_of(rng() % 2 ? "chunk" : "end");
      given.prefill_route = true;
    }
    if (row.kind == CacheKind::kWindowed) {
      p.window = std::array<int, 4>{1, 2, 4, 8}[rng() % 4];
      p.local = p.window * int(rng() % 3);
      p.q = std::array<double, 3>{0.0, 0.3, 0.7}[rng() % 3];
      p.bits = rng() % 2 ? 2 : 4;
      given.window = given.local = given.q = given.bits = true;
      if (row.uses_score && rng() % 2) p.score = ScoreMode::kAge;
      if (p.prefill_route == PrefillRoute::kEnd && rng() % 3 == 0) {
        p.prefill_window = 1 + int(rng() % 8);
        // --kv-adapt: either tier, switched at the first prompt end (and back on clear()).
        if (row.uses_score && rng() % 2)
          p.adapt = std::array<double, 3>{0.01, 0.5, 50.0}[rng() % 3];
      }
      given.prefill_window = true;  // 0 too: Eq. 1 stays in the mix (qevict's default is 32)
    } else {
      p.local = 1 + int(rng() % 8);
      given.local = true;
      // A budget in bytes the per-head cache can always fit (fit_head_budget charges the
      // observation window — the SnapKV family's w = 32 queries — and Ω decode tokens per
      // head): room for 1 to n_ctx heavy tokens of at most 2·head_dim·2 + 16 B.
      p.budget_fraction = 0.0;
      const int64_t heavy = 1 + int64_t(rng() % uint64_t(c->n_ctx));
      p.budget_bytes = int64_t(32) * s.q_width() * 4 +
                       int64_t(s.n_kv_heads) * (p.route_every + p.sink + p.local + heavy) *
                           (4 * s.head_dim + 16);
    }
  }
  if (!apply_policy_defaults(&p, given).is_ok()) return false;
  return p.validate().is_ok();
}

// The tier map of a cache: [unit][position] with units = layers (windowed) or layer × KV head.
std::vector<std::vector<Tier>> tiers_of(const SequenceKvCache& c) {
  return report_of(c, ReportDetail::kTiers).position_tiers;
}

class SequenceCheck {
 public:
  SequenceCheck(const PolicyInfo& row, const Config& cfg, uint32_t seed)
      : row_(row), cfg_(cfg), s_(cfg.shape), rng_(seed), seed_(seed) {}

  // Runs one random sequence; false when the options could not make a cache (not a failure:
  // e.g. a budget below the sink and local regions).
  // Operations whose outputs were compared with the dense reference.
  int64_t exact_checks() const { return exact_checks_; }

  bool run(ThreadPool& pool) {
    auto made = make_kv_cache(s_, cfg_.n_ctx, cfg_.p);
    if (!made.has_value()) return false;
    c_ = std::move(*made);
    kvq_ = dynamic_cast<KvQuantCache*>(c_.get());
    wo_ = std::make_unique<RandomWo>(s_, 12, rng_);
    const KvReport r0 = report_of(*c_);
    b_ = r0.budget;
    reset();
    const int n_ops = 4 + int(rng_() % 14);
    for (op_ = 0; op_ < n_ops; ++op_) {
      step(pool);
      if (::testing::Test::HasFailure()) return true;
    }
    return true;
  }

 private:
  std::string where() const {
    return fmt::format("policy {} seed {} op {} n_past {} ({})", row_.name, seed_, op_, n_past_,
                       c_ ? c_->describe() : "");
  }

  void reset() {
    n_past_ = 0;
    lossy_ = false;
    pending_ = false;
    since_ = 0;
    query_tokens_ = 0;
    events_ = report_of(*c_).routing_events;
    K_.assign(size_t(s_.n_layers), {});
    V_.assign(size_t(s_.n_layers), {});
    evicted_.clear();
  }

  void step(ThreadPool& pool) {
    const int64_t room = cfg_.n_ctx - n_past_;
    const uint32_t r = rng_() % 100;
    if (room == 0 || (n_past_ > 0 && r < 5)) {
      c_->clear();
      EXPECT_EQ(c_->n_past(), 0) << where();
      reset();
      return;
    }
    if (n_past_ > 0 && r < 15) {
      const Status st = c_->end_prompt();
      EXPECT_TRUE(st.is_ok()) << st.message() << " " << where();
      after_call(0);
      return;
    }
    if (n_past_ > 0 && r < 25) {
      const Status st = c_->route();
      EXPECT_TRUE(st.is_ok()) << st.message() << " " << where();
      after_call(0);
      return;
    }
    // A call: a prompt chunk at the start, else mostly decode steps, sometimes a chunk.
    int64_t n = 1;
    if (n_past_ == 0 || r < 40) n = 1 + int64_t(rng_() % 24);
    n = std::min(n, room);
    call(n, pool);
  }

  // One forward call of n tokens through every layer, checked against the reference.
  void call(int64_t n, ThreadPool& pool) {
    // What the cache held before the call (attention reads it, routing comes after).
    const std::vector<std::vector<Tier>> before = tiers_of(*c_);
    ASSERT_TRUE(c_->begin(n).is_ok()) << where();
    // KIVI quantizes a pending prompt when the first decode step begins (its reference
    // attends over the quantized prompt from the first decode token on).
    if (b_.kind == CacheKind::kQuantized && !kvq_ && report_of(*c_).total().windows_quant > 0)
      lossy_ = true;
    c_->set_output_projection(&wo_->proj);
    const int qw = s_.q_width(), kvw = s_.kv_width();
    // The queries whose outputs are compared: the call's last token and one other.
    const int64_t t_last = n - 1, t_any = int64_t(rng_() % uint32_t(n));
    for (int l = 0; l < s_.n_layers; ++l) {
      std::vector<float> q(size_t(n) * qw), k(size_t(n) * kvw), v(k.size());
      fill_normal(rng_, 2.0f, &q);
      fill_normal(rng_, 2.0f, &k);
      fill_normal(rng_, 1.0f, &v);
      std::vector<float> out(q.size(), NAN);
      c_->attend(l, q.data(), k.data(), v.data(), out.data(), pool);
      // KVQuant quantizes a token before it attends: the reference is attention over what
      // the cache holds, decoded (keys post-RoPE).
      if (kvq_)
        kvq_->export_layer(l, &K_[size_t(l)], &V_[size_t(l)]);
      else
        keep(l, k, v);
      for (float x : out) ASSERT_TRUE(std::isfinite(x)) << "layer " << l << " " << where();
      if (!lossy_) {
        check_attention(l, n, t_last, before, q, out);
        if (t_any != t_last) check_attention(l, n, t_any, before, q, out);
        ++exact_checks_;
      }
      if (::testing::Test::HasFailure()) return;
    }
    const Status st = c_->commit();
    ASSERT_TRUE(st.is_ok()) << st.message() << " " << where();
    n_past_ += n;
    query_tokens_ += n;
    if (n > 1 && cfg_.p.prefill_route == PrefillRoute::kEnd) pending_ = true;
    after_call(n);
  }

  void keep(int l, const std::vector<float>& k, const std::vector<float>& v) {
    for (const auto& [src, dst] : {std::pair{&k, &K_[size_t(l)]}, std::pair{&v, &V_[size_t(l)]}}) {
      std::vector<uint16_t> half(src->size());
      std::vector<float> back(src->size());
      f32_to_half(cfg_.p.dtype, src->data(), half.data(), int64_t(half.size()));
      half_to_f32(cfg_.p.dtype, half.data(), back.data(), int64_t(back.size()));
      dst->insert(dst->end(), back.begin(), back.end());
    }
  }

  bool per_head() const { return b_.kind == CacheKind::kPerHead; }

  // Attention of the call's query token t (of n) over the kept positions of `before` plus the
  // call's own tokens up to t, in double.
  void check_attention(int l, int64_t n, int64_t t, const std::vector<std::vector<Tier>>& before,
                       const std::vector<float>& q, const std::vector<float>& out) {
    const int d = s_.head_dim, g = s_.group(), kvw = s_.kv_width(), qw = s_.q_width();
    const double scale = 1.0 / std::sqrt(double(d));
    for (int h = 0; h < s_.n_kv_heads; ++h) {
      std::vector<int64_t> held;
      if (b_.kind == CacheKind::kFull) {
        for (int64_t x = 0; x < n_past_; ++x) held.push_back(x);
      } else {
        const auto& tiers = before[size_t(per_head() ? l * s_.n_kv_heads + h : l)];
        ASSERT_EQ(int64_t(tiers.size()), n_past_) << "tier map length, " << where();
        for (int64_t x = 0; x < n_past_; ++x)
          if (tiers[size_t(x)] != Tier::kEvicted) held.push_back(x);
      }
      for (int64_t i = 0; i <= t; ++i) held.push_back(n_past_ + i);
      (void)n;
      std::vector<double> p(held.size());
      for (int j = 0; j < g; ++j) {
        const int qh = h * g + j;
        const float* qr = q.data() + size_t(t) * qw + qh * d;
        double mx = -INFINITY, sum = 0.0;
        for (size_t i = 0; i < held.size(); ++i) {
          const float* kr = K_[size_t(l)].data() + size_t(held[i]) * kvw + h * d;
          double dot = 0.0;
          for (int c = 0; c < d; ++c) dot += double(qr[c]) * kr[c];
          p[i] = dot * scale;
          mx = std::max(mx, p[i]);
        }
        for (double& x : p) sum += x = std::exp(x - mx);
        for (int c = 0; c < d; ++c) {
          double want = 0.0, vmax = 0.0;
          for (size_t i = 0; i < held.size(); ++i) {
            const double x = V_[size_t(l)][size_t(held[i]) * kvw + h * d + c];
            want += p[i] / sum * x;
            vmax = std::max(vmax, std::fabs(x));
          }
          const double got = out[size_t(t) * qw + qh * d + c];
          const double tol = 2e-5 * (1.0 + vmax) * std::sqrt(double(held.size()));
          if (!(std::fabs(got - want) <= tol)) {
            FAIL() << "output " << got << " vs dense reference " << want << " (tolerance " << tol
                   << "): layer " << l << " head " << qh << " token " << t << ", " << where();
          }
        }
      }
    }
  }

  // Invariants after any operation (n: tokens the operation added).
  void after_call(int64_t n) {
    ASSERT_EQ(c_->n_past(), n_past_) << where();
    if (b_.kind == CacheKind::kFull) return;
    const KvReport rep = report_of(*c_, ReportDetail::kTiers);
    const bool event = rep.routing_events != events_;
    if (event) {
      events_ = rep.routing_events;
      pending_ = false;
      since_ = 0;
    } else if (n == 1) {
      ++since_;
    } else if (n > 1 && cfg_.p.prefill_route == PrefillRoute::kChunk && b_.budgeted()) {
      ADD_FAILURE() << "a prefill chunk under --prefill-route chunk did not route, " << where();
    }
    const KvLayerReport tot = rep.total();
    if ((tot.windows_quant > 0 || tot.quantizations > 0 || tot.quantized_units > 0) && !kvq_)
      lossy_ = true;

    // Tier map: one entry per position; evicted positions stay evicted.
    const size_t units = size_t(s_.n_layers) * (per_head() ? s_.n_kv_heads : 1);
    ASSERT_EQ(rep.position_tiers.size(), units) << where();
    evicted_.resize(units);
    for (size_t u = 0; u < units; ++u) {
      const auto& t = rep.position_tiers[u];
      ASSERT_EQ(int64_t(t.size()), n_past_) << "unit " << u << ", " << where();
      evicted_[u].resize(t.size(), false);
      for (size_t x = 0; x < t.size(); ++x) {
        if (evicted_[u][x]) {
          ASSERT_EQ(int(t[x]), int(Tier::kEvicted))
              << "position " << x << " came back, unit " << u << ", " << where();
        }
        if (t[x] == Tier::kEvicted) evicted_[u][x] = true;
      }
    }

    // --kv-adapt may give the low-bit tier another layout at a prompt's end (and clear() the
    // configured one back): its figures change, never the budget's total.
    ASSERT_EQ(rep.budget.total, b_.total) << where();
    b_ = rep.budget;
    if (b_.kind == CacheKind::kQuantized) {
      // A quantizer keeps every token: its stored bytes stay below the 16-bit cache's.
      // ZipCache adds per-set parameters (f16 key min/step and value scale per column, for
      // two sets) and an int32 list entry per token and head: more than f16 for a few tokens.
      const size_t fixed = row_.name == "zipcache"
                               ? size_t(2) * 6 * s_.kv_width() + size_t(n_past_) * s_.n_kv_heads * 8
                               : 0;
      for (const KvLayerReport& lr : rep.layers)
        ASSERT_LE(lr.bytes_budgeted, size_t(n_past_) * b_.token_bytes + fixed) << where();
      return;
    }
    // Budgeted bytes.
    if (!pending_) {
      const bool over_layers = row_.name == "pyramidkv" || row_.name == "layer-defensivekv";
      size_t slack = 0;
      if (!event) {
        slack = per_head() ? size_t(s_.n_kv_heads) * since_ * b_.head_token_bytes : 0;
      }
      size_t all = 0;
      for (int l = 0; l < s_.n_layers; ++l) {
        const size_t used = rep.layers[size_t(l)].bytes_budgeted;
        all += used;
        if (!over_layers) {
          ASSERT_LE(used, b_.total + slack)
              << "layer " << l << (event ? " right after a routing event" : "") << ", " << where();
        }
      }
      ASSERT_LE(all, s_.n_layers * (b_.total + slack)) << where();
      // Real bytes: nothing that grows with the positions seen.
      size_t bound = 0;
      if (per_head()) {
        const size_t M = b_.head_token_bytes + 4;
        bound =
            s_.n_layers *
                (b_.total / b_.head_token_bytes +
                 size_t(s_.n_kv_heads) * (cfg_.p.route_every + 41)) *
                M +
            size_t(s_.n_layers) * 64 * s_.q_width() * 4 + 64 * 1024 +
            size_t(s_.n_kv_heads) * (b_.head_capacity + cfg_.p.route_every + 41) * 96 * s_.group();
      } else {
        bound = size_t(1.05 * double(s_.n_layers * b_.total)) + bytes_held_constant(s_, b_) +
                size_t(tot.bytes_ledger_of_full) + s_.n_layers * 48 * b_.token_bytes;
      }
      ASSERT_LE(c_->bytes_held(), bound) << where();
    }

    if (per_head()) return;
    // Windowed caches: each tier's bytes are its windows times the exact window cost.
    for (int l = 0; l < s_.n_layers; ++l) {
      const KvLayerReport& lr = rep.layers[size_t(l)];
      // The F pool holds routed F windows and the local region's (the newest one partial).
      ASSERT_EQ(lr.bytes_full, size_t(lr.windows_full + lr.windows_local) * b_.window_full)
          << where();
      ASSERT_EQ(lr.bytes_quant, size_t(lr.windows_quant) * b_.window_quant) << where();
      ASSERT_EQ(lr.bytes_ledger_of_full % std::max<size_t>(b_.quant_slot(), 1), 0u) << where();
      ASSERT_LE(lr.bytes_ledger_of_full, size_t(lr.windows_full) * b_.window_quant) << where();
      // The sink is stored whole from its first token on (and kept by clear()).
      ASSERT_TRUE(lr.bytes_sink == 0 || lr.bytes_sink == size_t(b_.sink) * b_.token_bytes)
          << lr.bytes_sink << ", " << where();
      ASSERT_EQ(lr.bytes_budgeted, lr.bytes_sink + lr.bytes_full + lr.bytes_quant +
                                       (b_.strict_ledger ? lr.bytes_ledger_of_full : 0))
          << where();
      if (l < int(rep.window_scores.size())) {
        double sum = 0.0;
        for (double sc : rep.window_scores[size_t(l)]) {
          ASSERT_TRUE(std::isfinite(sc) && sc >= 0.0) << sc << ", " << where();
          sum += sc;
        }
        ASSERT_LE(sum, double(query_tokens_) * (1.0 + 1e-5) + 1e-6) << where();
      }
    }
  }

  const PolicyInfo& row_;
  const Config& cfg_;
  const KvShape s_;
  std::mt19937 rng_;
  const uint32_t seed_;
  std::unique_ptr<SequenceKvCache> c_;
  std::unique_ptr<RandomWo> wo_;
  KvBudget b_;
  int op_ = 0;
  int64_t exact_checks_ = 0;
  int64_t n_past_ = 0, since_ = 0, query_tokens_ = 0, events_ = 0;
  bool lossy_ = false, pending_ = false;
  KvQuantCache* kvq_ = nullptr;            // the cache, when it is KVQuant's
  std::vector<std::vector<float>> K_, V_;  // [layer] 16-bit-rounded [position][kv_width]
  std::vector<std::vector<bool>> evicted_;
};

class RandomOps : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomOps, InvariantsHoldAfterEveryOperation) {
  const PolicyInfo* row = find_policy(GetParam());
  ASSERT_NE(row, nullptr);
  ThreadPool pool(1);
  const int n_seq = sequences_per_policy();
  int made = 0, drawn = 0;
  int64_t exact = 0;
  // Draws until n_seq sequences have run (some options ask for a budget below the fixed
  // regions: make_kv_cache refuses them, and they are drawn again).
  for (int i = 0; made < n_seq && i < 3 * n_seq; ++i, ++drawn) {
    const uint32_t seed = uint32_t(std::hash<std::string>{}(row->name)) ^ uint32_t(i * 2654435761u);
    std::mt19937 rng(seed);
    Config cfg;
    if (!draw_config(*row, rng, &cfg)) continue;
    SequenceCheck seq(*row, cfg, seed);
    if (seq.run(pool)) ++made;
    exact += seq.exact_checks();
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_EQ(made, n_seq) << "of " << drawn << " drawn";
  // The dense comparison must have run (caches that quantize stop it for the sequence).
  EXPECT_GE(exact, int64_t(made)) << "layer calls compared with the dense reference";
  std::printf("%s: %d random sequences ran (%d drawn), %lld layer calls compared exactly\n",
              row->name.c_str(), made, drawn, (long long)exact);
}

std::vector<std::string> registered_names() {
  std::vector<std::string> out;
  for (const auto& r : policy_registry()) out.push_back(r.name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, RandomOps, ::testing::ValuesIn(registered_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace qevict
