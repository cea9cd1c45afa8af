// End-to-end: the CLI's sessions (issue 50 item 4). `qevict chat` with piped input: two turns
// (the second prefills only its own tokens), /save, /stats, and /load in a new process that
// continues exactly as the first did; `qevict generate --prompt-cache` resumes its file on a
// second run; a truncated or foreign session file is a clear error and a non-zero exit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "e2e/e2e_process.h"

namespace qevict {
namespace {

// The first match's integer group `g` of `re` in `text`, or -1.
long find_int(const std::string& text, const std::string& re, int g = 1) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(re)) ? std::stol(m[g]) : -1;
}

using SessionCli = CliTest;

// A first message long enough that a 20 % budget of a 512-token context compresses.
std::string long_message() {
  std::string m = "Here are my notes.";
  for (int i = 0; i < 16; ++i)
    m += " The keeper of the lighthouse on the northern cape writes the weather in a blue book.";
  return m + " What does the keeper write in?";
}

const char* kChat = "chat -t 2 --temp 0 -n 24 -c 512 --kv-policy qevict --kv-budget 0.2";

TEST_F(SessionCli, ChatTwoTurnsSaveLoadStats) {
  const std::string file = path("chat.qsess");
  CliRun a = run(
      kChat, long_message() + "\n/save " + file + "\n/stats\nWhat colour is the book?\n/stats\n");
  ASSERT_EQ(a.rc, 0) << a.err;
  // Turn 2 reused the whole first turn but the pending token, and prefilled only its own.
  const long t1_prefilled = find_int(a.out, "turn 1: prefilled (\\d+), reused 0, generated (\\d+)");
  const long t1_generated =
      find_int(a.out, "turn 1: prefilled (\\d+), reused 0, generated (\\d+)", 2);
  const long t2_prefilled = find_int(a.out, "turn 2: prefilled (\\d+), reused (\\d+)");
  const long t2_reused = find_int(a.out, "turn 2: prefilled (\\d+), reused (\\d+)", 2);
  ASSERT_GT(t1_prefilled, 150) << a.out;
  EXPECT_EQ(t2_reused, t1_prefilled + t1_generated - 1) << a.out;
  EXPECT_GT(t2_prefilled, 5);
  EXPECT_LT(t2_prefilled, 40);
  EXPECT_GT(find_int(a.out, "low-bit (\\d+)\\)"), 0) << "the test needs a cache that compressed\n"
                                                     << a.out;
  EXPECT_NE(a.err.find("[saved "), std::string::npos) << a.err;
  ASSERT_TRUE(std::filesystem::exists(file));

  // A new process loads the file and asks the same second question: the same turn, the same
  // greedy reply as the first process gave.
  CliRun b = run(kChat, "/load " + file + "\nWhat colour is the book?\n/stats\n/exit\n");
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_NE(b.err.find("cache state restored"), std::string::npos) << b.err;
  EXPECT_EQ(find_int(b.out, "turn 1: prefilled (\\d+), reused (\\d+)"), t2_prefilled) << b.out;
  EXPECT_EQ(find_int(b.out, "turn 1: prefilled (\\d+), reused (\\d+)", 2), t2_reused) << b.out;
  // stdout: a's is reply 1, /stats (its last line "turn 1: ..."), reply 2, /stats; b's is the
  // reply, then /stats.
  const size_t s1 = a.out.find("tokens: ");
  const size_t r2 = a.out.find('\n', a.out.find("turn 1: ", s1)) + 1;
  const std::string a_reply = a.out.substr(r2, a.out.find("tokens: ", r2) - r2);
  const std::string b_reply = b.out.substr(0, b.out.find("tokens: "));
  EXPECT_GT(a_reply.size(), 1u);
  EXPECT_EQ(b_reply, a_reply);
}

TEST_F(SessionCli, ChatScriptErrorsEndWithStatusOne) {
  const std::string file = path("chat.qsess");
  ASSERT_EQ(run(kChat, "Hello there.\n/save " + file + "\n").rc, 0);
  const std::string bytes = slurp(file);
  {
    std::ofstream f(path("cut.qsess"), std::ios::binary);
    f << bytes.substr(0, bytes.size() / 2);
  }
  CliRun r = run(kChat, "/load " + path("cut.qsess") + "\nHello?\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << "the chat went on after the error: " << r.out;
  CliRun u = run(kChat, "/frobnicate\n");
  EXPECT_EQ(u.rc, 1);
  EXPECT_NE(u.err.find("unknown command '/frobnicate'"), std::string::npos) << u.err;
}

const char* kPrompt =
    "The history of the printing press begins in the workshops of fifteenth-century Mainz, where "
    "a goldsmith combined a screw press, oil-based ink and movable metal type.";

TEST_F(SessionCli, PromptCacheIsReusedOnTheSecondRun) {
  const std::string file = path("p.qsess");
  const std::string gen =
      "generate -t 2 --temp 0 -n 8 -c 512 --quiet --kv-policy full --prompt-cache ";
  CliRun a = run(gen + file + " -p '" + kPrompt + "'");
  ASSERT_EQ(a.rc, 0) << a.err;
  const long n_prompt = find_int(a.err, "reused 0 tokens, prefilled (\\d+)");
  ASSERT_GT(n_prompt, 20) << a.err;
  // The prompt extended: its first part comes from the file.
  CliRun b = run(gen + file + " -p '" + kPrompt + " Within fifty years'");
  ASSERT_EQ(b.rc, 0) << b.err;
  const long reused = find_int(b.err, "reused (\\d+) tokens, prefilled (\\d+)");
  const long prefilled = find_int(b.err, "reused (\\d+) tokens, prefilled (\\d+)", 2);
  EXPECT_GE(reused, n_prompt - 1) << b.err;
  EXPECT_LT(prefilled, 8) << b.err;

  // A compressed cache: the same prompt again reuses all of it but the last token.
  const std::string tiered =
      "generate -t 2 --temp 0 -n 4 -c 512 --quiet --kv-policy qevict --kv-budget 0.2 "
      "--prompt-cache ";
  const std::string tfile = path("t.qsess");
  ASSERT_EQ(run(tiered + tfile + " -p '" + kPrompt + "'").rc, 0);
  CliRun t = run(tiered + tfile + " -p '" + kPrompt + "'");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(find_int(t.err, "reused (\\d+) tokens, prefilled 1 "), n_prompt - 1) << t.err;

  // Other KV options: refused, naming the option.
  CliRun m =
      run("generate -t 2 --temp 0 -n 4 -c 512 --quiet --kv-policy qevict --kv-budget 0.3 "
          "--prompt-cache " +
          tfile + " -p 'x'");
  EXPECT_NE(m.rc, 0);
  EXPECT_NE(m.err.find("--kv-budget 0.2"), std::string::npos) << m.err;
  // No common prefix: a new session, said on stderr.
  CliRun f = run(gen + file + " -p 'Completely different.'");
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_NE(f.err.find("shares no prefix"), std::string::npos) << f.err;
}

TEST_F(SessionCli, TruncatedPromptCacheIsAClearError) {
  const std::string file = path("p.qsess");
  const std::string gen = "generate -t 2 --temp 0 -n 4 -c 512 --quiet --prompt-cache ";
  ASSERT_EQ(run(gen + file + " -p 'Hello world'").rc, 0);
  const std::string bytes = slurp(file);
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f << bytes.substr(0, bytes.size() - 1000);
  }
  CliRun r = run(gen + file + " -p 'Hello world'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(file).size(), bytes.size() - 1000) << "a failed run must not rewrite the file";
  {
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f << "not a session";
  }
  r = run(gen + file + " -p 'Hello world'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("magic"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qevict
