// Long-run numerics of the tiered cache (issue 13 item 3): a synthetic stream (random q/k/v
// drawn from the position, no model) decoded for QEVICT_LONG_RUN_POSITIONS positions
// (default 20,000 in CI; ROBUSTNESS.md reports the 1,000,000-position run) through two
// budgeted caches side by side: qevict with its three tiers (sum scores) and two tiers F/E
// (q = 0, age scores). At 1K, 10K, 100K and 1M positions (those the run reaches, and its end):
//  - bytes held do not grow after 10K positions (pools reuse their slots; nothing sized by
//    the positions seen), the tier byte ledger equals window counts times window costs;
//  - cumulative scores stay finite, non-negative and at most one unit per query token;
//  - window ids keep counting (windows aged = positions routed / ω);
//  - the two-tier cache's attention output at the next step equals attention in double over
//    exactly the kept positions, whose keys were rotated at positions up to 1M (RoPE tables
//    composed from levels, SPEC §5) — so positions, windows and masks are right at the end.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "core/f16.h"
#include "kvcache/cache_peers.h"
#include "kvcache/factory.h"
#include "kvcache/slot_pool.h"

namespace qevict {
namespace {

int64_t long_run_positions() {
  const char* e = std::getenv("QEVICT_LONG_RUN_POSITIONS");
  return e && *e ? std::max<int64_t>(2000, std::atoll(e)) : 20000;
}

KvShape long_shape() { return test::rope_shape(2, 4, 2, 16); }

// The stream: position p's q/k/v of layer l, reproducible from (l, p) alone, so that the
// reference can rebuild any kept position's key without storing a million of them.
class Stream {
 public:
  explicit Stream(const KvShape& s) : s_(s), table_(size_t(1) << 16) {
    std::mt19937 rng(4242);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : table_) x = d(rng);
  }
  // What the cache is given (f32) for `n` positions from p0.
  void make(int l, int64_t p0, int64_t n, std::vector<float>* q, std::vector<float>* k,
            std::vector<float>* v) const {
    q->resize(size_t(n) * s_.q_width());
    k->resize(size_t(n) * s_.kv_width());
    v->resize(k->size());
    for (int64_t t = 0; t < n; ++t) {
      fill(l, p0 + t, 0, 2.0f, q->data() + size_t(t) * s_.q_width(), s_.q_width());
      fill(l, p0 + t, 1, 2.0f, k->data() + size_t(t) * s_.kv_width(), s_.kv_width());
      fill(l, p0 + t, 2, 1.0f, v->data() + size_t(t) * s_.kv_width(), s_.kv_width());
    }
  }
  // Key (what = 1) or value (2) of one position and KV head, rounded to f16 as the F tier
  // stores it, in double.
  void stored(int l, int64_t p, int what, int h, double* out) const {
    std::vector<float> row(size_t(s_.kv_width()));
    fill(l, p, what, what == 1 ? 2.0f : 1.0f, row.data(), s_.kv_width());
    for (int c = 0; c < s_.head_dim; ++c)
      out[c] = f16_to_f32(f32_to_f16(row[size_t(h * s_.head_dim + c)]));
  }

 private:
  void fill(int l, int64_t p, int what, float a, float* out, int n) const {
    uint64_t h = uint64_t(p) * 0x9E3779B97F4A7C15ull ^ (uint64_t(l) << 40) ^ (uint64_t(what) << 56);
    h ^= h >> 29;
    size_t at = size_t(h % table_.size());
    for (int i = 0; i < n; ++i) out[i] = a * table_[(at + size_t(i) * 7) & (table_.size() - 1)];
  }
  KvShape s_;
  std::vector<float> table_;
};

struct Checkpoint {
  int64_t pos = 0;
  size_t held = 0;
};

// Dense attention (double) of query head qh at position `pos` over `keys` (positions).
void dense(const KvShape& s, const Stream& st, int l, int qh, const float* q,
           const std::vector<int64_t>& keys, std::vector<double>* out) {
  const int d = s.head_dim, h = qh / s.group();
  std::vector<double> p(keys.size()), kv(static_cast<size_t>(d));
  double mx = -INFINITY, sum = 0.0;
  for (size_t i = 0; i < keys.size(); ++i) {
    st.stored(l, keys[i], 1, h, kv.data());
    double dot = 0.0;
    for (int c = 0; c < d; ++c) dot += double(q[c]) * kv[size_t(c)];
    p[i] = dot / std::sqrt(double(d));
    mx = std::max(mx, p[i]);
  }
  for (double& x : p) sum += x = std::exp(x - mx);
  out->assign(size_t(d), 0.0);
  for (size_t i = 0; i < keys.size(); ++i) {
    st.stored(l, keys[i], 2, h, kv.data());
    for (int c = 0; c < d; ++c) (*out)[size_t(c)] += p[i] / sum * kv[size_t(c)];
  }
}

TEST(LongRun, TieredCachesStayFlatAndExactOverTheRun) {
  const KvShape s = long_shape();
  const int64_t n_pos = long_run_positions();
  const Stream stream(s);
  ThreadPool pool(1);
  struct Run {
    const char* name;
    double q;
    const char* score;
    std::unique_ptr<SequenceKvCache> c;
    std::vector<Checkpoint> marks;
  };
  std::vector<Run> runs;
  runs.push_back({"qevict q=0.7 sum", 0.7, "sum", nullptr, {}});
  runs.push_back({"two-tier q=0 age", 0.0, "age", nullptr, {}});
  for (Run& r : runs) {
    KvCacheParams p;
    p.policy = "qevict";
    p.q = r.q;
    p.score = test::score_of(r.score);
    p.prefill_route = PrefillRoute::kChunk;
    // 256 tokens' worth of 16-bit K|V per layer: S + L + K_f (+ K_q) windows.
    p.budget_bytes = int64_t(256 * s.token_bytes());
    auto made = make_kv_cache(s, n_pos + 1, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    r.c = std::move(*made);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> q, k, v, o(size_t(s.q_width()));
  int64_t pos = 0;
  auto feed = [&](int64_t n) {
    for (Run& r : runs) {
      ASSERT_TRUE(r.c->begin(n).is_ok());
      for (int l = 0; l < s.n_layers; ++l) {
        stream.make(l, pos, n, &q, &k, &v);
        o.resize(q.size());
        r.c->attend(l, q.data(), k.data(), v.data(), o.data(), pool);
        for (float x : o) ASSERT_TRUE(std::isfinite(x)) << r.name << " at " << pos;
      }
      ASSERT_TRUE(r.c->commit().is_ok());
    }
    pos += n;
  };
  feed(64);  // a prompt chunk, then decode
  std::vector<int64_t> marks;
  for (int64_t m = 1000; m <= n_pos; m *= 10) marks.push_back(m);
  if (marks.back() != n_pos) marks.push_back(n_pos);
  for (int64_t mark : marks) {
    while (pos < mark - 1) {
      feed(1);
      if (::testing::Test::HasFailure()) return;
    }
    // The last step of the mark: the two-tier cache checked against the dense reference.
    Run& exact = runs[1];
    const KvReport before = report_of(*exact.c, ReportDetail::kTiers);
    for (Run& r : runs) {
      ASSERT_TRUE(r.c->begin(1).is_ok());
      for (int l = 0; l < s.n_layers; ++l) {
        stream.make(l, pos, 1, &q, &k, &v);
        o.resize(q.size());
        r.c->attend(l, q.data(), k.data(), v.data(), o.data(), pool);
        if (&r != &exact) continue;
        std::vector<int64_t> keys;
        const auto& tiers = before.position_tiers[size_t(l)];
        ASSERT_EQ(int64_t(tiers.size()), pos);
        for (int64_t x = 0; x < pos; ++x)
          if (tiers[size_t(x)] != Tier::kEvicted) keys.push_back(x);
        keys.push_back(pos);
        for (int qh = 0; qh < s.n_q_heads; ++qh) {
          std::vector<double> want;
          dense(s, stream, l, qh, q.data() + qh * s.head_dim, keys, &want);
          for (int c = 0; c < s.head_dim; ++c)
            ASSERT_NEAR(o[size_t(qh * s.head_dim + c)], want[size_t(c)],
                        1e-4 * std::sqrt(double(keys.size())))
                << "layer " << l << " head " << qh << " at position " << pos;
        }
      }
      ASSERT_TRUE(r.c->commit().is_ok());
    }
    ++pos;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (Run& r : runs) {
      const KvReport rep = report_of(*r.c, ReportDetail::kTiers);
      const KvLayerReport tot = rep.total();
      std::printf(
          "%-18s positions %8lld  held %8zu B  budget %zu B/layer  windows F %lld Q %lld  "
          "aged %lld  evictions %lld  promotions %lld  %.1f s\n",
          r.name, (long long)pos, rep.bytes_held, rep.budget.total, (long long)tot.windows_full,
          (long long)tot.windows_quant, (long long)tot.aged, (long long)tot.evictions,
          (long long)tot.promotions, secs);
      r.marks.push_back({pos, rep.bytes_held});
      for (int l = 0; l < s.n_layers; ++l) {
        const KvLayerReport& lr = rep.layers[size_t(l)];
        EXPECT_LE(lr.bytes_budgeted, rep.budget.total) << r.name;
        EXPECT_EQ(lr.bytes_full,
                  size_t(lr.windows_full + lr.windows_local) * rep.budget.window_full)
            << r.name;
        EXPECT_EQ(lr.bytes_quant, size_t(lr.windows_quant) * rep.budget.window_quant) << r.name;
        // Every window that left the local region was counted once: ids did not wrap.
        EXPECT_EQ(lr.aged, rep.budget.aged_windows(pos)) << r.name << " layer " << l;
        double sum = 0.0;
        for (double sc : rep.window_scores[size_t(l)]) {
          ASSERT_TRUE(std::isfinite(sc) && sc >= 0.0) << r.name;
          sum += sc;
        }
        EXPECT_LE(sum, double(pos) * (1.0 + 1e-5)) << r.name << " layer " << l;
      }
    }
  }
  // Flat from 10K on: at most one more pool chunk per tier and layer than at 10K (runs
  // shorter than 10K, as under the sanitizers, check the numerics only).
  for (const Run& r : runs) {
    if (r.marks.size() < 3) continue;
    const size_t at_10k = r.marks[1].held;
    for (size_t i = 2; i < r.marks.size(); ++i)
      EXPECT_LE(r.marks[i].held, at_10k + size_t(s.n_layers) * 2 * SlotPool::kChunkBytes)
          << r.name << " at " << r.marks[i].pos;
  }
}

}  // namespace
}  // namespace qevict
