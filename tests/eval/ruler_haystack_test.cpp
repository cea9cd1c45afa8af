// The essay haystack's choice (`qevict eval --haystack essay|jargon|PATH`): RULER's Paul Graham
// essays read from PaulGrahamEssays.json and split as RULER splits them, the name recorded on
// results, niah built on the chosen prose, doc_qa / doc_sum kept on the Jargon File.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "eval/longdoc_tasks.h"
#include "eval/ruler_resources.h"
#include "eval/ruler_tasks.h"

namespace qevict::eval {
namespace {

std::string temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("qevict_haystack_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<std::string> words_like(const std::string& stem, int n) {
  std::vector<std::string> w;
  for (int i = 0; i < n; ++i) w.push_back(stem + std::to_string(i) + (i % 10 == 9 ? "." : ""));
  return w;
}

TEST(RulerHaystack, NamesRecordedOnResults) {
  EXPECT_EQ(haystack_name("jargon"), "jargon");
  EXPECT_EQ(haystack_name("essay"), "essay");
  EXPECT_EQ(haystack_name("/usr/share/doc/x/prose.txt.gz"), "file:prose.txt.gz");
}

TEST(RulerHaystack, EssayWordsAreSplitAsRulerSplits) {
  EXPECT_EQ(
      whitespace_words("  April 2012A palliative\n\ncare \t nurse — made  "),
      (std::vector<std::string>{"April", "2012A", "palliative", "care", "nurse", "—", "made"}));
  const std::string dir = temp_dir("essay");
  std::string text;
  for (int i = 0; i < 1200; ++i) text += "word" + std::to_string(i) + (i % 7 ? " " : "\\n\\n");
  write(dir + "/PaulGrahamEssays.json", "{\"text\": \"" + text + "\"}");
  auto w = load_essay_words(dir);
  ASSERT_TRUE(w.has_value()) << w.error();
  EXPECT_EQ(w->size(), 1200u);
  EXPECT_EQ(w->front(), "word0");
  EXPECT_EQ(w->back(), "word1199");

  auto missing = load_essay_words(dir + "/none");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().find("fetch_ruler_data"), std::string::npos);
  write(dir + "/PaulGrahamEssays.json", "[\"text\"]");
  EXPECT_FALSE(load_essay_words(dir).has_value());
  write(dir + "/PaulGrahamEssays.json", "{\"text\": \"too few words\"}");
  EXPECT_FALSE(load_essay_words(dir).has_value());
  std::filesystem::remove_all(dir);
}

TEST(RulerHaystack, NiahReadsTheChosenProseAndDocTasksTheJargonFile) {
  RulerResources res;
  for (int i = 0; i < 200; ++i)
    res.words.push_back("key" + std::string(1, char('a' + i % 26)) +
                        std::string(1, char('a' + i / 26)));
  res.essay_words = words_like("essay", 3000);
  auto niah = build_ruler_sample("niah_single_2", 4096, 0, 0, 500, res);
  ASSERT_TRUE(niah.has_value()) << niah.error();
  EXPECT_NE(niah->input.find("essay10"), std::string::npos);
  // doc_sum reads doc_words when set (the Jargon File beside an essay haystack), else the essay.
  auto doc = build_longdoc_sample("doc_sum", 4096, 0, 0, 300, res);
  ASSERT_TRUE(doc.has_value()) << doc.error();
  EXPECT_NE(doc->input.find("essay"), std::string::npos);
  res.doc_words = words_like("jargon", 3000);
  doc = build_longdoc_sample("doc_sum", 4096, 0, 0, 300, res);
  ASSERT_TRUE(doc.has_value()) << doc.error();
  EXPECT_EQ(doc->input.find("essay"), std::string::npos);
  EXPECT_NE(doc->input.find("jargon"), std::string::npos);
  auto niah2 = build_ruler_sample("niah_single_2", 4096, 0, 0, 500, res);
  EXPECT_EQ(niah2->input, niah->input);  // niah keeps the essay
}

TEST(RulerHaystack, RulersEssaysWhenFetched) {
  std::string dir;
  if (const char* c = std::getenv("QEVICT_CACHE"); c && *c)
    dir = std::string(c) + "/ruler-data";
  else
    dir =
        std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/qevict/ruler-data";
  if (!std::filesystem::exists(dir + "/PaulGrahamEssays.json"))
    GTEST_SKIP() << dir << " has no PaulGrahamEssays.json (tools/fetch_ruler_data.sh)";
  auto w = load_essay_words(dir);
  ASSERT_TRUE(w.has_value()) << w.error();
  EXPECT_GT(w->size(), 100000u);
  EXPECT_EQ(w->front(), "April");
}

}  // namespace
}  // namespace qevict::eval
