// KIVI: the group quantizer against a plain double-precision reference, and the cache against
// a step-by-step model of the reference's residual handling (prefill and decode), its byte
// formula after every step, and attention against a dense double-precision reference over
// the dequantized keys/values and the f16 residual.
#include "kvcache/quantizers/kivi_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/kv_names.h"
#include "common/kv_shape.h"
#include "core/f16.h"
#include "kernels/kivi_group.h"
#include "kvcache/factory.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

// Random f16 values with a spread of scales and the odd outlier (KV-like channels).
std::vector<uint16_t> random_f16(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> x(n);
  for (auto& h : x) h = f32_to_f16(nd(rng) + (rng() % 53 == 0 ? 8.0f * scale : 0.0f));
  return x;
}

TEST(KiviGroup, CodesAndValuesAgainstAPlainReference) {
  std::mt19937 rng(1234);
  int64_t total = 0, differ = 0;
  for (int bits : {2, 4}) {
    for (int n : {4, 8, 16, 32, 64, 128}) {
      if (n * bits % 8) continue;
      for (int trial = 0; trial < 200; ++trial) {
        const int stride = 1 + trial % 3;
        const float scale = std::pow(10.0f, float(trial % 7) - 3.0f);
        auto x = random_f16(rng, size_t(n) * stride, scale);
        std::vector<uint8_t> codes(static_cast<size_t>(n)),
            packed(static_cast<size_t>(n * bits / 8));
        const KiviGroupParams gp = kivi_quantize_group(x.data(), stride, n, bits, codes.data());
        // Plain reference: min/max in double, scale and codes without intermediate rounding.
        double mn = INFINITY, mx = -INFINITY;
        for (int i = 0; i < n; ++i) {
          mn = std::min(mn, double(f16_to_f32(x[size_t(i) * stride])));
          mx = std::max(mx, double(f16_to_f32(x[size_t(i) * stride])));
        }
        const int max_int = (1 << bits) - 1;
        ASSERT_EQ(f16_to_f32(gp.min), mn);
        const double s = f16_to_f32(gp.scale);
        ASSERT_NEAR(s, (mx - mn) / max_int, (mx - mn) / max_int * 1e-3 + 1e-7);
        kivi_pack(codes.data(), n, bits, packed.data());
        for (int i = 0; i < n; ++i) {
          const double xi = f16_to_f32(x[size_t(i) * stride]);
          const double r = std::clamp(std::nearbyint((xi - mn) / s), 0.0, double(max_int));
          ASSERT_EQ(kivi_code_at(packed.data(), i, bits), codes[size_t(i)]) << "pack " << i;
          ASSERT_LE(codes[size_t(i)], max_int);
          // The f16 steps of the reference may move a value that sits on a rounding boundary.
          ASSERT_LE(std::abs(double(codes[size_t(i)]) - r), 1.0) << "bits " << bits << " i " << i;
          differ += codes[size_t(i)] != r;
          ++total;
          // Dequantized within half a code step, plus the f16 roundings of x − mn, of the
          // quotient and of the scale (each ≤ 2^-11 relative of at most 2^b − 1 steps), and so
          // within one code step.
          const double back = kivi_dequant(codes[size_t(i)], float(s), float(mn));
          const double bound = (0.5 + 3.0 * max_int / 2048.0) * s + 1e-6;
          ASSERT_LE(bound, s + 1e-6);
          ASSERT_LE(std::abs(back - xi), bound)
              << "bits " << bits << " n " << n << " i " << i << " x " << xi << " back " << back;
        }
      }
    }
  }
  EXPECT_LT(double(differ), 0.01 * double(total)) << differ << " of " << total;
}

TEST(KiviGroup, EqualValuesGetCodeZeroAndComeBackExactly) {
  std::vector<uint16_t> x(32, f32_to_f16(-1.25f));
  std::vector<uint8_t> codes(32, 9);
  const KiviGroupParams gp = kivi_quantize_group(x.data(), 1, 32, 2, codes.data());
  EXPECT_EQ(gp.scale, 0);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
  EXPECT_EQ(kivi_dequant(0, f16_to_f32(gp.scale), f16_to_f32(gp.min)), -1.25f);
}

KvShape shape() { return test::plain_shape(2, 4, 2, 64); }

// The reference's residual handling, literally (llama_kivi.py): prefill quantizes
// n − n mod R keys and all but R values; each decode step appends, attends, then quantizes
// the key residual when it reaches R and the oldest value when there are R + 1.
struct KiviModel {
  int R;
  int64_t kq = 0, kres = 0, vq = 0, vres = 0;
  void prefill(int64_t n) {
    kq = n - n % R;
    kres = n % R;
    vq = n > R ? n - R : 0;
    vres = n - vq;
  }
  void decode() {
    if (++kres == R) {
      kq += R;
      kres = 0;
    }
    if (++vres > R) {
      ++vq;
      --vres;
    }
  }
};

struct Case {
  int bits, group, residual;
  const char* route;
  int64_t prompt, chunk, steps;
};

class KiviCacheTest : public ::testing::TestWithParam<Case> {};

TEST_P(KiviCacheTest, RuleBytesAndAttentionAgainstDenseReference) {
  const Case cs = GetParam();
  const KvShape s = shape();
  KvCacheParams p;
  p.policy = "kivi";
  p.bits = cs.bits;
  p.value_group = cs.group;
  p.local = cs.residual;
  KvParamsGiven given;
  given.local = given.bits = true;
  p.prefill_route = test::route_of(cs.route);
  given.prefill_route = true;
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  ASSERT_TRUE(p.validate().is_ok());
  const int64_t n_ctx = cs.prompt + cs.steps;
  auto made = make_kv_cache(s, n_ctx, p);
  ASSERT_TRUE(made.has_value()) << made.error();
  auto* c = dynamic_cast<KiviKvCache*>(made->get());
  ASSERT_NE(c, nullptr);
  const KiviConfig& kc = c->config();
  ASSERT_EQ(kc.group, cs.group);
  ASSERT_EQ(kc.residual, cs.residual);

  const int d = s.head_dim, hkv = s.n_kv_heads, g = s.group(), kvw = s.kv_width();
  const int G = cs.group;
  ThreadPool pool(2);
  std::mt19937 rng(99 + cs.bits + cs.residual);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Every token's inputs, per layer, as f16 (what the cache stores before quantizing).
  std::vector<std::vector<uint16_t>> all_k(size_t(s.n_layers)), all_v(size_t(s.n_layers));
  KiviModel model{cs.residual};
  int64_t n = 0;
  auto call = [&](int64_t n_new, bool check_attention) {
    ASSERT_TRUE(c->begin(n_new).is_ok());
    for (int l = 0; l < s.n_layers; ++l) {
      std::vector<float> q(size_t(n_new) * s.q_width()), k(size_t(n_new) * kvw), v(k.size()),
          out(q.size(), NAN);
      for (auto& x : q) x = nd(rng);
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = nd(rng) * (1.0f + float(i % d) / 8.0f);  // channel-dependent key scales
        v[i] = nd(rng);
      }
      // Dense reference over what the cache holds before this call (dequantized) plus the new
      // tokens in f16, in double.
      std::vector<double> K, V;
      if (check_attention) {
        const KiviLayerExport e = c->export_layer(l);
        ASSERT_EQ(e.n, n);
        K.assign(size_t(n + n_new) * kvw, 0.0);
        V.assign(K.size(), 0.0);
        for (int64_t t = 0; t < e.keys_quantized; ++t)
          for (int h = 0; h < hkv; ++h)
            for (int ch = 0; ch < d; ++ch) {
              const size_t gi = (size_t(t / G) * hkv + h) * d + ch;
              K[size_t(t) * kvw + h * d + ch] = f16_to_f32(
                  f32_to_f16(kivi_dequant(e.k_codes[(size_t(t) * hkv + h) * d + ch],
                                          f16_to_f32(e.k_scale[gi]), f16_to_f32(e.k_min[gi]))));
            }
        for (int64_t t = 0; t < e.values_quantized; ++t)
          for (int h = 0; h < hkv; ++h)
            for (int ch = 0; ch < d; ++ch) {
              const size_t gi = (size_t(t) * hkv + h) * (d / G) + ch / G;
              V[size_t(t) * kvw + h * d + ch] = f16_to_f32(
                  f32_to_f16(kivi_dequant(e.v_codes[(size_t(t) * hkv + h) * d + ch],
                                          f16_to_f32(e.v_scale[gi]), f16_to_f32(e.v_min[gi]))));
            }
        for (int64_t t = e.keys_quantized; t < n; ++t)
          for (int i = 0; i < kvw; ++i)
            K[size_t(t) * kvw + i] = f16_to_f32(e.k_res[size_t(t - e.keys_quantized) * kvw + i]);
        for (int64_t t = e.values_quantized; t < n; ++t)
          for (int i = 0; i < kvw; ++i)
            V[size_t(t) * kvw + i] = f16_to_f32(e.v_res[size_t(t - e.values_quantized) * kvw + i]);
        for (int64_t t = 0; t < n_new; ++t)
          for (int i = 0; i < kvw; ++i) {
            K[size_t(n + t) * kvw + i] = f16_to_f32(f32_to_f16(k[size_t(t) * kvw + i]));
            V[size_t(n + t) * kvw + i] = f16_to_f32(f32_to_f16(v[size_t(t) * kvw + i]));
          }
      }
      c->attend(l, q.data(), k.data(), v.data(), out.data(), pool);
      for (float x : out) ASSERT_TRUE(std::isfinite(x));
      for (int64_t t = 0; t < n_new; ++t)
        for (int i = 0; i < kvw; ++i) {
          all_k[size_t(l)].push_back(f32_to_f16(k[size_t(t) * kvw + i]));
          all_v[size_t(l)].push_back(f32_to_f16(v[size_t(t) * kvw + i]));
        }
      if (!check_attention) continue;
      double worst = 0.0;
      for (int64_t t = 0; t < n_new; ++t)
        for (int hq = 0; hq < s.n_q_heads; ++hq) {
          const int h = hq / g;
          const float* qi = q.data() + size_t(t) * s.q_width() + size_t(hq) * d;
          std::vector<double> w(size_t(n + t + 1));
          double m = -INFINITY, z = 0.0;
          for (int64_t j = 0; j <= n + t; ++j) {
            double dot = 0.0;
            for (int ch = 0; ch < d; ++ch) dot += double(qi[ch]) * K[size_t(j) * kvw + h * d + ch];
            w[size_t(j)] = dot / std::sqrt(double(d));
            m = std::max(m, w[size_t(j)]);
          }
          for (auto& x : w) z += (x = std::exp(x - m));
          for (int ch = 0; ch < d; ++ch) {
            double o = 0.0;
            for (int64_t j = 0; j <= n + t; ++j)
              o += w[size_t(j)] / z * V[size_t(j) * kvw + h * d + ch];
            worst =
                std::max(worst, std::abs(o - out[size_t(t) * s.q_width() + size_t(hq) * d + ch]));
          }
        }
      ASSERT_LT(worst, 2e-3) << "layer " << l << " at n " << n << " + " << n_new;
    }
    ASSERT_TRUE(c->commit().is_ok());
    n += n_new;
  };
  // The state after the rule: the model's counts, the byte formula, and codes equal to the
  // group quantizer on the f16 inputs of exactly the groups the rule names.
  auto check_state = [&](bool codes_too) {
    for (int l = 0; l < s.n_layers; ++l) {
      const KiviLayerExport e = c->export_layer(l);
      ASSERT_EQ(e.keys_quantized, model.kq) << "n " << n;
      ASSERT_EQ(e.values_quantized, model.vq) << "n " << n;
      ASSERT_EQ(int64_t(e.k_res.size()), model.kres * kvw);
      ASSERT_EQ(int64_t(e.v_res.size()), model.vres * kvw);
      ASSERT_EQ(c->layer_bytes(l), kivi_layer_bytes(kc, n, hkv, d)) << "n " << n;
      if (!codes_too) continue;
      std::vector<uint8_t> codes(static_cast<size_t>(G));
      const auto& K = all_k[size_t(l)];
      const auto& V = all_v[size_t(l)];
      for (int64_t gi = 0; gi < e.keys_quantized / G; ++gi)
        for (int h = 0; h < hkv; ++h)
          for (int ch = 0; ch < d; ++ch) {
            const KiviGroupParams gp = kivi_quantize_group(
                K.data() + size_t(gi) * G * kvw + h * d + ch, kvw, G, kc.bits, codes.data());
            const size_t pi = (size_t(gi) * hkv + h) * d + ch;
            ASSERT_EQ(e.k_scale[pi], gp.scale);
            ASSERT_EQ(e.k_min[pi], gp.min);
            for (int i = 0; i < G; ++i)
              ASSERT_EQ(e.k_codes[((size_t(gi) * G + i) * hkv + h) * d + ch], codes[size_t(i)]);
          }
      for (int64_t t = 0; t < e.values_quantized; ++t)
        for (int h = 0; h < hkv; ++h)
          for (int gj = 0; gj < d / G; ++gj) {
            const KiviGroupParams gp = kivi_quantize_group(
                V.data() + size_t(t) * kvw + h * d + gj * G, 1, G, kc.bits, codes.data());
            const size_t pi = (size_t(t) * hkv + h) * (d / G) + gj;
            ASSERT_EQ(e.v_scale[pi], gp.scale);
            ASSERT_EQ(e.v_min[pi], gp.min);
            for (int i = 0; i < G; ++i)
              ASSERT_EQ(e.v_codes[(size_t(t) * hkv + h) * d + gj * G + i], codes[size_t(i)]);
          }
    }
  };
  const bool defer = std::string(cs.route) == "end";
  for (int64_t done = 0; done < cs.prompt; done += cs.chunk) {
    const int64_t m = std::min(cs.chunk, cs.prompt - done);
    call(m, true);
    if (!defer) {
      model.prefill(n);  // per chunk: the same counts as one prefill of n (they depend on n)
      check_state(true);
    }
  }
  ASSERT_TRUE(c->end_prompt().is_ok());
  model.prefill(n);
  check_state(true);
  const size_t prompt_bytes = c->layer_bytes(0);
  for (int64_t i = 0; i < cs.steps; ++i) {
    call(1, i % 7 == 0 || i + 1 == cs.steps);
    model.decode();
    check_state(i % 9 == 0 || i + 1 == cs.steps);  // counts and bytes every step
  }
  EXPECT_GT(c->layer_bytes(0), prompt_bytes);
  KvReport r;
  c->report(&r, ReportDetail::kTiers);
  EXPECT_EQ(r.budget.kind, CacheKind::kQuantized);
  EXPECT_FALSE(r.budget.budgeted());
  EXPECT_EQ(r.total().bytes_quant + r.total().bytes_full,
            size_t(s.n_layers) * kivi_layer_bytes(kc, n, hkv, d));
  EXPECT_GE(r.bytes_held, r.total().bytes_quant + r.total().bytes_full);
  ASSERT_EQ(r.position_tiers.size(), size_t(s.n_layers));
  EXPECT_EQ(r.position_tiers[0].size(), size_t(n));
}

INSTANTIATE_TEST_SUITE_P(Settings, KiviCacheTest,
                         ::testing::Values(Case{2, 32, 128, "end", 200, 200, 140},
                                           Case{4, 32, 128, "end", 300, 64, 60},
                                           Case{2, 32, 64, "chunk", 200, 37, 80},
                                           Case{4, 16, 32, "chunk", 45, 45, 70},
                                           Case{2, 64, 64, "end", 20, 20, 130}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return "b" + std::to_string(c.bits) + "_G" + std::to_string(c.group) +
                                  "_R" + std::to_string(c.residual) + "_" + c.route + "_prompt" +
                                  std::to_string(c.prompt) + "_chunk" + std::to_string(c.chunk);
                         });

TEST(KiviCache, DefaultsBudgetRefusalAndBadSettings) {
  KvCacheParams p;
  p.policy = "kivi";
  ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
  EXPECT_EQ(p.quant.group, 32);  // KIVI's own settings, named (QuantizerOptions)
  EXPECT_EQ(p.quant.residual, 128);
  EXPECT_STREQ(to_string(p.prefill_route), "end");
  EXPECT_EQ(p.quant.bits, 2);
  const KvShape s = shape();
  auto ok = make_kv_cache(s, 512, p);
  ASSERT_TRUE(ok.has_value()) << ok.error();
  EXPECT_TRUE((*ok)->prefill_keeps_everything());
  KvCacheParams b = p;
  b.budget_fraction = 0.2;
  auto refused = make_kv_cache(s, 512, b);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().find("quantizer"), std::string::npos) << refused.error();
  KvCacheParams r = p;
  r.quant.residual = 100;  // not a multiple of 32
  EXPECT_FALSE(make_kv_cache(s, 512, r).has_value());
  KvCacheParams gsz = p;
  gsz.quant.group = 48;  // does not divide head_dim 64
  EXPECT_FALSE(make_kv_cache(s, 512, gsz).has_value());
  KvParamsGiven w;
  w.window = true;
  KvCacheParams pw;
  pw.policy = "kivi";
  EXPECT_FALSE(apply_policy_defaults(&pw, w).is_ok());
  // BASELINES.md's figure: D = 128, G = 32: 96 B per token and head at 2 bits, 160 B at 4.
  KiviConfig k2{2, 32, 128}, k4{4, 32, 128};
  EXPECT_EQ(k2.key_group_bytes(128) / 32 + k2.value_token_bytes(128), 96u);
  EXPECT_EQ(k4.key_group_bytes(128) / 32 + k4.value_token_bytes(128), 160u);
  // n = 1100: keys 1024 quantized + 76 residual, values 972 quantized + 128 residual.
  EXPECT_EQ(kivi_layer_bytes(k2, 1100, 1, 128), 1024u * 48 + 972u * 48 + (76u + 128u) * 256);
  EXPECT_EQ(kivi_layer_bytes(k4, 1100, 1, 128), 1024u * 80 + 972u * 80 + (76u + 128u) * 256);
}

}  // namespace
}  // namespace qevict
