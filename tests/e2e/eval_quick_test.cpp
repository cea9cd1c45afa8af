// End-to-end: `qevict eval --profile quick` on Qwen2.5-Coder-0.5B (QEVICT_TEST_MODEL_QWEN; skipped
// when unset) — the pipeline, not the scores: every result line parses with a score in [0, 1],
// the summary is written, a rerun into the same directory skips every cell, and FullKV answers
// the single-needle sample (a model that never can would mean a broken prompt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace qevict {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(EvalQuick, RunsScoresAndResumes) {
  const char* model = std::getenv("QEVICT_TEST_MODEL_QWEN");
  if (!model || !*model) GTEST_SKIP() << "QEVICT_TEST_MODEL_QWEN is not set";
  const auto dir =
      std::filesystem::temp_directory_path() / ("qevict_eval_quick_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string out = dir.string(), err = out + ".stderr";
  const std::string cmd = std::string(QEVICT_CLI) + " eval --profile quick -t 2 -m '" + model +
                          "' --out '" + out + "' > /dev/null 2> '" + err + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);

  // The profile as a user runs it: niah_single_1 and vt, 1 sample each at 4K, full and
  // qevict:route=end@0.2, the second replaying the first's prefill (47 s on the 2-core host
  // on 2026-12-06; it was cut to niah_single_1 at 2K while it took ~5 min).
  const auto lines = lines_of(out + "/results.jsonl");
  ASSERT_EQ(lines.size(), 4u) << slurp(err);
  int full_niah_right = 0;
  for (const auto& l : lines) {
    const auto j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << l;
    const double score = j["score"].get<double>();
    EXPECT_GE(score, 0.0) << l;
    EXPECT_LE(score, 1.0) << l;
    EXPECT_LE(j["prompt_tokens"].get<int64_t>() + j["max_new_tokens"].get<int64_t>(), 4096) << l;
    EXPECT_GT(j["prompt_tokens"].get<int64_t>(), 3500) << l;  // fitted close to the length
    EXPECT_GT(j["bytes_held"].get<int64_t>(), 0) << l;
    EXPECT_EQ(j["prefill_shared"].get<bool>(), j["variant"] != "full") << l;
    EXPECT_EQ(j["prefill_model_tokens"].get<int64_t>(), j["prompt_tokens"].get<int64_t>()) << l;
    // The prefill's parts (model, replay, end_prompt) add up to its wall time, and the model's
    // forward calls take time.
    const auto& parts = j["prefill_parts"];
    const double model_s = parts["model"].get<double>();
    EXPECT_GT(model_s, 0.0) << l;
    EXPECT_NEAR(model_s + parts["replay"].get<double>() + parts["end_prompt"].get<double>(),
                j["prefill_seconds"].get<double>(), 0.01)
        << l;
    if (j["variant"] == "full" && j["task"] == "niah_single_1" && score == 1.0) ++full_niah_right;
  }
  EXPECT_GE(full_niah_right, 1) << "FullKV found no single needle:\n"
                                << slurp(out + "/results.jsonl");
  const std::string csv = slurp(out + "/summary.csv");
  EXPECT_EQ(csv.rfind("task,length,variant,budget,n,mean,ci95_low,ci95_high\n", 0), 0u) << csv;
  EXPECT_NE(slurp(out + "/summary.md").find("## 4096 tokens"), std::string::npos);

  // Resume: the same command again runs nothing and adds no line.
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(err);
  EXPECT_NE(slurp(err).find("4 of 4 cells already done, 0 to run"), std::string::npos)
      << slurp(err);
  EXPECT_EQ(lines_of(out + "/results.jsonl"), lines);

  // A fresh clone has only the gzipped copy (the plain file is not committed): the run
  // restores results.jsonl from it and resumes.
  ASSERT_TRUE(std::filesystem::exists(out + "/results.jsonl.gz"));
  std::filesystem::remove(out + "/results.jsonl");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(err);
  EXPECT_NE(slurp(err).find("4 of 4 cells already done, 0 to run"), std::string::npos)
      << slurp(err);
  EXPECT_EQ(lines_of(out + "/results.jsonl"), lines);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(err);
}

}  // namespace
}  // namespace qevict
