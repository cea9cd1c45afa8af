// --prefill-route staged on SmolLM2 through the CLI (issue 52 item 1): `qevict generate
// --kv-stats` on a ~2K-token prompt at 20 %, with staged, end and FullKV. The staged run's
// peak bytes held stays within the stated bound (tests/common/staged_bound.h: the store's
// sink + local + the prompt at M_q + one 512-token call, and the cache's tables and scratch
// for one layer) and below both FullKV's bytes for the same prompt and the end run's peak
// (the whole prompt in f16 plus scratch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "common/staged_bound.h"
#include "kvcache/budget.h"
#include "kvcache/options.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"
#include "model/model.h"

namespace qevict {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct CliRun {
  int rc = -1;
  int64_t prompt_tokens = 0;
  double peak_mib = 0.0;
  std::string err;
};

class StagedRouteCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* m = std::getenv("QEVICT_TEST_MODEL");
    if (!m || !*m) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
    model_ = m;
    const std::string tag = std::to_string(::getpid());
    dir_ = std::filesystem::temp_directory_path();
    prompt_ = dir_ / ("qevict_staged_prompt_" + tag + ".txt");
    err_ = dir_ / ("qevict_staged_" + tag + ".err");
    // ~2K tokens of dictionary words (every 37th, wrapping), the same on every run.
    std::ifstream words("/usr/share/dict/words");
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.empty()) GTEST_SKIP() << "no /usr/share/dict/words";
    std::ofstream out(prompt_);
    for (size_t i = 0; i < 850; ++i) out << w[(i * 37) % w.size()] << ' ';
  }
  void TearDown() override {
    if (!prompt_.empty()) std::filesystem::remove(prompt_);
    if (!err_.empty()) std::filesystem::remove(err_);
  }
  CliRun generate(const std::string& kv) {
    const std::string cmd = std::string(QEVICT_CLI) + " generate -m " + model_ + " -t 2 -f " +
                            prompt_.string() + " -n " + std::to_string(kPredict) +
                            " --temp 0 --kv-stats " + kv + " >/dev/null 2>" + err_.string();
    CliRun r;
    r.rc = std::system(cmd.c_str());
    r.err = slurp(err_);
    std::smatch m;
    if (std::regex_search(r.err, m, std::regex("prompt: (\\d+) tokens")))
      r.prompt_tokens = std::stoll(m[1]);
    if (std::regex_search(r.err, m, std::regex("\\(peak ([0-9.]+) MiB\\)")))
      r.peak_mib = std::stod(m[1]);
    return r;
  }
  static constexpr int kPredict = 4;
  std::string model_;
  std::filesystem::path dir_, prompt_, err_;
};

TEST_F(StagedRouteCli, PeakBelowTheBoundFullKvAndEnd) {
  const CliRun staged = generate("--kv-policy qevict --kv-budget 0.2 --prefill-route staged");
  ASSERT_EQ(staged.rc, 0) << staged.err;
  const CliRun end = generate("--kv-policy qevict --kv-budget 0.2 --prefill-route end");
  ASSERT_EQ(end.rc, 0) << end.err;
  const CliRun full = generate("--kv-policy full");
  ASSERT_EQ(full.rc, 0) << full.err;
  ASSERT_GT(staged.prompt_tokens, 1500) << staged.err;
  ASSERT_LT(staged.prompt_tokens, 4096) << staged.err;
  EXPECT_NE(staged.err.find("prompt staged in Q"), std::string::npos) << staged.err;

  // The bound for this model, prompt and budget (generate's context: prompt + -n).
  auto model = Model::load(model_);
  ASSERT_TRUE(model.has_value()) << model.error();
  const KvShape s = (*model)->kv_shape();
  KvCacheParams p;
  KvParamsGiven given;
  p.policy = "qevict";
  p.budget_fraction = 0.2;
  ASSERT_TRUE(set_kv_option(&p, &given, "prefill_route", "staged").is_ok());
  ASSERT_TRUE(apply_policy_defaults(&p, given).is_ok());
  const int64_t n = staged.prompt_tokens;
  auto b = compute_budget(CacheKind::kWindowed, s, n + kPredict, p);
  ASSERT_TRUE(b.has_value()) << b.error();
  // The RoPE table below 65,536 positions: bytes_held_constant's (tests/common/bytes_bound.h).
  const size_t rope = size_t(2 * 2 + 1) * 256 * s.head_dim * sizeof(float);
  const size_t bound = test::staged_store_bound(s, *b, n, 512) +
                       test::staged_rest_bound(s, *b, n, 512, p.prefill_window, rope, 2);
  const double mib = 1048576.0;
  std::printf("%lld prompt tokens: peak staged %.2f MiB (bound %.2f), end %.2f, FullKV %.2f\n",
              (long long)n, staged.peak_mib, bound / mib, end.peak_mib, full.peak_mib);
  EXPECT_LE(staged.peak_mib, bound / mib + 0.01);  // + the printed figure's rounding
  EXPECT_LT(staged.peak_mib, full.peak_mib);
  EXPECT_LT(staged.peak_mib, end.peak_mib);
}

}  // namespace
}  // namespace qevict
