// The CLI's --matmul choice (tools/cli_common.h) on the real model: measuring commands
// (perplexity here) default to exact f32 decode matmuls, so their default output is
// bit-identical to --matmul f32, and --matmul q8 (llama.cpp's 8-bit activations) changes
// the logits where the CPU has the 8-bit path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "kernels/matmul.h"

namespace qevict {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(CliMatmul, PerplexityDefaultsToExactF32AndQ8Differs) {
  const char* model = std::getenv("QEVICT_TEST_MODEL");
  if (!model || !*model) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
  const auto dir =
      std::filesystem::temp_directory_path() / ("qevict_cli_matmul_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // Calls of 16 tokens: the decode-sized regime the choice is about.
  auto run = [&](const std::string& extra, const std::string& out) {
    const std::string cmd = std::string(QEVICT_CLI) + " perplexity -m " + model + " -t 2 -f " +
                            QEVICT_TEST_DATA_DIR "/golden/english_gpl3.txt --max-tokens 96 -b 16 " +
                            extra + " --logits-out " + (dir / out).string() + " >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return slurp(dir / out);
  };
  const std::string dflt = run("", "default.npy");
  const std::string f32 = run("--matmul f32", "f32.npy");
  ASSERT_GT(dflt.size(), 1000u);
  EXPECT_TRUE(dflt == f32) << "perplexity's default is not the exact f32 path";
  if (matmul_q8_enabled()) {
    const std::string q8 = run("--matmul q8", "q8.npy");
    ASSERT_EQ(q8.size(), f32.size());
    EXPECT_FALSE(q8 == f32) << "--matmul q8 did not change the logits";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qevict
