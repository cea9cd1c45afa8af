// --prefill-route staged on SmolLM2 through the CLI (issue 52 item 1): `qevict generate
// --kv-stats` on a ~2K-token prompt at 20 %, with staged, end and FullKV. The staged run's
// peak bytes held stays within the stated bound (tests/common/staged_bound.h: the store's
// sink + local + the prompt at M_q + one 512-token call, and the cache's tables and scratch
// for one layer) and below both FullKV's bytes for the same prompt and the end run's peak
// (the whole prompt in f16 plus scratch).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/staged_bound.h"
#include "e2e/e2e_process.h"
#include "kvcache/budget.h"
#include "kvcache/options.h"
#include "kvcache/params.h"
#include "kvcache/registry.h"
#include "model/model.h"

namespace qevict {
namespace {

// A generate run and the figures --kv-stats printed (0 when absent).
struct StagedRun : CliRun {
  int64_t prompt_tokens = 0;
  double peak_mib = 0.0;
};

class StagedRouteCli : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    if (IsSkipped()) return;
    // ~2K tokens of dictionary words (every 37th, wrapping), the same on every run.
    std::ifstream words("/usr/share/dict/words");
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (w.empty()) GTEST_SKIP() << "no /usr/share/dict/words";
    std::ofstream out(path("prompt.txt"));
    for (size_t i = 0; i < 850; ++i) out << w[(i * 37) % w.size()] << ' ';
  }
  StagedRun generate(const std::string& kv) {
    StagedRun r;
    static_cast<CliRun&>(r) = run("generate -t 2 -f " + path("prompt.txt") + " -n " +
                                  std::to_string(kPredict) + " --temp 0 --kv-stats " + kv);
    std::smatch m;
    if (std::regex_search(r.err, m, std::regex("prompt: (\\d+) tokens")))
      r.prompt_tokens = std::stoll(m[1]);
    if (std::regex_search(r.err, m, std::regex("\\(peak ([0-9.]+) MiB\\)")))
      r.peak_mib = std::stod(m[1]);
    return r;
  }
  static constexpr int kPredict = 4;
};

TEST_F(StagedRouteCli, PeakBelowTheBoundFullKvAndEnd) {
  const StagedRun staged = generate("--kv-policy qevict --kv-budget 0.2 --prefill-route staged");
  ASSERT_EQ(staged.rc, 0) << staged.err;
  const StagedRun end = generate("--kv-policy qevict --kv-budget 0.2 --prefill-route end");
  ASSERT_EQ(end.rc, 0) << end.err;
  const StagedRun full = generate("--kv-policy full");
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
