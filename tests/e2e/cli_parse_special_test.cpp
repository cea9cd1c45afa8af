// `qevict generate` reads special-token text in its prompt (-p and -f) as those tokens, like
// llama-cli and `qevict tokenize`, unless --no-parse-special: both commands give the same
// number of prompt tokens for a ChatML prompt, with the flag and without.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

namespace qevict {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class CliParseSpecial : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* m = std::getenv("QEVICT_TEST_MODEL");
    if (!m || !*m) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
    model_ = m;
    dir_ = std::filesystem::temp_directory_path() /
           ("qevict_cli_parse_special_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // The prompt-token count `qevict tokenize --ids --add-special` prints (generate adds BOS/EOS
  // as the model asks).
  long tokenize_count(const std::string& input, const std::string& extra) {
    const std::string out = (dir_ / "ids.txt").string();
    const std::string cmd = std::string(QEVICT_CLI) + " tokenize -m " + model_ + " " + input +
                            " --ids --add-special " + extra + " >" + out;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::string ids = slurp(out);
    if (ids.find(']') == 1) return 0;  // "[]"
    return long(std::count(ids.begin(), ids.end(), ',')) + 1;
  }
  // The "prompt: N tokens" of generate's timing line (stderr).
  long generate_count(const std::string& input, const std::string& extra) {
    const std::string err = (dir_ / "gen.err").string();
    const std::string cmd = std::string(QEVICT_CLI) + " generate -m " + model_ + " -t 2 " + input +
                            " -n 1 --temp 0 --quiet " + extra + " >/dev/null 2>" + err;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);
    std::smatch m;
    const std::string text = slurp(err);
    if (!std::regex_search(text, m, std::regex("prompt: (\\d+) tokens"))) {
      ADD_FAILURE() << "no prompt line in: " << text;
      return -1;
    }
    return std::stol(m[1]);
  }
  std::string model_;
  std::filesystem::path dir_;
};

TEST_F(CliParseSpecial, GenerateAndTokenizeAgreeOnAChatMlPrompt) {
  const auto file = dir_ / "prompt.txt";
  {
    std::ofstream f(file, std::ios::binary);
    f << "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
  }
  const std::string f_arg = "-f " + file.string();
  const long special = tokenize_count(f_arg, "");
  const long plain = tokenize_count(f_arg, "--no-parse-special");
  // Each of the 3 special markers is one token when parsed, several as text.
  EXPECT_GE(plain, special + 3 * 2) << "special " << special << ", plain " << plain;
  EXPECT_EQ(generate_count(f_arg, ""), special);
  EXPECT_EQ(generate_count(f_arg, "--no-parse-special"), plain);
  // -p too.
  const std::string p_arg = "-p '<|im_start|>user Hi<|im_end|>'";
  EXPECT_EQ(generate_count(p_arg, ""), tokenize_count(p_arg, ""));
  EXPECT_EQ(generate_count(p_arg, "--no-parse-special"),
            tokenize_count(p_arg, "--no-parse-special"));
  EXPECT_LT(tokenize_count(p_arg, ""), tokenize_count(p_arg, "--no-parse-special"));
}

}  // namespace
}  // namespace qevict
