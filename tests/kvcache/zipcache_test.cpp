// ZipCache: the quantizers and the bottom-k order against plain double-precision models, and
// the cache against a brute-force model of the rule — probes, normalized saliency, the
// per-head sets at the prompt's end and after every `gap` decode tokens, requantization of
// every token — plus its byte formula and attention over what it stores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "core/f16.h"
#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/zipcache_cache.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

std::vector<float> normal(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng) + (rng() % 41 == 0 ? 6.0f * scale : 0.0f);
  return x;
}

float f16r(float x) { return f16_to_f32(f32_to_f16(x)); }

TEST(ZipCacheRule, BottomKIsAscendingWithLowerIndexFirstOnTies) {
  const std::vector<float> s = {0.5f, 0.1f, 0.3f, 0.1f, 0.9f, 0.0f};
  EXPECT_EQ(zip_bottom_k(s.data(), 6, 3), (std::vector<int32_t>{5, 1, 3}));
  EXPECT_EQ(zip_bottom_k(s.data(), 6, 0), std::vector<int32_t>{});
  EXPECT_EQ(zip_bottom_k(s.data(), 6, 6), (std::vector<int32_t>{5, 1, 3, 2, 0, 4}));
}

// Keys: per column min/max; values: per column sqrt(max |x|), per row min/max of x / c. The
// parameters are f16 (rounded here as the rule says), the codes round half to even.
TEST(ZipCacheRule, QuantizersAgainstAPlainModel) {
  std::mt19937 rng(7);
  int64_t checked = 0, off_by_one = 0;
  for (int bits : {2, 4}) {
    for (int64_t rows : {1, 2, 3, 17, 64}) {
      for (int cols : {1, 7, 32, 96}) {
        auto x = normal(rng, size_t(rows) * cols, 1.0f + float(rng() % 5));
        for (float& e : x) e = f16r(e);  // the cache quantizes f16 rows
        const ZipSet ks = zip_quantize_keys(x.data(), rows, cols, bits);
        std::vector<uint16_t> vsc(static_cast<size_t>(cols));
        zip_value_scale(x.data(), rows, cols, vsc.data());
        const ZipSet vs = zip_quantize_values(x.data(), rows, cols, bits, vsc.data());
        const double top = double((1 << bits) - 1);
        for (int c = 0; c < cols; ++c) {
          double mn = INFINITY, mx = -INFINITY, amax = 0;
          for (int64_t j = 0; j < rows; ++j) {
            mn = std::min(mn, double(x[j * cols + c]));
            mx = std::max(mx, double(x[j * cols + c]));
            amax = std::max(amax, std::fabs(double(x[j * cols + c])));
          }
          // As the rule computes them: each float16 operation rounded to f16.
          const double mn16 = f16r(float(mn)),
                       step16 = f16r(f16r(float(mx) - float(mn)) / float(top));
          ASSERT_EQ(f16_to_f32(ks.col_a[size_t(c)]), mn16);
          ASSERT_EQ(f16_to_f32(ks.col_b[size_t(c)]), step16);
          ASSERT_EQ(f16_to_f32(vsc[size_t(c)]), f16r(float(std::sqrt(amax))));
          for (int64_t j = 0; j < rows; ++j) {
            const double want =
                step16 > 0 ? std::clamp(double(std::nearbyint(f16r(
                                            f16r(x[j * cols + c] - float(mn16)) / float(step16)))),
                                        0.0, top)
                           : 0.0;
            const double got = zip_dequant_key(ks, j, c);
            const double got_code = step16 > 0 ? std::round((got - mn16) / step16) : 0.0;
            ++checked;
            if (got_code != want) {
              ++off_by_one;
              ASSERT_NEAR(got_code, want, 1.0) << "key row " << j << " col " << c;
            }
            // Quantization error: half a step, plus the f16 rounding of min and step (the
            // clamp at the top code).
            ASSERT_LE(std::fabs(got - x[j * cols + c]),
                      step16 * 0.5 + (std::fabs(mn) + std::fabs(mx)) * 1e-3 + 1e-6);
          }
        }
        for (int64_t j = 0; j < rows; ++j) {
          double mn = INFINITY, mx = -INFINITY;
          std::vector<double> r(static_cast<size_t>(cols));
          for (int c = 0; c < cols; ++c) {
            const double sc = f16_to_f32(vsc[size_t(c)]);
            r[size_t(c)] = sc > 0 ? x[j * cols + c] / sc : 0.0;
            mn = std::min(mn, r[size_t(c)]);
            mx = std::max(mx, r[size_t(c)]);
          }
          // The cache divides in f32, this model in double: the f16 parameters agree to
          // within one f16 rounding.
          ASSERT_NEAR(f16_to_f32(vs.row_min[size_t(j)]), mn, std::fabs(mn) * 1e-3 + 1e-7);
          const double step16 = f16_to_f32(vs.row_step[size_t(j)]);
          ASSERT_NEAR(step16, (mx - mn) / top, (mx - mn) / top * 1e-3 + 1e-7);
          for (int c = 0; c < cols; ++c) {
            const double sc = f16_to_f32(vsc[size_t(c)]);
            ASSERT_LE(std::fabs(zip_dequant_value(vs, vsc.data(), j, c) - x[j * cols + c]),
                      (step16 * 0.5 + (std::fabs(mn) + std::fabs(mx)) * 1e-3) * sc + 1e-6)
                << "value row " << j << " col " << c;
          }
        }
        EXPECT_EQ(ks.bytes(), size_t((rows * cols * bits + 7) / 8) + size_t(cols) * 4);
      }
    }
  }
  EXPECT_EQ(off_by_one, 0) << "codes differ from the float16 model";
}

KvShape shape() { return test::rope_shape(2, 4, 2, 16); }

// The brute-force model: softmax of query row q (position pos, all heads) over keys
// K[t] (t <= pos), summed per KV head; keys as [n][kv_width] f32.
void probe_model(const KvShape& s, const float* q, int64_t pos, const std::vector<float>& K,
                 std::vector<double>* sal, int64_t t0) {
  const int d = s.head_dim, g = s.group(), kvw = s.kv_width();
  for (int hq = 0; hq < s.n_q_heads; ++hq) {
    const int h = hq / g;
    std::vector<double> lg(size_t(pos + 1));
    double m = -INFINITY;
    for (int64_t t = 0; t <= pos; ++t) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(q[hq * d + i]) * K[size_t(t) * kvw + h * d + i];
      lg[size_t(t)] = dot / std::sqrt(double(d));
      m = std::max(m, lg[size_t(t)]);
    }
    double z = 0;
    for (double& v : lg) z += (v = std::exp(v - m));
    for (int64_t t = t0; t <= pos; ++t)
      (*sal)[size_t(t - t0) * s.n_kv_heads + h] += lg[size_t(t)] / z;
  }
}

// Checks that the cache's new unimportant tokens of head h (got) are the k least salient of
// sal (model, double), allowing swaps only at near-ties with the k-th score.
void expect_bottom(const std::vector<double>& sal, int hkv, int h, int64_t m, int64_t t0,
                   const std::vector<int32_t>& got, int64_t k) {
  std::vector<std::pair<double, int64_t>> sc;
  for (int64_t i = 0; i < m; ++i) sc.push_back({sal[size_t(i) * hkv + h], t0 + i});
  std::sort(sc.begin(), sc.end());
  ASSERT_EQ(int64_t(got.size()), k);
  if (k == 0) return;
  const double kth = sc[size_t(k - 1)].first;
  const double next = k < m ? sc[size_t(k)].first : INFINITY;
  for (int32_t t : got) {
    const double v = sal[size_t(t - t0) * hkv + h];
    EXPECT_LE(v, next + 1e-5 * std::fabs(next)) << "head " << h << " token " << t;
  }
  std::set<int32_t> g(got.begin(), got.end());
  for (int64_t i = 0; i < k; ++i) {
    if (!g.count(int32_t(sc[size_t(i)].second))) {
      EXPECT_GE(sc[size_t(i)].first, kth - 1e-5 * std::fabs(kth))
          << "head " << h << ": token " << sc[size_t(i)].second << " is less salient";
    }
  }
}

TEST(ZipCacheCache, PromptAndDecodeFollowTheRule) {
  const KvShape s = shape();
  const int kvw = s.kv_width(), qw = s.q_width(), hkv = s.n_kv_heads;
  ThreadPool pool(2);
  for (int trial = 0; trial < 6; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::mt19937 rng(100 + trial);
    KvCacheParams p;
    p.policy = "zipcache";
    KvParamsGiven given;
    p.route_every = 7 + trial % 3;  // the requantization gap
    given.route_every = true;
    ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
    auto made = make_kv_cache(s, 1024, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    auto& c = dynamic_cast<ZipKvCache&>(**made);
    const ZipCacheConfig& cfg = c.config();
    ASSERT_EQ(cfg.gap, p.route_every);
    ASSERT_EQ(cfg.lo_bits, 2);
    // The prompt in three chunks, then decode tokens.
    const std::vector<int64_t> chunks = {37 + trial * 11, 64, 5 + trial};
    std::vector<std::vector<float>> K(2), Q(2);  // inputs per layer (K f16-rounded)
    auto call = [&](int64_t n) {
      ASSERT_TRUE(c.begin(n).is_ok());
      for (int l = 0; l < s.n_layers; ++l) {
        auto q = normal(rng, size_t(n) * qw, 1.5f), k = normal(rng, size_t(n) * kvw, 1.5f),
             v = normal(rng, size_t(n) * kvw, 1.0f);
        std::vector<float> out(q.size());
        c.attend(l, q.data(), k.data(), v.data(), out.data(), pool);
        for (float x : k) K[size_t(l)].push_back(f16r(x));
        Q[size_t(l)].insert(Q[size_t(l)].end(), q.begin(), q.end());
        for (float x : out) ASSERT_TRUE(std::isfinite(x));
      }
      ASSERT_TRUE(c.commit().is_ok());
    };
    for (int64_t n : chunks) call(n);
    const int64_t n = c.n_past();
    ASSERT_EQ(c.export_layer(0).quantized, 0) << "the prompt waits for its end";
    ASSERT_TRUE(c.end_prompt().is_ok());
    for (int l = 0; l < s.n_layers; ++l) {
      const ZipLayerExport e = c.export_layer(l);
      ASSERT_EQ(e.quantized, n);
      // Probes: the last 5 % and the random ones before them; normalized by n − t.
      const int64_t s0 = cfg.recent_probe_start(n);
      std::vector<double> sal(size_t(n) * hkv, 0.0);
      for (int64_t pos = 0; pos < n; ++pos)
        if (pos >= s0 || cfg.is_random_probe(l, pos))
          probe_model(s, Q[size_t(l)].data() + size_t(pos) * qw, pos, K[size_t(l)], &sal, 0);
      for (int64_t t = 0; t < n; ++t)
        for (int h = 0; h < hkv; ++h) sal[size_t(t) * hkv + h] /= double(n - t);
      for (int h = 0; h < hkv; ++h) {
        expect_bottom(sal, hkv, h, n, 0, e.unimportant[size_t(h)], cfg.unimportant_count(n));
        EXPECT_EQ(e.important[size_t(h)].size() + e.unimportant[size_t(h)].size(), size_t(n));
        EXPECT_TRUE(std::is_sorted(e.important[size_t(h)].begin(), e.important[size_t(h)].end()));
      }
      // Every stored key within half a step of its input (the set's column range bounds it).
      for (size_t i = 0; i < e.k.size(); ++i)
        ASSERT_TRUE(std::isfinite(e.k[i]) && std::isfinite(e.v[i]));
      size_t imp = 0, unimp = 0;
      for (int h = 0; h < hkv; ++h) {
        imp = e.important[size_t(h)].size();
        unimp = e.unimportant[size_t(h)].size();
      }
      EXPECT_EQ(c.layer_bytes(l),
                zipcache_layer_bytes(cfg, int64_t(imp), int64_t(unimp), 0, hkv, s.head_dim));
    }
    // Decode: after `gap` tokens the current query's (unnormalized) softmax picks the least
    // salient of them; the keys it reads are the stored ones.
    for (int round = 0; round < 2; ++round) {
      std::vector<ZipLayerExport> before;
      for (int l = 0; l < s.n_layers; ++l) before.push_back(c.export_layer(l));
      const int64_t n0 = c.n_past();
      for (int step = 0; step < cfg.gap; ++step) call(1);
      const int64_t n1 = c.n_past();
      for (int l = 0; l < s.n_layers; ++l) {
        const ZipLayerExport e = c.export_layer(l);
        ASSERT_EQ(e.quantized, n1) << "requantized after gap tokens";
        // The keys the last step's query read: the stored ones before the round, then the
        // round's tokens as given (f16).
        std::vector<float> keys = before[size_t(l)].k;
        for (float& x : keys) x = f16r(x);  // the scratch attention reads is f16
        keys.insert(keys.end(), K[size_t(l)].begin() + n0 * kvw, K[size_t(l)].end());
        std::vector<double> sal(size_t(n1 - n0) * hkv, 0.0);
        probe_model(s, Q[size_t(l)].data() + size_t(n1 - 1) * qw, n1 - 1, keys, &sal, n0);
        for (int h = 0; h < hkv; ++h) {
          const auto& u = e.unimportant[size_t(h)];
          const size_t old = before[size_t(l)].unimportant[size_t(h)].size();
          ASSERT_TRUE(std::equal(before[size_t(l)].unimportant[size_t(h)].begin(),
                                 before[size_t(l)].unimportant[size_t(h)].end(), u.begin()))
              << "earlier choices stay";
          expect_bottom(sal, hkv, h, n1 - n0, n0, std::vector<int32_t>(u.begin() + old, u.end()),
                        cfg.unimportant_count(n1 - n0));
        }
      }
    }
  }
}

// Attention after the prompt's end reads exactly what the cache stores (dequantized).
TEST(ZipCacheCache, AttentionOverWhatItStores) {
  const KvShape s = shape();
  const int kvw = s.kv_width(), qw = s.q_width(), d = s.head_dim, g = s.group();
  ThreadPool pool(1);
  std::mt19937 rng(5);
  KvCacheParams p;
  p.policy = "zipcache";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  auto made = make_kv_cache(s, 512, p);
  ASSERT_TRUE(made.has_value()) << made.error();
  auto& c = dynamic_cast<ZipKvCache&>(**made);
  std::vector<std::vector<float>> V(2);
  auto call = [&](int64_t n, std::vector<std::vector<float>>* outs,
                  std::vector<std::vector<float>>* qs) {
    ASSERT_TRUE(c.begin(n).is_ok());
    for (int l = 0; l < s.n_layers; ++l) {
      auto q = normal(rng, size_t(n) * qw, 1.5f), k = normal(rng, size_t(n) * kvw, 1.5f),
           v = normal(rng, size_t(n) * kvw, 1.0f);
      std::vector<float> out(q.size());
      c.attend(l, q.data(), k.data(), v.data(), out.data(), pool);
      if (outs) outs->push_back(out);
      if (qs) qs->push_back(q);
    }
    ASSERT_TRUE(c.commit().is_ok());
  };
  call(200, nullptr, nullptr);
  ASSERT_TRUE(c.end_prompt().is_ok());
  std::vector<ZipLayerExport> stored;
  for (int l = 0; l < s.n_layers; ++l) stored.push_back(c.export_layer(l));
  std::vector<std::vector<float>> outs, qs;
  call(1, &outs, &qs);
  for (int l = 0; l < s.n_layers; ++l) {
    const ZipLayerExport e = c.export_layer(l);  // the new token is in the f16 buffer
    for (int hq = 0; hq < s.n_q_heads; ++hq) {
      const int h = hq / g;
      std::vector<double> w(size_t(e.n));
      double m = -INFINITY, z = 0;
      for (int64_t t = 0; t < e.n; ++t) {
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += double(qs[size_t(l)][size_t(hq) * d + i]) *
                 f16r(e.k[size_t(t) * kvw + size_t(h) * d + i]);
        m = std::max(m, w[size_t(t)] = dot / std::sqrt(double(d)));
      }
      for (double& x : w) z += (x = std::exp(x - m));
      for (int i = 0; i < d; ++i) {
        double o = 0;
        for (int64_t t = 0; t < e.n; ++t)
          o += w[size_t(t)] / z * f16r(e.v[size_t(t) * kvw + size_t(h) * d + i]);
        EXPECT_NEAR(outs[size_t(l)][size_t(hq) * d + i], o, 2e-3 * (1 + std::fabs(o)))
            << "layer " << l << " head " << hq << " dim " << i;
      }
    }
    EXPECT_EQ(c.layer_bytes(l), zipcache_layer_bytes(c.config(), e.important[0].size(),
                                                     e.unimportant[0].size(), 1, s.n_kv_heads, d));
  }
  // Bytes: 4/2 bits on 60/40 % of the tokens, about a fifth of f16 plus parameters.
  const size_t f16 = size_t(c.n_past()) * s.token_bytes();
  EXPECT_LT(c.layer_bytes(0), f16 / 3);
}

TEST(ZipCacheCache, RegistryAndFactoryErrors) {
  const KvShape s = shape();
  KvCacheParams p;
  p.policy = "zipcache";
  KvParamsGiven given;
  given.window = true;
  EXPECT_FALSE(apply_policy_defaults(&p, given).is_ok());
  p = KvCacheParams{};
  p.policy = "zipcache";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_EQ(p.quant.gap, 100);  // ZipCache's own settings, named (QuantizerOptions)
  EXPECT_DOUBLE_EQ(p.quant.low_share, 0.4);
  EXPECT_STREQ(to_string(p.prefill_route), "end");
  KvCacheParams chunk = p;
  chunk.prefill_route = PrefillRoute::kChunk;
  auto per_chunk = make_kv_cache(s, 128, chunk);
  ASSERT_TRUE(per_chunk.has_value()) << per_chunk.error();
  EXPECT_FALSE((*per_chunk)->prefill_keeps_everything());
  KvCacheParams budget = p;
  budget.budget_fraction = 0.2;
  EXPECT_FALSE(make_kv_cache(s, 128, budget).has_value());
  auto ok = make_kv_cache(s, 128, p);
  ASSERT_TRUE(ok.has_value()) << ok.error();
  EXPECT_NE((*ok)->describe().find("zipcache 4/2"), std::string::npos) << (*ok)->describe();
}

}  // namespace
}  // namespace qevict
