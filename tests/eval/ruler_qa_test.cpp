// RULER's qa_1 / qa_2 (eval/ruler_qa.h) on tiny hand-written SQuAD and HotpotQA files
// (tests/eval/data, committed), and on the real files when tools/fetch_ruler_data.sh has run
// (skipped otherwise): the readers, the gold paragraphs among distractors, RULER's template,
// prefix and metric, determinism per seed and the fit to a length.
#include "eval/ruler_qa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "eval/ruler_resources.h"

namespace qevict::eval {
namespace {

const std::string kData = std::string(QEVICT_TEST_DATA_DIR) + "/eval/data";

QaSet load(const std::string& file, bool hotpot) {
  auto text = read_text_file(kData + "/" + file);
  EXPECT_TRUE(text.has_value());
  auto set = hotpot ? parse_hotpotqa_json(*text) : parse_squad_json(*text);
  EXPECT_TRUE(set.has_value()) << (set ? "" : set.error());
  return set ? *set : QaSet{};
}

const RulerResources& tiny() {
  static const RulerResources r = [] {
    RulerResources res;
    res.squad = std::make_shared<const QaSet>(load("squad_tiny.json", false));
    res.hotpotqa = std::make_shared<const QaSet>(load("hotpotqa_tiny.json", true));
    return res;
  }();
  return r;
}

Expected<int64_t> count_words(const RulerSample& s) {
  std::istringstream in(s.input + " " + s.answer_prefix);
  int64_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

// The documents of a prompt, in order, without their "Document i:" lines.
std::vector<std::string> documents(const std::string& input) {
  std::vector<std::string> docs;
  const std::regex re(
      R"re(Document ([0-9]+):\n([\s\S]*?)(?=\n\nDocument [0-9]+:\n|\n\nAnswer the question))re");
  int want = 1;
  for (auto it = std::sregex_iterator(input.begin(), input.end(), re); it != std::sregex_iterator();
       ++it, ++want) {
    EXPECT_EQ(std::stoi((*it)[1]), want);
    docs.push_back((*it)[2]);
  }
  return docs;
}

TEST(RulerQa, ReadsSquadAsRulerDoes) {
  const QaSet s = load("squad_tiny.json", false);
  EXPECT_EQ(s.docs.size(), 10u);  // distinct contexts, sorted
  EXPECT_TRUE(std::is_sorted(s.docs.begin(), s.docs.end()));
  ASSERT_EQ(s.items.size(), 5u);  // the unanswerable question is left out
  const QaItem& q1 = s.items[0];
  EXPECT_EQ(q1.query, "Where was the Pharos built?");
  EXPECT_EQ(q1.outputs, (std::vector<std::string>{"the island of Pharos", "Pharos"}));
  ASSERT_EQ(q1.gold.size(), 1u);
  EXPECT_NE(s.docs[size_t(q1.gold[0])].find("Pharos of Alexandria"), std::string::npos);
  EXPECT_EQ(q1.more.size(), 2u);  // the article's other paragraphs
  for (int32_t m : q1.more) EXPECT_NE(m, q1.gold[0]);
}

TEST(RulerQa, ReadsHotpotqaAsRulerDoes) {
  const QaSet h = load("hotpotqa_tiny.json", true);
  EXPECT_EQ(h.docs.size(), 11u);  // "Rhine" appears twice
  ASSERT_EQ(h.items.size(), 4u);
  EXPECT_EQ(h.items[0].outputs, std::vector<std::string>{"Ada Lovelace"});
  EXPECT_EQ(h.items[0].gold.size(), 3u);  // every paragraph of its context
  EXPECT_TRUE(h.items[0].more.empty());
  std::set<std::string> gold;
  for (int32_t g : h.items[0].gold) gold.insert(h.docs[size_t(g)]);
  EXPECT_TRUE(
      gold.count("Charles Babbage\nCharles Babbage was born in Teignmouth. He designed the "
                 "Analytical Engine."));
  EXPECT_EQ(h.items[1].gold.size(), 3u);
  EXPECT_EQ(h.items[3].gold.size(), 3u);
}

TEST(RulerQa, MalformedFilesGiveErrors) {
  EXPECT_FALSE(parse_squad_json("{not json").has_value());
  EXPECT_FALSE(parse_squad_json(R"({"data": [{"paragraphs": [{"qas": []}]}]})").has_value());
  EXPECT_FALSE(parse_hotpotqa_json(R"({"question": "q"})").has_value());
  EXPECT_FALSE(parse_hotpotqa_json("[]").has_value());
  auto missing = load_qa_set("/nonexistent/dir", "qa_2");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().find("hotpotqa.json"), std::string::npos);
  EXPECT_NE(missing.error().find("fetch_ruler_data"), std::string::npos);
}

TEST(RulerQa, SamplesHoldTheGoldAmongDistractorsInRulersTemplate) {
  for (const std::string task : {"qa_1", "qa_2"}) {
    const QaSet& set = task == "qa_1" ? *tiny().squad : *tiny().hotpotqa;
    for (int sample = 0; sample < 6; ++sample) {
      SCOPED_TRACE(task + " #" + std::to_string(sample));
      auto s = build_ruler_sample(task, 4096, sample, 0, 6, tiny());
      ASSERT_TRUE(s.has_value()) << s.error();
      EXPECT_EQ(s->input.rfind("Answer the question based on the given documents. Only give me "
                               "the answer and do not output any other words.\n\nThe following "
                               "are given documents.\n\nDocument 1:\n",
                               0),
                0u);
      EXPECT_EQ(s->answer_prefix, "Answer:");  // RULER's " Answer:", its space dropped
      EXPECT_EQ(s->max_new_tokens, 32);
      EXPECT_EQ(s->metric, RulerMetric::kMatchPart);
      // The question asked is one of the set's, and its gold paragraphs are all there.
      const QaItem* item = nullptr;
      for (const auto& it : set.items)
        if (s->input.ends_with("\n\nQuestion: " + it.query)) item = &it;
      ASSERT_NE(item, nullptr);
      EXPECT_EQ(s->expected, item->outputs);
      const std::vector<std::string> docs = documents(s->input);
      EXPECT_EQ(int64_t(docs.size()), s->haystack_units);
      EXPECT_EQ(docs.size(), std::max<size_t>(6, item->gold.size()));
      EXPECT_EQ(std::set<std::string>(docs.begin(), docs.end()).size(), docs.size());
      for (int32_t g : item->gold)
        EXPECT_NE(std::find(docs.begin(), docs.end(), set.docs[size_t(g)]), docs.end());
      for (const auto& d : docs)
        EXPECT_NE(std::find(set.docs.begin(), set.docs.end(), d), set.docs.end());
      // SQuAD: the same article's paragraphs come first among the distractors.
      auto few = build_ruler_sample(task, 4096, sample, 0, int64_t(item->gold.size() + 1), tiny());
      ASSERT_TRUE(few.has_value());
      if (!item->more.empty()) {
        std::set<std::string> article;
        for (int32_t m : item->more) article.insert(set.docs[size_t(m)]);
        int in_article = 0;
        for (const auto& d : documents(few->input)) in_article += int(article.count(d));
        EXPECT_EQ(in_article, 1);
      }
    }
  }
}

TEST(RulerQa, DeterministicPerSeedAndAllDocumentsAtMost) {
  for (const std::string task : {"qa_1", "qa_2"}) {
    auto a = build_ruler_sample(task, 4096, 2, 0, 5, tiny());
    auto b = build_ruler_sample(task, 4096, 2, 0, 5, tiny());
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->input, b->input);
    EXPECT_EQ(a->seed, b->seed);
    std::set<std::string> inputs;  // other samples, other seeds: other prompts
    for (int sample = 0; sample < 6; ++sample)
      inputs.insert(build_ruler_sample(task, 4096, sample, 7, 5, tiny())->input);
    EXPECT_GT(inputs.size(), 2u);
    // The question does not depend on the number of documents.
    auto more = build_ruler_sample(task, 4096, 2, 0, 8, tiny());
    EXPECT_EQ(more->expected, a->expected);
    auto all = build_ruler_sample(task, 4096, 2, 0, 1000, tiny());
    const size_t n_docs = (task == "qa_1" ? tiny().squad : tiny().hotpotqa)->docs.size();
    EXPECT_EQ(size_t(all->haystack_units), n_docs);
  }
}

TEST(RulerQa, FitTakesTheMostDocumentsWithinTheLength) {
  for (const std::string task : {"qa_1", "qa_2"}) {
    for (int64_t length : {170, 200, 260}) {
      SCOPED_TRACE(task + " " + std::to_string(length));
      auto s = make_ruler_sample(task, length, 1, 0, tiny(), count_words);
      ASSERT_TRUE(s.has_value()) << s.error();
      EXPECT_LE(s->prompt_tokens + 32, length);
      EXPECT_EQ(s->prompt_tokens, *count_words(*s));
      auto next = build_ruler_sample(task, length, 1, 0, s->haystack_units + 1, tiny());
      ASSERT_TRUE(next.has_value());
      if (next->haystack_units > s->haystack_units) {  // else: every document is in already
        EXPECT_GT(*count_words(*next) + 32, length);
      }
    }
  }
  EXPECT_FALSE(make_ruler_sample("qa_1", 40, 0, 0, tiny(), count_words).has_value());
}

TEST(RulerQa, MissingDataIsAnErrorNotACrash) {
  RulerResources none;
  auto s = build_ruler_sample("qa_1", 4096, 0, 0, 10, none);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().find("squad.json"), std::string::npos);
  EXPECT_FALSE(make_ruler_sample("qa_2", 4096, 0, 0, none, count_words).has_value());
  EXPECT_TRUE(is_ruler_task("qa_1"));
  EXPECT_EQ(ruler_max_new_tokens("qa_2"), 32);
}

// The files RULER's package ships (tools/fetch_ruler_data.sh), when fetched.
std::string ruler_data_dir() {
  if (const char* c = std::getenv("QEVICT_CACHE"); c && *c) return std::string(c) + "/ruler-data";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/qevict/ruler-data";
}

TEST(RulerQa, RealFilesWhenFetched) {
  const std::string dir = ruler_data_dir();
  if (!std::filesystem::exists(dir + "/squad.json") ||
      !std::filesystem::exists(dir + "/hotpotqa.json"))
    GTEST_SKIP() << dir << " has no squad.json / hotpotqa.json (tools/fetch_ruler_data.sh)";
  RulerResources res;
  for (const std::string task : {"qa_1", "qa_2"}) {
    auto set = load_qa_set(dir, task);
    ASSERT_TRUE(set.has_value()) << set.error();
    EXPECT_GT(set->items.size(), 1000u);
    (task == "qa_1" ? res.squad : res.hotpotqa) = std::make_shared<const QaSet>(std::move(*set));
  }
  for (const std::string task : {"qa_1", "qa_2"}) {
    auto s = make_ruler_sample(task, 4096, 0, 0, res, count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_LE(s->prompt_tokens + 32, 4096);
    EXPECT_GT(s->prompt_tokens, 3000);
    EXPECT_FALSE(s->expected.empty());
  }
}

}  // namespace
}  // namespace qevict::eval
