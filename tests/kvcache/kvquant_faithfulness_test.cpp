// KVQuant against the reference, without Python: tests/golden/kvquant holds pre-RoPE keys and
// values qevict's engine computed for SmolLM2 (layers 0 and 29, the first 40 prompt tokens),
// the reference's calibration of those layers (np.percentile thresholds rounded to f16 as
// QuantLinearSim does, sklearn KMeans levels, on qevict's calibration activations), and what a
// NumPy transcription of the reference's rule (SqueezeAILab/KVQuant@57a2383,
// quant/kvquant/simquant_module_quantizer.py: get_outliers, get_outliers_dynamic,
// quant_fn_nuq_recon) makes of them (tools/faithfulness/kvquant_numpy.py --golden-out
// regenerates them). The inputs go through the real path: the factory makes a KvQuantCache with
// that calibration and --kv-trace, the prompt is attended, and the cache's own dump
// (dump_prompt: codes, value offsets/ranges, outliers, decoded rows) is read back. The shape has
// no rotated dims, so the cache's un-rotation is the identity and the rule sees the golden keys
// unchanged. Codes and outlier sets must be equal and decoded values within one code step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/golden_npy.h"
#include "common/kv_shape.h"
#include "core/f16.h"
#include "core/npy.h"
#include "kvcache/factory.h"
#include "kvcache/quantizers/kvquant_cache.h"
#include "kvcache/registry.h"

namespace qevict {
namespace {

const std::string kDir = std::string(QEVICT_TEST_DATA_DIR) + "/golden/kvquant/";

NpyArray load_f32(const std::string& path) {
  auto a = read_npy(path);
  EXPECT_TRUE(a.has_value()) << path << ": " << (a ? "" : a.error());
  return a ? *a : NpyArray{};
}

double json_number(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  EXPECT_NE(at, std::string::npos) << key;
  return std::stod(json.substr(at + key.size() + 3));
}

// (token, channel) of each outlier row (token, channel, value).
std::set<std::pair<int, int>> outlier_set(const NpyArray& a) {
  std::set<std::pair<int, int>> s;
  for (int64_t i = 0; i < a.rows; ++i)
    s.insert({int(a.data[size_t(i) * 3]), int(a.data[size_t(i) * 3 + 1])});
  return s;
}

TEST(KvQuantFaithfulness, CacheMatchesTheNumpyTranscriptionOnEngineKeysAndValues) {
  std::ifstream mf(kDir + "meta.json");
  ASSERT_TRUE(mf.good()) << kDir;
  std::stringstream ss;
  ss << mf.rdbuf();
  const std::string meta = ss.str();
  const int T = int(json_number(meta, "tokens")), H = int(json_number(meta, "n_kv_heads")),
            D = int(json_number(meta, "head_dim")), bits = int(json_number(meta, "bits")),
            F = int(json_number(meta, "first_fp16"));
  const double sparsity = json_number(meta, "sparsity");
  const int kvw = H * D, levels = 1 << bits;
  // No RoPE: the cache's un-rotation leaves the golden keys as they are.
  const KvShape s = test::plain_shape(1, 3 * H, H, D);
  const std::string dump = ::testing::TempDir() + "/kvquant_faithfulness_dump";
  int64_t codes = 0, codes_equal = 0, outliers = 0, outliers_shared = 0;
  for (int layer : {0, 29}) {
    const std::string pre = kDir + "L" + std::to_string(layer) + "_";
    const NpyArray k_in = load_f32(pre + "k_in.npy"), v_in = load_f32(pre + "v_in.npy");
    const NpyArray thr = load_f32(pre + "calib_k.npy"), lut = load_f32(pre + "calib_lut.npy");
    const NpyArray v_par = load_f32(pre + "v_par.npy");
    const NpyArray k_out = load_f32(pre + "k_out.npy"), v_out = load_f32(pre + "v_out.npy");
    const std::vector<uint8_t> kc = test::load_npy<uint8_t>(pre + "k_codes.npy", "|u1"),
                               vc = test::load_npy<uint8_t>(pre + "v_codes.npy", "|u1");
    ASSERT_EQ(k_in.rows, T);
    ASSERT_EQ(k_in.cols, kvw);
    ASSERT_EQ(v_in.data.size(), k_in.data.size());
    ASSERT_EQ(thr.data.size(), size_t(2 * kvw));
    ASSERT_EQ(lut.data.size(), size_t(2 * levels));
    ASSERT_EQ(kc.size(), size_t(T - F) * kvw);
    ASSERT_EQ(vc.size(), kc.size());
    ASSERT_EQ(v_par.data.size(), size_t(T - F) * 2);

    auto cal = std::make_shared<std::vector<KvQuantLayerCalib>>(1);
    KvQuantLayerCalib& c = (*cal)[0];
    c.k_upper.assign(thr.data.begin(), thr.data.begin() + kvw);
    c.k_lower.assign(thr.data.begin() + kvw, thr.data.end());
    c.k_lut.assign(lut.data.begin(), lut.data.begin() + levels);
    c.v_lut.assign(lut.data.begin() + levels, lut.data.end());
    kvq_set_key_offsets(&c);
    KvCacheParams p;
    p.policy = "kvquant";
    p.bits = bits;
    p.q = 1.0 - sparsity;
    p.sink = F;
    KvParamsGiven given;
    given.bits = given.q = given.sink = true;
    ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
    p.quant.kvquant_calib = cal;
    std::filesystem::remove_all(dump);
    std::filesystem::create_directories(dump);
    p.trace_path = dump;
    auto made = make_kv_cache(s, T, p);
    ASSERT_TRUE(made.has_value()) << made.error();
    ThreadPool pool(1);
    std::vector<float> q(size_t(T) * s.q_width(), 0.5f), out(q.size());
    SequenceKvCache& cache = **made;
    ASSERT_TRUE(cache.begin(T).is_ok());
    cache.attend(0, q.data(), k_in.data.data(), v_in.data.data(), out.data(), pool);
    ASSERT_TRUE(cache.commit().is_ok());
    ASSERT_TRUE(cache.end_prompt().is_ok());  // writes the dump

    const std::string ours = dump + "/kvquant_L0_";
    const NpyArray okc = load_f32(ours + "k_codes.npy"), ovc = load_f32(ours + "v_codes.npy");
    const NpyArray opar = load_f32(ours + "v_par.npy");
    const NpyArray okd = load_f32(ours + "k_deq.npy"), ovd = load_f32(ours + "v_deq.npy");
    const NpyArray oko = load_f32(ours + "k_out.npy"), ovo = load_f32(ours + "v_out.npy");
    ASSERT_EQ(okc.data.size(), kc.size());
    ASSERT_EQ(ovc.data.size(), vc.size());
    ASSERT_EQ(okd.data.size(), k_in.data.size());
    // The input as the cache recorded it: the golden keys unchanged (identity un-rotation).
    const NpyArray oki = load_f32(ours + "k_in.npy");
    ASSERT_EQ(oki.data, k_in.data);

    // Codes equal (at an outlier both hold the level nearest 0).
    for (size_t i = 0; i < kc.size(); ++i) {
      EXPECT_EQ(int(okc.data[i]), int(kc[i]))
          << "layer " << layer << " key token " << F + int(i / kvw) << " channel " << i % kvw;
      EXPECT_EQ(int(ovc.data[i]), int(vc[i]))
          << "layer " << layer << " value token " << F + int(i / kvw) << " channel " << i % kvw;
      codes_equal += (int(okc.data[i]) == kc[i]) + (int(ovc.data[i]) == vc[i]);
    }
    codes += int64_t(2 * kc.size());
    // Outlier sets equal; their values kept (in f16).
    for (const auto& [mine, ref, in] : {std::tuple{&oko, &k_out, &k_in}, {&ovo, &v_out, &v_in}}) {
      const auto a = outlier_set(*mine), b = outlier_set(*ref);
      EXPECT_EQ(a, b) << "layer " << layer << ": outlier sets differ (" << a.size() << " vs "
                      << b.size() << ")";
      for (const auto& x : b) outliers_shared += a.count(x);
      outliers += int64_t(std::max(a.size(), b.size()));
    }
    // Decoded values within one code step of the reference's (level · range + offset with the
    // reference's parameters: keys f16 (u + l)/2, (u − l)/2 per channel, values the golden f32
    // per-token offset and range; one step = the wider gap from the reference's level to its
    // neighbours, times the range).
    auto step = [](const std::vector<float>& lut, int code, float range) {
      const size_t i = size_t(code), last = lut.size() - 1;
      const float below = i > 0 ? lut[i] - lut[i - 1] : lut[1] - lut[0];
      const float above = i < last ? lut[i + 1] - lut[i] : lut[last] - lut[last - 1];
      return std::max(below, above) * std::abs(range);
    };
    std::set<std::pair<int, int>> ko = outlier_set(k_out), vo = outlier_set(v_out);
    double worst_k = 0.0, worst_v = 0.0;
    for (int t = F; t < T; ++t)
      for (int ch = 0; ch < kvw; ++ch) {
        const size_t i = size_t(t - F) * kvw + ch, e = size_t(t) * kvw + ch;
        const float u = c.k_upper[size_t(ch)], l = c.k_lower[size_t(ch)];
        const float koff = f16_to_f32(f32_to_f16(u + l)) * 0.5f;
        const float krng = f16_to_f32(f32_to_f16(u - l)) * 0.5f;
        const float kref = ko.count({t, ch}) ? k_in.data[e] : c.k_lut[kc[i]] * krng + koff;
        const float voff = v_par.data[size_t(t - F) * 2], vrng = v_par.data[size_t(t - F) * 2 + 1];
        const float vref = vo.count({t, ch}) ? v_in.data[e] : c.v_lut[vc[i]] * vrng + voff;
        const double dk = std::abs(okd.data[e] - kref) / step(c.k_lut, kc[i], krng);
        const double dv = std::abs(ovd.data[e] - vref) / step(c.v_lut, vc[i], vrng);
        EXPECT_LE(dk, 1.0) << "layer " << layer << " key token " << t << " channel " << ch
                           << ": ours " << okd.data[e] << ", reference " << kref;
        EXPECT_LE(dv, 1.0) << "layer " << layer << " value token " << t << " channel " << ch
                           << ": ours " << ovd.data[e] << ", reference " << vref;
        worst_k = std::max(worst_k, dk);
        worst_v = std::max(worst_v, dv);
      }
    // The values' offset and range are stored in f16: the reference's f32 ones, rounded.
    for (size_t i = 0; i < opar.data.size(); ++i)
      EXPECT_EQ(opar.data[i], f16_to_f32(f32_to_f16(v_par.data[i])))
          << "layer " << layer << " " << i;
    std::printf(
        "KVQuant golden, layer %d: largest decoded difference %.4f (keys), %.4f (values) code "
        "steps\n",
        layer, worst_k, worst_v);
  }
  std::filesystem::remove_all(dump);
  ASSERT_GT(codes, 0);
  std::printf(
      "KVQuant golden: %lld of %lld codes and %lld of %lld outliers equal to the NumPy "
      "transcription's\n",
      (long long)codes_equal, (long long)codes, (long long)outliers_shared, (long long)outliers);
}

}  // namespace
}  // namespace qevict
