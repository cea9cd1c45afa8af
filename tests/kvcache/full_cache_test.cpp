// FullKvCache against a brute-force causal attention (double precision, on the same
// f16/bf16-rounded keys and values), across prefill chunks, decode steps, page boundaries
// and thread counts.
#include "kvcache/full_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/ref/ops_ref.h"

namespace qevict {
namespace {

struct Naive {
  KvShape shape;
  HalfType dt;
  std::vector<std::vector<float>> k, v;  // [layer][pos * kv_width], rounded to dt

  // out [n_new, q_width] for queries at positions [n_past, n_past + n_new).
  void attend(int layer, const float* q, int64_t n_past, int64_t n_new, std::vector<double>& out) {
    const int d = shape.head_dim, g = shape.group();
    out.assign(size_t(n_new * shape.q_width()), 0.0);
    for (int64_t t = 0; t < n_new; ++t) {
      const int64_t n_keys = n_past + t + 1;
      for (int hq = 0; hq < shape.n_q_heads; ++hq) {
        const int hk = hq / g;
        std::vector<double> s(n_keys);
        double mx = -1e300;
        for (int64_t j = 0; j < n_keys; ++j) {
          double acc = 0;
          for (int c = 0; c < d; ++c)
            acc += double(q[t * shape.q_width() + hq * d + c]) *
                   k[layer][j * shape.kv_width() + hk * d + c];
          s[j] = acc / std::sqrt(double(d));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < n_keys; ++j)
          for (int c = 0; c < d; ++c)
            out[t * shape.q_width() + hq * d + c] +=
                s[j] / sum * v[layer][j * shape.kv_width() + hk * d + c];
      }
    }
  }
};

void run_case(int n_threads, HalfType dt, std::vector<int64_t> steps) {
  KvShape shape;
  shape.n_layers = 2;
  shape.n_q_heads = 6;
  shape.n_kv_heads = 2;
  shape.head_dim = 20;  // not a multiple of any vector width
  ASSERT_TRUE(shape.validate());
  int64_t total = 0;
  for (auto s : steps) total += s;
  FullKvCache cache(shape, total, dt);
  Naive naive{shape, dt, std::vector<std::vector<float>>(2), std::vector<std::vector<float>>(2)};
  ThreadPool pool(n_threads);
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  for (int64_t n_new : steps) {
    ASSERT_TRUE(cache.begin(n_new).is_ok());
    const int64_t n_past = cache.n_past();
    for (int layer = 0; layer < 2; ++layer) {
      std::vector<float> q(n_new * shape.q_width()), k(n_new * shape.kv_width()), v(k.size());
      for (auto& x : q) x = dist(rng);
      for (auto& x : k) x = dist(rng);
      for (auto& x : v) x = dist(rng);
      for (size_t i = 0; i < k.size(); ++i) {
        naive.k[layer].push_back(ref::half_to_float(dt, ref::float_to_half(dt, k[i])));
        naive.v[layer].push_back(ref::half_to_float(dt, ref::float_to_half(dt, v[i])));
      }
      std::vector<float> out(q.size(), -999.0f);
      cache.attend(layer, q.data(), k.data(), v.data(), out.data(), pool);
      std::vector<double> want;
      naive.attend(layer, q.data(), n_past, n_new, want);
      double worst = 0;
      size_t wi = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double err = std::fabs(out[i] - want[i]);
        if (err > worst) worst = err, wi = i;
      }
      // values are O(1); errors come from f32 accumulation over up to ~600 keys.
      EXPECT_LT(worst, 2e-5) << "layer " << layer << " step at " << n_past << " worst index " << wi
                             << " got " << out[wi] << " want " << want[wi];
    }
    EXPECT_TRUE(cache.commit().is_ok());
    EXPECT_EQ(cache.n_past(), n_past + n_new);
  }
}

TEST(FullKvCache, MatchesNaiveAttentionSingleThread) {
  run_case(1, HalfType::kF16, {1, 5, 1, 1, 300, 1, 1});
}
TEST(FullKvCache, MatchesNaiveAttentionTwoThreads) {
  run_case(2, HalfType::kF16, {37, 256, 1, 1, 1, 2, 200, 1});
}
TEST(FullKvCache, MatchesNaiveAttentionBf16) { run_case(2, HalfType::kBF16, {100, 1, 157, 1}); }
TEST(FullKvCache, ManyThreadsFewTokens) { run_case(5, HalfType::kF16, {1, 1, 600, 1}); }

TEST(FullKvCache, RejectsOverflowAndEmptyCalls) {
  KvShape shape{1, 2, 1, 8, {}};
  FullKvCache cache(shape, 10);
  EXPECT_FALSE(cache.begin(0).is_ok());
  EXPECT_FALSE(cache.begin(11).is_ok());
  auto st = cache.begin(11);
  EXPECT_NE(st.message().find("context"), std::string::npos) << st.message();
  EXPECT_TRUE(cache.begin(10).is_ok());
}

TEST(FullKvCache, BytesGrowByPages) {
  KvShape shape{3, 4, 2, 16, {}};
  FullKvCache cache(shape, 4096);
  EXPECT_EQ(cache.bytes_held(), 0u);
  ASSERT_TRUE(cache.begin(1).is_ok());
  const size_t page =
      size_t(2) * FullKvCache::kPageTokens * 16 * 2 /*bytes*/ * 2 /*k,v*/ * 3 /*layers*/;
  EXPECT_EQ(cache.bytes_held(), page);
  EXPECT_TRUE(cache.commit().is_ok());
  ASSERT_TRUE(cache.begin(FullKvCache::kPageTokens).is_ok());
  EXPECT_EQ(cache.bytes_held(), 2 * page);
}

TEST(KvShape, ValidateRejectsBadShapes) {
  EXPECT_FALSE((KvShape{1, 3, 2, 8, {}}).validate().is_ok());
  EXPECT_FALSE((KvShape{0, 2, 2, 8, {}}).validate().is_ok());
  KvShape s{1, 2, 2, 8, {}};
  s.rope.n_rot = 9;
  EXPECT_FALSE(s.validate().is_ok());
}

}  // namespace
}  // namespace qevict
