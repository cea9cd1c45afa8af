// End-to-end: our forward pass on real models against llama.cpp's logits and greedy text
// (tests/golden/model_golden*.json, made by tools/golden/make_model_golden.py with
// llama.cpp's own tokenization, so these tests do not depend on our tokenizer). Each model
// runs when its environment variable points at it (tools/test.sh sets both):
//   QEVICT_TEST_MODEL       SmolLM2-135M-Instruct Q4_1 (llama)  model_golden.json
//   QEVICT_TEST_MODEL_QWEN  Qwen2.5-Coder-0.5B-Instruct Q4_K_M model_golden_qwen2.5-coder-0.5b.json
//                           (qwen2: QKV bias, NeoX RoPE, untied output; Q5_0/Q8_0/Q4_K/Q6_K)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "e2e/real_model_fixture.h"
#include "engine/generator.h"
#include "kernels/matmul.h"
#include "kvcache/full_cache.h"
#include "model/model.h"

namespace qevict {
namespace {

using nlohmann::json;

// One real model under test: where its path comes from and its golden file.
struct GoldenModel {
  const char* name;     // test-name suffix
  const char* env_var;  // holds the GGUF path; the tests skip when it is unset
  const char* golden;   // file in tests/golden/
};

void PrintTo(const GoldenModel& m, std::ostream* os) { *os << m.name; }

const GoldenModel kModels[] = {
    {"SmolLM2", "QEVICT_TEST_MODEL", "model_golden.json"},
    {"Qwen25Coder05B", "QEVICT_TEST_MODEL_QWEN", "model_golden_qwen2.5-coder-0.5b.json"},
    // Issue 53's second long-context model (1.1 GB, 22 wheels: not fetched by CI; set the
    // variable to `tools/fetch_model.sh qwen2.5-coder-1.5b | tail -n1` to run it).
    {"Qwen25Coder15B", "QEVICT_TEST_MODEL_QWEN15", "model_golden_qwen2.5-coder-1.5b.json"},
};

class ModelGolden : public ::testing::TestWithParam<GoldenModel> {
 protected:
  void SetUp() override {
    const char* path = std::getenv(GetParam().env_var);
    if (!path || !*path) GTEST_SKIP() << GetParam().env_var << " is not set";
    auto m = Model::load(path);
    ASSERT_TRUE(m.has_value()) << m.error();
    model_ = std::move(*m);
    std::ifstream in(std::string(QEVICT_TEST_DATA_DIR "/golden/") + GetParam().golden);
    ASSERT_TRUE(in.good()) << "cannot open golden file " << GetParam().golden;
    golden_ = json::parse(in);
    // A model that does not match the golden data (wrong file in the variable) would fail
    // every comparison below; say so once instead.
    ASSERT_GT(model_->config().n_vocab, golden_["greedy"]["ids"][0].get<int32_t>())
        << path << " is not the model of " << GetParam().golden;
  }
  // Teacher-forced logits of the golden tokens, fed `chunk` tokens per forward call.
  std::vector<float> teacher_forced(int64_t chunk) {
    std::vector<int32_t> tokens = golden_["tokens"].get<std::vector<int32_t>>();
    const int32_t V = model_->config().n_vocab;
    FullKvCache cache(model_->kv_shape(), int64_t(tokens.size()));
    std::vector<float> logits(tokens.size() * size_t(V));
    for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
      const int64_t n = std::min<int64_t>(chunk, int64_t(tokens.size() - i));
      std::vector<BatchSegment> segs{{&cache, tokens.data() + i, n, true, logits.data() + i * V}};
      EXPECT_TRUE(model_->forward(segs, pool_).is_ok());
    }
    return logits;
  }
  std::unique_ptr<Model> model_;
  json golden_;
  ThreadPool pool_{2};
};

INSTANTIATE_TEST_SUITE_P(Models, ModelGolden, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param.name); });

// Teacher-forced logits at 64 positions of a 1,100-token English text: top-1 must agree
// and the top-16 logits must be close. The golden logits are llama.cpp's on an F32 copy of
// the weights (BENCHMARKS.md §1), so both sides compute in f32 and differ by hundredths.
TEST_P(ModelGolden, TeacherForcedLogitsMatchLlamaCpp) {
  const int32_t V = model_->config().n_vocab;
  const std::vector<float> logits = teacher_forced(256);
  int agree = 0, n = 0;
  double worst = 0;
  std::string worst_where;
  for (const auto& e : golden_["teacher_forced"]) {
    const int64_t pos = e["pos"];
    const float* z = logits.data() + pos * V;
    const auto ids = e["ids"].get<std::vector<int32_t>>();
    const auto want = e["logits"].get<std::vector<double>>();
    int32_t best = 0;
    for (int32_t v = 1; v < V; ++v)
      if (z[v] > z[best]) best = v;
    ++n;
    if (best == ids[0]) {
      ++agree;
    } else {
      // A disagreement is acceptable only at a near-tie in llama.cpp's own logits.
      EXPECT_LT(want[0] - z[ids[0]] + (z[best] - want[0]), 0.2)
          << "top-1 differs at position " << pos << ": ours " << best << " (" << z[best]
          << "), llama.cpp " << ids[0] << " (" << want[0] << ")";
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      const double d = std::fabs(z[ids[k]] - want[k]);
      if (d > worst) {
        worst = d;
        worst_where = "position " + std::to_string(pos) + " token " + std::to_string(ids[k]) +
                      ": ours " + std::to_string(z[ids[k]]) + " llama.cpp " +
                      std::to_string(want[k]);
      }
    }
  }
  EXPECT_GE(agree, n - 1) << "top-1 agreement " << agree << "/" << n;
  EXPECT_LT(worst, 0.1) << "largest top-16 logit difference at " << worst_where;
  std::printf("top-1 agreement %d/%d, largest top-16 logit difference %.4f (%s)\n", agree, n, worst,
              worst_where.c_str());
}

// The 8-bit-activation decode path (calls of < 32 tokens, kernels/matmul.h), teacher-forced
// in calls of 16 tokens: it rounds every matmul input to 8 bits per 32-block, as llama.cpp
// does with the quantized file, so it is held to what that costs, not to f32 rounding.
// Measured (2026-12-02) against the f32 golden: SmolLM2 60/64 top-1, largest top-16 logit
// difference 0.90; Qwen2.5-0.5B 62/64, 0.22 (llama.cpp on SmolLM2's Q4_1 file itself: top-1
// 95.7 % against a float64 forward pass, tools/golden/dequantize_gguf.py). A layout or
// scale error gives garbage (top-1 near 0), far outside these bounds.
TEST_P(ModelGolden, EightBitDecodePathStaysNearLlamaCpp) {
  if (!matmul_q8_enabled()) GTEST_SKIP() << "the 8-bit path is off or this CPU lacks AVX-512 VNNI";
  const int32_t V = model_->config().n_vocab;
  const std::vector<float> logits = teacher_forced(16);
  int agree = 0, n = 0;
  double worst = 0;
  for (const auto& e : golden_["teacher_forced"]) {
    const float* z = logits.data() + e["pos"].get<int64_t>() * V;
    const auto ids = e["ids"].get<std::vector<int32_t>>();
    const auto want = e["logits"].get<std::vector<double>>();
    agree += int(std::max_element(z, z + V) - z) == ids[0];
    ++n;
    for (size_t k = 0; k < ids.size(); ++k) worst = std::max(worst, std::fabs(z[ids[k]] - want[k]));
  }
  EXPECT_GE(agree, n - 8) << "top-1 agreement " << agree << "/" << n;
  EXPECT_LT(worst, 2.0) << "largest top-16 logit difference";
  std::printf("8-bit decode path: top-1 agreement %d/%d, largest top-16 logit difference %.4f\n",
              agree, n, worst);
}

// Greedy decoding of a committed ChatML prompt: 64 tokens equal llama.cpp's. If the two
// part, it must be at a near-tie (llama.cpp's two best logits within 1e-2), and we say so.
TEST_P(ModelGolden, GreedyGenerationMatchesLlamaCpp) {
  // llama.cpp's golden tokens come from f32 weights and f32 products: the exact path's claim.
  const MatmulPaths no_q8(/*amx=*/true, /*q8=*/false);
  const auto& g = golden_["greedy"];
  GenerationRequest req;
  FullKvCache cache(model_->kv_shape(), 512);
  req.cache = &cache;
  req.prompt = g["prompt_ids"].get<std::vector<int32_t>>();
  req.n_predict = 64;
  req.sampling.temperature = 0.0f;
  std::vector<GenerationRequest> reqs{req};
  GenerationStats st;
  ASSERT_TRUE(generate(*model_, pool_, reqs, GenerateOptions{}, nullptr, &st).is_ok());
  const auto want = g["ids"].get<std::vector<int32_t>>();
  const auto& got = reqs[0].output;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    const double l0 = g["top2"][i][0][1], l1 = g["top2"][i][1][1];
    std::printf(
        "greedy outputs part at step %zu (ours %d, llama.cpp %d); llama.cpp's top-2 logits there: "
        "%.5f vs %.5f\n",
        i, got[i], want[i], l0, l1);
    EXPECT_LT(l0 - l1, 1e-2) << "greedy outputs part at step " << i << " without a near-tie";
    return;
  }
  std::printf("greedy: all %zu tokens equal llama.cpp's\n", want.size());
}

// Two sequences decoded in one batch give exactly what each gives alone.
TEST_P(ModelGolden, BatchedTwoSequencesEqualSeparateRuns) {
  // Exact paths: a batched prefill chunk (2 x 16 tokens) reaches the AMX path where a chunk
  // alone (16) takes the 8-bit one, and those two round differently (flipped a greedy token).
  const MatmulPaths exact(/*amx=*/false, /*q8=*/false);
  const auto& g = golden_["greedy"];
  std::vector<int32_t> p1 = g["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> tokens = golden_["tokens"].get<std::vector<int32_t>>();
  std::vector<int32_t> p2(tokens.begin(), tokens.begin() + 37);
  auto run = [&](std::vector<std::vector<int32_t>> prompts) {
    std::vector<std::unique_ptr<FullKvCache>> caches;
    std::vector<GenerationRequest> reqs;
    for (auto& p : prompts) {
      caches.push_back(std::make_unique<FullKvCache>(model_->kv_shape(), 512));
      GenerationRequest r;
      r.cache = caches.back().get();
      r.prompt = p;
      r.n_predict = 24;
      r.sampling.temperature = 0.0f;
      reqs.push_back(r);
    }
    GenerateOptions o;
    o.prefill_chunk = 16;  // several chunks, batched across the two sequences
    EXPECT_TRUE(generate(*model_, pool_, reqs, o, nullptr, nullptr).is_ok());
    std::vector<std::vector<int32_t>> outs;
    for (auto& r : reqs) outs.push_back(r.output);
    return outs;
  };
  auto both = run({p1, p2});
  auto a = run({p1});
  auto b = run({p2});
  EXPECT_EQ(both[0], a[0]);
  EXPECT_EQ(both[1], b[0]);
}

// Twenty sequences decoding one token each in one forward call (the output matrix is then
// shared by calls of up to 16 rows: 16 + 4 here) give bit for bit the logits each gives
// alone, with whatever matmul paths are on: 20 tokens stay within the per-token paths.
TEST_P(ModelGolden, BatchedDecodeLogitsEqualEachAloneBitForBit) {
  std::vector<int32_t> tokens = golden_["tokens"].get<std::vector<int32_t>>();
  constexpr int kSeqs = 20;
  ASSERT_GE(tokens.size(), size_t(kSeqs + 8));
  const int64_t V = model_->config().n_vocab;
  // Sequence i: a prompt of the first 3 + i golden tokens, then decodes token 3 + i.
  auto prefill = [&](int i, FullKvCache* c) {
    std::vector<float> logits(static_cast<size_t>(V));
    std::vector<BatchSegment> segs(1);
    segs[0] = {c, tokens.data(), 3 + i, false, logits.data()};
    ASSERT_TRUE(model_->forward(segs, pool_).is_ok());
  };
  std::vector<std::unique_ptr<FullKvCache>> caches;
  std::vector<BatchSegment> segs;
  std::vector<float> batched(size_t(kSeqs) * size_t(V), -1.0f);
  for (int i = 0; i < kSeqs; ++i) {
    caches.push_back(std::make_unique<FullKvCache>(model_->kv_shape(), 64));
    prefill(i, caches.back().get());
    segs.push_back({caches.back().get(), tokens.data() + 3 + i, 1, false,
                    batched.data() + size_t(i) * size_t(V)});
  }
  ASSERT_TRUE(model_->forward(segs, pool_).is_ok());
  for (int i = 0; i < kSeqs; ++i) {
    FullKvCache c(model_->kv_shape(), 64);
    prefill(i, &c);
    std::vector<float> alone(static_cast<size_t>(V), -2.0f);
    std::vector<BatchSegment> one(1);
    one[0] = {&c, tokens.data() + 3 + i, 1, false, alone.data()};
    ASSERT_TRUE(model_->forward(one, pool_).is_ok());
    int differ = 0;
    for (int64_t r = 0; r < V; ++r)
      differ += std::memcmp(&alone[size_t(r)], &batched[size_t(i) * size_t(V) + size_t(r)], 4) != 0;
    EXPECT_EQ(differ, 0) << "sequence " << i << ": " << differ << " of " << V
                         << " logits differ from its run alone";
  }
}

TEST(ModelLoad, UnsupportedOrMissingFilesGiveClearErrors) {
  auto m = Model::load("/nonexistent/model.gguf");
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().find("cannot open"), std::string::npos) << m.error();
}

}  // namespace
}  // namespace qevict
