// End-to-end: `qevict eval --protocol end,after,multi` on SmolLM2 (QEVICT_TEST_MODEL; skipped
// when unset) — the pipeline of issue 51's protocols, not their scores: `after` splits the
// prompt into two turns and `multi` into five, each line carries its protocol (and multi its
// question's turn), the diagnostics follow the turns (the cache holds turn 1 when the question
// arrives; FullKV holds every needle token in F; FullKV's attention during the turn split by
// each variant's tiers, with the per-turn table), and a rerun skips every cell.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace qevict {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EvalProtocols, AfterAndMultiRunInTurnsAndResume) {
  const char* model = std::getenv("QEVICT_TEST_MODEL");
  if (!model || !*model) GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("qevict_eval_protocols_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string out = dir.string(), err = out + ".stderr";
  const std::string cmd = std::string(QEVICT_CLI) + " eval -t 2 -m '" + model +
                          "' --tasks niah_multikey_1 --lengths 1024 --samples 1 --variants "
                          "full,snapkv,qevict --budgets 0.3 --protocol end,after,multi --out '" +
                          out + "' > /dev/null 2> '" + err + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(err);

  std::ifstream in(out + "/results.jsonl");
  std::map<std::string, int> by_protocol, mass_lines;
  std::map<std::string, std::vector<double>> text_share;  // FullKV's mass on the text, per turn
  int64_t end_prompt = 0;
  for (std::string l; std::getline(in, l);) {
    const auto j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << l;
    const std::string p = j.value("protocol", "end");
    ++by_protocol[p];
    const double score = j["score"].get<double>();
    EXPECT_GE(score, 0.0) << l;
    EXPECT_LE(score, 1.0) << l;
    if (p == "end") {
      // The lines of every grid before protocols: no protocol fields.
      EXPECT_FALSE(j.contains("turn_tokens")) << l;
      EXPECT_FALSE(j.contains("diagnostics")) << l;
      end_prompt = j["prompt_tokens"].get<int64_t>();
      continue;
    }
    const auto& turns = j["turn_tokens"];
    ASSERT_EQ(turns.size(), p == "after" ? 2u : 5u) << l;
    int64_t sum = 0;
    for (const auto& t : turns) sum += t.get<int64_t>();
    EXPECT_EQ(sum, j["prompt_tokens"].get<int64_t>()) << l;
    const auto& d = j["diagnostics"];
    const int turn = p == "multi" ? j["turn"].get<int>() : 1;
    if (p == "multi") {
      EXPECT_GE(turn, 1) << l;
      EXPECT_LE(turn, 4) << l;
    } else {
      EXPECT_FALSE(j.contains("turn")) << l;
    }
    const int64_t before = d["before"]["n_past"].get<int64_t>();
    if (turn == 1)
      EXPECT_EQ(before, turns[0].get<int64_t>()) << "the question arrives after turn 1: " << l;
    else
      EXPECT_GT(before, turns[0].get<int64_t>()) << l;
    EXPECT_GT(d["after"]["n_past"].get<int64_t>(), before) << l;
    // The needle of the key asked was found in turn 1's tokens; FullKV keeps all of it.
    const auto& tiers = d["before"]["needle_tiers"];
    const int64_t n_needle = tiers["L"].get<int64_t>() + tiers["F"].get<int64_t>() +
                             tiers["Q"].get<int64_t>() + tiers["E"].get<int64_t>();
    EXPECT_GT(n_needle, 0) << l;
    if (j["variant"] == "full") {
      EXPECT_EQ(tiers["F"].get<int64_t>(), n_needle) << l;
      EXPECT_EQ(d["promotions"].get<int64_t>(), 0) << l;
    }
    // FullKV's attention during the turn by this variant's tiers: shares summing to 1; FullKV
    // holds the whole text in F, so it has no Q and no E, and the question and the answer look
    // at the text (F) and at the turn's own tokens (L). snapkv at 0.3 evicted part of the
    // text (and has no Q): part of FullKV's attention falls on E. qevict holds part of the
    // text in Q; it is the only tiered cache, the only one with its own mass (no E there).
    const std::string v = j["variant"].get<std::string>();
    ASSERT_TRUE(d.contains("fullkv_mass")) << l;
    ASSERT_EQ(d.contains("own_mass"), v == "qevict") << l;
    for (const char* part : {"prompt", "turn"}) {
      const auto& m = d["fullkv_mass"][part];
      const double L = m["L"].get<double>(), F = m["F"].get<double>(), Q = m["Q"].get<double>(),
                   E = m["E"].get<double>();
      EXPECT_NEAR(L + F + Q + E, 1.0, 1e-5) << part << ": " << l;
      EXPECT_GT(L, 0.0) << part << ": " << l;
      EXPECT_GT(F, 0.0) << part << ": " << l;
      if (v == "qevict") {
        EXPECT_GT(Q, 0.0) << part << ": " << l;
      } else {
        EXPECT_EQ(Q, 0.0) << part << ": " << l;
      }
      if (v == "full") {
        EXPECT_EQ(E, 0.0) << part << ": " << l;
      } else if (v == "snapkv") {
        EXPECT_GT(E, 0.0) << part << ": " << l;
      }
      if (v != "qevict") continue;
      const auto& o = d["own_mass"][part];
      EXPECT_NEAR(o["L"].get<double>() + o["F"].get<double>() + o["Q"].get<double>(), 1.0, 1e-5)
          << part << ": " << l;
      EXPECT_EQ(o["E"].get<double>(), 0.0) << part << ": " << l;
      EXPECT_GT(o["Q"].get<double>(), 0.0) << part << ": " << l;
    }
    ++mass_lines[j["variant"].get<std::string>()];
    const auto& t = d["fullkv_mass"]["turn"];
    text_share[p + std::to_string(turn)].push_back(t["F"].get<double>() + t["Q"].get<double>() +
                                                   t["E"].get<double>());
  }
  // FullKV's mass is one recording per turn, split by each variant's map: FullKV's F is its
  // share on the whole text; a compressed cache's F + Q + E leaves out the text it holds as L
  // (its sink and local or recent tokens).
  for (const auto& [turn, shares] : text_share) {
    ASSERT_EQ(shares.size(), 3u) << turn;
    EXPECT_GE(shares[0] + 1e-5, shares[1]) << turn << ": full, snapkv";
    EXPECT_GE(shares[0] + 1e-5, shares[2]) << turn << ": full, qevict";
  }
  EXPECT_EQ(mass_lines["full"], 5);
  EXPECT_EQ(mass_lines["snapkv"], 5);
  EXPECT_EQ(mass_lines["qevict"], 5);
  EXPECT_EQ(by_protocol["end"], 3);
  EXPECT_EQ(by_protocol["after"], 3);
  EXPECT_EQ(by_protocol["multi"], 12);
  EXPECT_GT(end_prompt, 0);
  const std::string csv = slurp(out + "/summary.csv");
  EXPECT_EQ(csv.rfind("task,length,variant,budget,n,mean,ci95_low,ci95_high,protocol\n", 0), 0u)
      << csv;
  EXPECT_NE(csv.find(",multi.t4\n"), std::string::npos) << csv;
  // The per-turn table: a row per protocol turn and variant (5 × 3).
  const std::string turns = slurp(out + "/turns.csv");
  EXPECT_EQ(std::count(turns.begin(), turns.end(), '\n'), 16) << turns;
  EXPECT_NE(turns.find("\n1024,multi.t4,snapkv,0.3,1,"), std::string::npos) << turns;
  EXPECT_NE(slurp(out + "/summary.md").find("## Turn diagnostics"), std::string::npos);

  // Resume: every cell of every protocol is found.
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(err);
  EXPECT_NE(slurp(err).find("18 of 18 cells already done, 0 to run"), std::string::npos)
      << slurp(err);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(err);
}

}  // namespace
}  // namespace qevict
