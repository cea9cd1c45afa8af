// What a new quantizer needs, from a test alone: its cache (here a toy that rounds every key
// and value to 8 bits with one scale per token and head, then attends as FullKV does) and one
// registry row with make_cache and max_bytes. The row is found by the shared option parser,
// listed in --kv-policy's help, built by make_kv_cache and bounded by max_cache_bytes, with no
// edit to the factory or the scheduler.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/kv_shape.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/options.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

// Rounds each head's row of x (f32 [n][n_kv_heads · d]) to int8 with a scale of max|x| / 127.
void round_int8(float* x, int64_t n, int heads, int d) {
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h) {
      float* r = x + (t * heads + h) * d;
      float m = 0.0f;
      for (int i = 0; i < d; ++i) m = std::max(m, std::fabs(r[i]));
      const float s = m > 0.0f ? m / 127.0f : 1.0f;
      for (int i = 0; i < d; ++i) r[i] = std::round(r[i] / s) * s;
    }
}

// The toy quantizer's cache: FullKV storage of the rounded keys and values.
class ToyInt8Cache final : public SequenceKvCache {
 public:
  ToyInt8Cache(const KvShape& s, int64_t n_ctx) : shape_(s), inner_(s, n_ctx, HalfType::kF16) {}
  int64_t n_past() const override { return inner_.n_past(); }
  int64_t n_ctx() const override { return inner_.n_ctx(); }
  Status begin(int64_t n_new) override {
    n_new_ = n_new;
    return inner_.begin(n_new);
  }
  void attend(int layer, const float* q, const float* k, const float* v, float* out,
              ThreadPool& pool) override {
    kq_.assign(k, k + n_new_ * shape_.kv_width());
    vq_.assign(v, v + n_new_ * shape_.kv_width());
    round_int8(kq_.data(), n_new_, shape_.n_kv_heads, shape_.head_dim);
    round_int8(vq_.data(), n_new_, shape_.n_kv_heads, shape_.head_dim);
    inner_.attend(layer, q, kq_.data(), vq_.data(), out, pool);
  }
  Status commit() override { return inner_.commit(); }
  void clear() override { inner_.clear(); }
  size_t bytes_held() const override { return inner_.bytes_held(); }
  std::string describe() const override { return "toy-int8 (test only)"; }
  void report(KvReport* out, ReportDetail detail) const override {
    inner_.report(out, detail);
    out->policy = "toy-int8";
    out->budget.kind = CacheKind::kQuantized;
  }

 private:
  KvShape shape_;
  FullKvCache inner_;
  int64_t n_new_ = 0;
  std::vector<float> kq_, vq_;
};

void register_toy_quantizer() {
  static bool done = false;
  if (done) return;
  done = true;
  PolicyInfo row;
  row.name = "toy-int8";
  row.summary = "test only: keys and values rounded to 8 bits per token and head";
  row.source = "tests/kvcache/quantizer_registry_test.cpp";
  row.kind = CacheKind::kQuantized;
  EXPECT_FALSE(register_policy(row).is_ok()) << "a quantizer row without its cache";
  row.make_cache = [](const KvShape& s, int64_t n_ctx,
                      const KvCacheParams&) -> Expected<std::unique_ptr<SequenceKvCache>> {
    return std::unique_ptr<SequenceKvCache>(new ToyInt8Cache(s, n_ctx));
  };
  row.max_bytes = [](const KvShape& s, int64_t prompt_len, int max_tokens, const KvCacheParams&,
                     int) -> Expected<size_t> {
    return size_t(prompt_len + max_tokens) * s.token_bytes() * size_t(s.n_layers) + 12345;
  };
  ASSERT_TRUE(register_policy(row).is_ok());
}

TEST(QuantizerRegistry, ToyQuantizerFromATestAlone) {
  register_toy_quantizer();
  const KvShape s = test::rope_shape(2, 4, 2, 16);
  // Parsed by the one option parser, as the CLI, eval, Python and the server do; listed in
  // the --kv-policy help generated from the rows.
  auto p = make_kv_params({{"policy", "toy-int8"}});
  ASSERT_TRUE(p.has_value()) << p.error();
  EXPECT_NE(kv_policy_help().find("toy-int8: test only"), std::string::npos);
  auto budgeted = make_kv_params({{"policy", "toy-int8"}, {"budget", "0.2"}});
  ASSERT_TRUE(budgeted.has_value());
  EXPECT_FALSE(make_kv_cache(s, 64, *budgeted).has_value()) << "a quantizer takes no budget";
  // The row's bound, not one of the scheduler's own.
  auto bound = max_cache_bytes(s, 40, 24, *p, 16);
  ASSERT_TRUE(bound.has_value()) << bound.error();
  EXPECT_EQ(*bound, size_t(64) * s.token_bytes() * size_t(s.n_layers) + 12345);

  auto made = make_kv_cache(s, 64, *p);
  ASSERT_TRUE(made.has_value()) << made.error();
  FullKvCache full(s, 64, HalfType::kF16);
  ThreadPool pool(2);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  double max_diff = 0.0;
  for (int64_t n : {int64_t(20), int64_t(1), int64_t(1)}) {
    ASSERT_TRUE((*made)->begin(n).is_ok());
    ASSERT_TRUE(full.begin(n).is_ok());
    for (int l = 0; l < s.n_layers; ++l) {
      std::vector<float> q(size_t(n) * s.q_width()), k(size_t(n) * s.kv_width()), v(k.size()),
          a(q.size()), b(q.size());
      for (auto* x : {&q, &k, &v})
        for (float& e : *x) e = nd(rng);
      (*made)->attend(l, q.data(), k.data(), v.data(), a.data(), pool);
      full.attend(l, q.data(), k.data(), v.data(), b.data(), pool);
      for (size_t i = 0; i < a.size(); ++i)
        max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
    }
    ASSERT_TRUE((*made)->commit().is_ok());
    ASSERT_TRUE(full.commit().is_ok());
  }
  // Rounded, so not FullKV's output, but within 8-bit error of it.
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 0.05);
  KvReport r;
  (*made)->report(&r, ReportDetail::kSummary);
  EXPECT_EQ(r.policy, "toy-int8");
  EXPECT_EQ((*made)->n_past(), 22);
}

}  // namespace
}  // namespace qevict
