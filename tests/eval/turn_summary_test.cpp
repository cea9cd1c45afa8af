// The per-turn diagnostics table (eval/turn_summary.h) on hand-made result lines with
// hand-computed means: needle shares from the lines whose needles were found, masses from
// the lines that have them, a row per protocol turn; lines without diagnostics (end, grids
// before protocols) give none, and summary.md / turns.csv carry them only when some line has.
#include "eval/turn_summary.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "eval/eval_summary.h"
#include "eval/ruler_resources.h"

namespace qevict::eval {
namespace {

using json = nlohmann::json;

json shares(double l, double f, double q, double e) {
  return json{{"L", l}, {"F", f}, {"Q", q}, {"E", e}};
}

json line(const std::string& variant, double budget, const std::string& protocol, int turn,
          double score) {
  json j{{"task", "niah_multikey_1"}, {"length", 1024}, {"variant", variant},
         {"budget", budget},          {"sample", 0},    {"score", score},
         {"model", "m.gguf"}};
  if (!protocol.empty()) j["protocol"] = protocol;
  if (turn > 0) j["turn"] = turn;
  return j;
}

json diagnostics(json needle_tiers, json needle_tiers_after, int64_t promotions) {
  return json{{"before", {{"n_past", 100}, {"needle_tiers", needle_tiers}}},
              {"after", {{"n_past", 120}, {"needle_tiers", needle_tiers_after}}},
              {"promotions", promotions}};
}

std::vector<json> lines() {
  std::vector<json> rs;
  rs.push_back(line("qevict", 0.2, "", 0, 1.0));  // end: no diagnostics
  json a = line("qevict", 0.2, "after", 0, 1.0);
  a["diagnostics"] = diagnostics(shares(0, 1, 3, 0), shares(0, 4, 0, 0), 4);
  a["diagnostics"]["fullkv_mass"] = {{"prompt", shares(0.5, 0.2, 0.2, 0.1)},
                                     {"turn", shares(0.4, 0.3, 0.2, 0.1)}};
  a["diagnostics"]["own_mass"] = {{"prompt", shares(0.6, 0.3, 0.1, 0)},
                                  {"turn", shares(0.7, 0.2, 0.1, 0)}};
  rs.push_back(a);
  json b = line("qevict", 0.2, "after", 0, 0.0);
  b["diagnostics"] = diagnostics(shares(0, 0, 2, 2), shares(0, 0, 2, 2), 0);
  b["diagnostics"]["fullkv_mass"] = {{"prompt", shares(0.5, 0.1, 0.1, 0.3)},
                                     {"turn", shares(0.6, 0.1, 0.1, 0.2)}};
  rs.push_back(b);
  json c = line("full", 0, "multi", 2, 1.0);
  c["diagnostics"] = diagnostics(shares(0, 0, 0, 0), shares(0, 0, 0, 0), 0);  // none found
  rs.push_back(c);
  return rs;
}

TEST(TurnSummary, MeansPerProtocolTurnVariantAndBudget) {
  const auto rows = summarize_turns(lines());
  ASSERT_EQ(rows.size(), 2u);
  const TurnSummaryRow& a = rows[0];
  EXPECT_EQ(a.protocol, "after");
  EXPECT_EQ(a.variant, "qevict");
  EXPECT_DOUBLE_EQ(a.budget, 0.2);
  EXPECT_EQ(a.length, 1024);
  EXPECT_EQ(a.n, 2);
  EXPECT_DOUBLE_EQ(a.score, 0.5);
  EXPECT_EQ(a.n_needle, 2);
  // Needle shares: (0, 1/4, 3/4, 0) and (0, 0, 1/2, 1/2).
  EXPECT_DOUBLE_EQ(a.needle[0], 0.0);
  EXPECT_DOUBLE_EQ(a.needle[1], 0.125);
  EXPECT_DOUBLE_EQ(a.needle[2], 0.625);
  EXPECT_DOUBLE_EQ(a.needle[3], 0.25);
  // After the answer: all in F, and (0, 0, 1/2, 1/2) again.
  EXPECT_DOUBLE_EQ(a.needle_after[1], 0.5);
  EXPECT_DOUBLE_EQ(a.needle_after[2], 0.25);
  EXPECT_DOUBLE_EQ(a.needle_after[3], 0.25);
  EXPECT_DOUBLE_EQ(a.promotions, 2.0);
  EXPECT_EQ(a.n_fullkv, 2);
  const double fp[4] = {0.5, 0.15, 0.15, 0.2}, ft[4] = {0.5, 0.2, 0.15, 0.15};
  for (int k = 0; k < 4; ++k) {
    EXPECT_NEAR(a.fullkv_prompt[k], fp[k], 1e-12) << k;
    EXPECT_NEAR(a.fullkv_turn[k], ft[k], 1e-12) << k;
  }
  EXPECT_EQ(a.n_own, 1);
  EXPECT_NEAR(a.own_turn[1], 0.2, 1e-12);
  EXPECT_NEAR(a.own_turn[2], 0.1, 1e-12);

  const TurnSummaryRow& c = rows[1];
  EXPECT_EQ(c.protocol, "multi.t2");
  EXPECT_EQ(c.variant, "full");
  EXPECT_EQ(c.n, 1);
  EXPECT_EQ(c.n_needle, 0);
  EXPECT_EQ(c.n_fullkv, 0);

  const std::string csv = turn_summary_csv(rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "length,protocol,variant,budget,n,score,n_needle,needle_L,needle_F,needle_Q,"
            "needle_E,needle_after_L,needle_after_F,needle_after_Q,needle_after_E,promotions,n_"
            "fullkv,fullkv_prompt_L,fullkv_prompt_F,fullkv_prompt_Q,"
            "fullkv_prompt_E,fullkv_turn_L,fullkv_turn_F,fullkv_turn_Q,fullkv_turn_E,n_own,"
            "own_prompt_L,own_prompt_F,own_prompt_Q,own_prompt_E,own_turn_L,own_turn_F,"
            "own_turn_Q,own_turn_E");
  EXPECT_NE(
      csv.find(
          "\n1024,after,qevict,0.2,2,0.5000,2,0.0000,0.1250,0.6250,0.2500,0.0000,0.5000,0.2500,"
          "0.2500,2.00,2,"
          "0.5000,0.1500,0.1500,0.2000,0.5000,0.2000,0.1500,0.1500,1,0.6000,0.3000,"
          "0.1000,0.0000,0.7000,0.2000,0.1000,0.0000\n"),
      std::string::npos)
      << csv;
  const std::string md = turn_summary_markdown(rows);
  EXPECT_NE(
      md.find("| after | qevict@0.2 | 2 | 50.0 | 0.0 | 12.5 | 62.5 | 25.0 | 50.0 | 2.0 | 50.0 | "
              "20.0 | 15.0 | 15.0 | 20.0 | 10.0 |"),
      std::string::npos)
      << md;
  EXPECT_NE(md.find("| multi.t2 | full | 1 | 100.0 | – | – | – | – | – | 0.0 | – | – | – | – | – | "
                    "– |"),
            std::string::npos)
      << md;
}

TEST(TurnSummary, NoDiagnosticsNoTable) {
  std::vector<json> rs = {line("qevict", 0.2, "", 0, 1.0), line("full", 0, "first", 0, 0.0)};
  EXPECT_TRUE(summarize_turns(rs).empty());
  EXPECT_EQ(turn_summary_markdown({}), "");
}

// write_eval_summary: turns.csv and the summary.md section only for results that have them.
TEST(TurnSummary, WrittenBesideTheSummaryWhenLinesHaveDiagnostics) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("qevict_turn_summary_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string d = dir.string();
  {
    std::ofstream out(d + "/results.jsonl");
    out << line("qevict", 0.2, "", 0, 1.0).dump() << "\n";
  }
  auto md = write_eval_summary(d);
  ASSERT_TRUE(md.has_value()) << md.error();
  EXPECT_EQ(md->find("Turn diagnostics"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(d + "/turns.csv"));
  {
    std::ofstream out(d + "/results.jsonl");
    for (const auto& j : lines()) out << j.dump() << "\n";
  }
  md = write_eval_summary(d);
  ASSERT_TRUE(md.has_value()) << md.error();
  EXPECT_NE(md->find("## Turn diagnostics"), std::string::npos) << *md;
  auto csv = read_text_file(d + "/turns.csv");
  ASSERT_TRUE(csv.has_value());
  EXPECT_EQ(*csv, turn_summary_csv(summarize_turns(lines())));
  auto summary = read_text_file(d + "/summary.md");
  ASSERT_TRUE(summary.has_value());
  EXPECT_EQ(*summary, *md);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qevict::eval
