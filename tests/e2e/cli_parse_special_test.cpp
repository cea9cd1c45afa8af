// `qevict generate` reads special-token text in its prompt (-p and -f) as those tokens, like
// llama-cli and `qevict tokenize`, unless --no-parse-special: both commands give the same
// number of prompt tokens for a ChatML prompt, with the flag and without.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>

#include "e2e/e2e_process.h"

namespace qevict {
namespace {

class CliParseSpecial : public CliTest {
 protected:
  // The prompt-token count `qevict tokenize --ids --add-special` prints (generate adds BOS/EOS
  // as the model asks).
  long tokenize_count(const std::string& input, const std::string& extra) {
    const CliRun r = run("tokenize " + input + " --ids --add-special " + extra);
    EXPECT_EQ(r.rc, 0) << r.cmd << "\n" << r.err;
    const std::string& ids = r.out;
    if (ids.find(']') == 1) return 0;  // "[]"
    return long(std::count(ids.begin(), ids.end(), ',')) + 1;
  }
  // The "prompt: N tokens" of generate's timing line (stderr).
  long generate_count(const std::string& input, const std::string& extra) {
    const CliRun r = run("generate -t 2 " + input + " -n 1 --temp 0 --quiet " + extra);
    EXPECT_EQ(r.rc, 0) << r.cmd << "\n" << r.err;
    std::smatch m;
    if (!std::regex_search(r.err, m, std::regex("prompt: (\\d+) tokens"))) {
      ADD_FAILURE() << "no prompt line in: " << r.err;
      return -1;
    }
    return std::stol(m[1]);
  }
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
