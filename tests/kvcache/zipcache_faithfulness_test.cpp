// ZipCache against the reference, without Python: tests/golden/zipcache holds the post-RoPE keys,
// values and probe query rows qevict's engine computed for SmolLM2 (layers 0 and 29, the first
// 48 prompt tokens) and what a NumPy transcription of ThisisBillhe/ZipCache's prompt rule
// (modeling_llama.py:L778-797 saliency; compress_function.py:L72-94, L645-686, L1434-1458
// quantizers; float16 arithmetic) makes of them: the unimportant set of every KV head and the
// codes and f16 parameters of both sets (tools/faithfulness/zipcache_numpy.py --golden-out
// regenerates them). The C++ cache gets the same inputs as one prompt; its sets must be the
// transcription's and every stored key and value must decode to what the golden codes decode to.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/golden_npy.h"
#include "common/kv_shape.h"
#include "core/f16.h"
#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/zipcache_cache.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

const std::string kDir = std::string(QEVICT_TEST_DATA_DIR) + "/golden/zipcache/";

template <class T>
std::vector<T> golden(int layer, const std::string& what, const char* descr) {
  return test::load_npy<T>(kDir + "L" + std::to_string(layer) + "_" + what + ".npy", descr);
}

std::vector<float> f32(const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = f16_to_f32(h[i]);
  return x;
}

TEST(ZipCacheFaithfulness, SetsAndCodesMatchTheNumpyTranscriptionOnEngineInputs) {
  const std::string meta = test::read_text(kDir + "meta.json");
  ASSERT_FALSE(meta.empty()) << kDir;
  const int T = test::json_int(meta, "tokens"), H = test::json_int(meta, "n_kv_heads"),
            HQ = test::json_int(meta, "n_q_heads"), D = test::json_int(meta, "head_dim");
  const KvShape s = test::plain_shape(1, HQ, H, D);
  const int kvw = H * D, qw = HQ * D;
  int64_t compared = 0, equal = 0, probes_seen = 0;
  double jaccard_f16_min = 1.0;
  for (int layer : {0, 29}) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    KvCacheParams p;
    p.policy = "zipcache";
    ASSERT_TRUE(apply_policy_defaults(&p, KvParamsGiven{}).is_ok());
    p.prefill_route = PrefillRoute::kEnd;
    auto made = make_kv_cache(s, T, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    auto* c = dynamic_cast<ZipKvCache*>(made->get());
    ASSERT_NE(c, nullptr);
    const ZipCacheConfig& cfg = c->config();
    ASSERT_EQ(cfg.hi_bits, test::json_int(meta, "hi_bits"));
    ASSERT_EQ(cfg.lo_bits, test::json_int(meta, "lo_bits"));

    const auto k = f32(golden<uint16_t>(layer, "k_in", "<f2"));
    const auto v = f32(golden<uint16_t>(layer, "v_in", "<f2"));
    const auto qp = f32(golden<uint16_t>(layer, "q_probe", "<f2"));
    ASSERT_EQ(k.size(), size_t(T) * kvw);
    ASSERT_EQ(v.size(), k.size());
    // Query rows: the probes' from the golden (the cache's probes of a 1-layer cache are layer
    // 0's hash, as the transcription took them); the others do not enter the rule: zeros.
    std::vector<float> q(size_t(T) * qw, 0.0f);
    size_t next = 0;
    for (int t = 0; t < T; ++t)
      if (t >= cfg.recent_probe_start(T) || cfg.is_random_probe(0, t)) {
        ASSERT_LT((next + 1) * qw, qp.size() + 1) << "more probes than the golden has";
        std::copy(qp.begin() + next * qw, qp.begin() + (next + 1) * qw, q.begin() + t * qw);
        ++next;
      }
    ASSERT_EQ(next * qw, qp.size()) << "the golden's probes are not the cache's";
    probes_seen += int64_t(next);

    ThreadPool pool(1);
    std::vector<float> out(q.size());
    ASSERT_TRUE(c->begin(T).is_ok());
    c->attend(0, q.data(), k.data(), v.data(), out.data(), pool);
    ASSERT_TRUE(c->commit().is_ok());
    ASSERT_TRUE(c->end_prompt().is_ok());
    const ZipLayerExport e = c->export_layer(0);
    ASSERT_EQ(e.quantized, T);

    // Sets: the unimportant lists in the transcription's order (f32 saliency, as ours), and
    // close to its float16 ones (the reference's arithmetic).
    const auto unimp = golden<int32_t>(layer, "unimp", "<i4");
    const auto unimp16 = golden<int32_t>(layer, "unimp_f16", "<i4");
    const size_t ku = unimp.size() / size_t(H);
    for (int h = 0; h < H; ++h) {
      const std::vector<int32_t> want(unimp.begin() + h * ku, unimp.begin() + (h + 1) * ku);
      EXPECT_EQ(e.unimportant[size_t(h)], want) << "head " << h;
      const std::set<int32_t> a(e.unimportant[size_t(h)].begin(), e.unimportant[size_t(h)].end());
      const std::set<int32_t> b(unimp16.begin() + h * ku, unimp16.begin() + (h + 1) * ku);
      size_t inter = 0;
      for (int32_t t : a) inter += b.count(t);
      jaccard_f16_min =
          std::min(jaccard_f16_min, double(inter) / double(a.size() + b.size() - inter));
    }

    // Codes: what the golden's codes and f16 parameters decode to, per stored token.
    const auto vscale = f32(golden<uint16_t>(layer, "v_scale", "<f2"));
    ASSERT_EQ(vscale.size(), size_t(kvw));
    for (const char* set : {"imp", "unimp"}) {
      const bool imp = std::string(set) == "imp";
      const auto kc = golden<uint8_t>(layer, std::string("k_codes_") + set, "|u1");
      const auto vc = golden<uint8_t>(layer, std::string("v_codes_") + set, "|u1");
      const auto kmin = f32(golden<uint16_t>(layer, std::string("k_min_") + set, "<f2"));
      const auto kstep = f32(golden<uint16_t>(layer, std::string("k_step_") + set, "<f2"));
      const auto vmin = f32(golden<uint16_t>(layer, std::string("v_rmin_") + set, "<f2"));
      const auto vstep = f32(golden<uint16_t>(layer, std::string("v_rstep_") + set, "<f2"));
      const auto& lists = imp ? e.important : e.unimportant;
      const size_t rows = lists[0].size();
      ASSERT_EQ(kc.size(), rows * kvw) << set;
      ASSERT_EQ(vc.size(), rows * kvw) << set;
      ASSERT_EQ(vmin.size(), rows) << set;
      for (size_t j = 0; j < rows; ++j)
        for (int h = 0; h < H; ++h) {
          const size_t t = size_t(lists[size_t(h)][j]);
          for (int ch = 0; ch < D; ++ch) {
            const size_t col = size_t(h) * D + ch, i = j * kvw + col;
            const float kw = float(kc[i]) * kstep[col] + kmin[col];
            const float vw = (float(vc[i]) * vstep[j] + vmin[j]) * vscale[col];
            const float kg = e.k[t * kvw + col], vg = e.v[t * kvw + col];
            // Within one code step of the reference's value, and (on these data) equal.
            EXPECT_LE(std::fabs(kg - kw), kstep[col] * 1.001f) << set << " key t " << t;
            EXPECT_LE(std::fabs(vg - vw), vstep[j] * vscale[col] * 1.001f) << set << " value";
            equal += (kg == kw) + (vg == vw);
            compared += 2;
          }
        }
    }
  }
  std::printf(
      "ZipCache golden: %lld of %lld stored keys/values decode as the NumPy transcription's; "
      "%lld probes; unimportant sets vs its float16 saliency: Jaccard min %.4f\n",
      (long long)equal, (long long)compared, (long long)probes_seen, jaccard_f16_min);
  ASSERT_GT(compared, 0);
  EXPECT_EQ(equal, compared);
  EXPECT_GE(jaccard_f16_min, 0.9);
}

}  // namespace
}  // namespace qevict
