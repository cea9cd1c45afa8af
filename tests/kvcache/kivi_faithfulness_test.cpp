// KIVI against the reference, without Python: tests/golden/kivi holds keys/values qevict's
// engine computed for SmolLM2 (layers 0 and 29, the first 40 prompt tokens) and the codes,
// scales and minimums a NumPy transcription of jy-yuan/KIVI's quantizer (quant/new_pack.py:
// L217-252, models/llama_kivi.py:L193-220) gives them with G = R = 32
// (tools/faithfulness/kivi_numpy.py --golden-out regenerates them). The C++ cache gets the
// same inputs as a prompt; its codes must agree and its dequantized values lie within one
// code step of the reference's (and, on these data, all are equal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/golden_npy.h"
#include "common/kv_shape.h"
#include "core/f16.h"
#include "kernels/kivi_group.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/kivi_cache.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

const std::string kDir = std::string(QEVICT_TEST_DATA_DIR) + "/golden/kivi/";

template <class T>
std::vector<T> load_npy(const std::string& name, const char* descr) {
  return test::load_npy<T>(kDir + name, descr);
}

TEST(KiviFaithfulness, CodesMatchTheNumpyTranscriptionOnEngineKeysAndValues) {
  const std::string meta = test::read_text(kDir + "meta.json");
  ASSERT_FALSE(meta.empty()) << kDir;
  using test::json_int;
  const int T = json_int(meta, "tokens"), H = json_int(meta, "n_kv_heads"),
            D = json_int(meta, "head_dim"), G = json_int(meta, "group"),
            R = json_int(meta, "residual");
  ASSERT_EQ(G, 32);
  const KvShape s = test::plain_shape(1, 3 * H, H, D);
  const int kvw = H * D;
  int64_t compared = 0, agree = 0;
  for (int layer : {0, 29}) {
    const auto k_in = load_npy<uint16_t>("L" + std::to_string(layer) + "_k_in.npy", "<f2");
    const auto v_in = load_npy<uint16_t>("L" + std::to_string(layer) + "_v_in.npy", "<f2");
    ASSERT_EQ(k_in.size(), size_t(T) * kvw);
    ASSERT_EQ(v_in.size(), size_t(T) * kvw);
    for (int bits : {2, 4}) {
      const std::string pre = "L" + std::to_string(layer) + "_b" + std::to_string(bits) + "_";
      const auto kc = load_npy<uint8_t>(pre + "k_codes.npy", "|u1");
      const auto ks = load_npy<uint16_t>(pre + "k_scale.npy", "<f2");
      const auto km = load_npy<uint16_t>(pre + "k_min.npy", "<f2");
      const auto vc = load_npy<uint8_t>(pre + "v_codes.npy", "|u1");
      const auto vs = load_npy<uint16_t>(pre + "v_scale.npy", "<f2");
      const auto vm = load_npy<uint16_t>(pre + "v_min.npy", "<f2");
      KvCacheParams p;
      p.policy = "kivi";
      p.bits = bits;
      p.value_group = G;
      p.local = R;
      KvParamsGiven given;
      given.bits = given.local = true;
      ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
      auto made = make_kv_cache(s, T, p);
      ASSERT_TRUE(made.has_value()) << made.error();
      auto* c = dynamic_cast<KiviKvCache*>(made->get());
      ThreadPool pool(1);
      std::vector<float> k(size_t(T) * kvw), v(k.size()), q(size_t(T) * s.q_width()), out(q.size());
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = f16_to_f32(k_in[i]);
        v[i] = f16_to_f32(v_in[i]);
      }
      std::mt19937 rng(5);
      std::normal_distribution<float> nd;
      for (auto& x : q) x = nd(rng);
      ASSERT_TRUE(c->begin(T).is_ok());
      c->attend(0, q.data(), k.data(), v.data(), out.data(), pool);
      ASSERT_TRUE(c->commit().is_ok());
      ASSERT_TRUE(c->end_prompt().is_ok());
      const KiviLayerExport e = c->export_layer(0);
      ASSERT_EQ(e.k_codes.size(), kc.size()) << pre;
      ASSERT_EQ(e.v_codes.size(), vc.size()) << pre;
      ASSERT_EQ(e.k_scale.size(), ks.size());
      ASSERT_EQ(e.v_scale.size(), vs.size());
      // Scales and minimums bit-exact (f16), codes equal, dequantized within one code step.
      for (size_t i = 0; i < ks.size(); ++i) {
        ASSERT_EQ(e.k_scale[i], ks[i]) << pre << "key scale " << i;
        ASSERT_EQ(e.k_min[i], km[i]) << pre << "key min " << i;
      }
      for (size_t i = 0; i < vs.size(); ++i) {
        ASSERT_EQ(e.v_scale[i], vs[i]) << pre << "value scale " << i;
        ASSERT_EQ(e.v_min[i], vm[i]) << pre << "value min " << i;
      }
      for (size_t i = 0; i < kc.size(); ++i) {
        const size_t gi = (i / size_t(kvw) / G) * kvw + i % size_t(kvw);  // [group][head][dim]
        const float st = f16_to_f32(ks[gi]), mn = f16_to_f32(km[gi]);
        EXPECT_LE(std::abs(kivi_dequant(e.k_codes[i], st, mn) - kivi_dequant(kc[i], st, mn)), st)
            << pre << "key " << i;
        agree += e.k_codes[i] == kc[i];
      }
      for (size_t i = 0; i < vc.size(); ++i) {
        const size_t gi = i / size_t(G);  // [token][head][D/G]
        const float st = f16_to_f32(vs[gi]), mn = f16_to_f32(vm[gi]);
        EXPECT_LE(std::abs(kivi_dequant(e.v_codes[i], st, mn) - kivi_dequant(vc[i], st, mn)), st)
            << pre << "value " << i;
        agree += e.v_codes[i] == vc[i];
      }
      compared += int64_t(kc.size() + vc.size());
    }
  }
  ASSERT_GT(compared, 0);
  std::printf("KIVI golden: %lld of %lld codes equal to the NumPy transcription's\n",
              (long long)agree, (long long)compared);
  // Every code: the golden groups have no equal-valued group (where the reference's codes are
  // undefined). Doing the arithmetic in f32 instead of the reference's f16 steps already
  // changes 45 of these 30,720 codes.
  EXPECT_EQ(agree, compared);
}

}  // namespace
}  // namespace qevict
