// RULER-style task generation and scoring: samples are deterministic given their seed, every
// needle the answer needs is in the prompt, the expected answers are what an independent reading
// of the prompt finds (needle lookup, chain following, word counting), the haystack fit stays
// within the length, and RULER's metrics on hand-made outputs.
#include "eval/ruler_tasks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace qevict::eval {
namespace {

// Synthetic material: 2,000 distinct lowercase words and 6,000 words of "prose" made of them.
const RulerResources& resources() {
  static const RulerResources res = [] {
    RulerResources r;
    for (int i = 0; i < 2000; ++i) {
      std::string w = "qa";
      for (int x = i; x > 0 || w.size() == 2; x /= 26) w += char('a' + x % 26);
      r.words.push_back(w);
    }
    std::sort(r.words.begin(), r.words.end());
    for (int i = 0; i < 6000; ++i) {
      std::string w = r.words[size_t(i * 7 % 2000)];
      if (i % 9 == 0) w[0] = 'Q';  // sentence starts
      if (i % 9 == 8) w += ".";
      r.essay_words.push_back(w);
    }
    return r;
  }();
  return res;
}

// Tokens as whitespace-separated words: a stand-in for a model tokenizer.
Expected<int64_t> count_words(const RulerSample& s) {
  std::istringstream in(s.input + " " + s.answer_prefix);
  int64_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

RulerSample build(const std::string& task, int64_t units, int sample = 0, int64_t length = 4096) {
  auto s = build_ruler_sample(task, length, sample, /*base_seed=*/0, units, resources());
  EXPECT_TRUE(s.has_value()) << (s ? "" : s.error());
  return s ? *s : RulerSample{};
}

// The question's keys: "... for KEY mentioned" or "for K1, K2, and K3 mentioned".
std::vector<std::string> queried_keys(const RulerSample& s) {
  std::smatch m;
  const std::string tail = s.input.substr(s.input.rfind('\n') + 1);
  EXPECT_TRUE(std::regex_search(tail, m, std::regex("for (.*) mentioned in the provided text")))
      << tail;
  std::string q = m[1];
  q = std::regex_replace(q, std::regex(", and "), ", ");
  std::vector<std::string> keys;
  std::stringstream ss(q);
  for (std::string k; std::getline(ss, k, ',');) {
    if (!k.empty() && k[0] == ' ') k.erase(0, 1);
    keys.push_back(k);
  }
  return keys;
}

TEST(RulerTasks, SamplesAreDeterministicGivenTheSeed) {
  for (const auto& task : ruler_task_names()) {
    if (task == "qa_1" || task == "qa_2") continue;  // ruler_qa_test.cpp: they need QA data
    SCOPED_TRACE(task);
    const RulerSample a = build(task, 100), b = build(task, 100), c = build(task, 100, 1);
    EXPECT_EQ(a.input, b.input);
    EXPECT_EQ(a.answer_prefix, b.answer_prefix);
    EXPECT_EQ(a.expected, b.expected);
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_NE(a.seed, c.seed);
    EXPECT_NE(a.expected, c.expected);  // another sample draws other answers
    EXPECT_FALSE(a.expected.empty());
    // The answers do not depend on the haystack size: the fit only changes the haystack.
    EXPECT_EQ(build(task, 300).expected, a.expected);
  }
  EXPECT_EQ(ruler_seed("vt", 4096, 3, 0), ruler_seed("vt", 4096, 3, 0));
  EXPECT_NE(ruler_seed("vt", 4096, 3, 0), ruler_seed("vt", 4096, 3, 1));
  EXPECT_NE(ruler_seed("vt", 4096, 3, 0), ruler_seed("vt", 8192, 3, 0));
}

TEST(RulerTasks, NiahNeedlesAreInThePromptAndExpectedAreTheirValues) {
  for (const auto& task : ruler_task_names()) {
    if (task.rfind("niah", 0) != 0) continue;
    for (int sample = 0; sample < 4; ++sample) {
      SCOPED_TRACE(task + " #" + std::to_string(sample));
      const RulerSample s = build(task, 200, sample);
      // Independent reading: every needle "for KEY is: VALUE." of a queried key.
      std::vector<std::string> found;
      for (const auto& key : queried_keys(s)) {
        const std::regex needle("One of the special magic (numbers|uuids) for " + key +
                                " is: ([0-9a-f-]+)\\.");
        for (auto it = std::sregex_iterator(s.input.begin(), s.input.end(), needle);
             it != std::sregex_iterator(); ++it)
          found.push_back((*it)[2]);
      }
      std::vector<std::string> want = s.expected;
      std::sort(found.begin(), found.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(found, want);
      for (const auto& e : s.expected) EXPECT_NE(s.input.find(e), std::string::npos) << e;
      EXPECT_EQ(s.metric, RulerMetric::kMatchAll);
      EXPECT_EQ(s.max_new_tokens, 128);
    }
  }
  const RulerSample one = build("niah_single_2", 200);  // RULER's singular wording
  EXPECT_EQ(one.input.rfind("A special magic number is hidden", 0), 0u) << one.input.substr(0, 80);
  EXPECT_EQ(one.answer_prefix.rfind("The special magic number for ", 0), 0u);
  EXPECT_NE(one.answer_prefix.find("mentioned in the provided text is"), std::string::npos);
  const RulerSample many = build("niah_multivalue", 200);
  EXPECT_EQ(many.expected.size(), 4u);
  EXPECT_NE(many.answer_prefix.find("numbers for"), std::string::npos);
  EXPECT_EQ(build("niah_multiquery", 200).expected.size(), 4u);
  const RulerSample uu = build("niah_multikey_3", 50);
  EXPECT_TRUE(std::regex_match(uu.expected[0], std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-"
                                                          "[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << uu.expected[0];
}

TEST(RulerTasks, VariableTrackingExpectedIsTheChainOfTheQueriedValue) {
  for (int sample = 0; sample < 4; ++sample) {
    const RulerSample s = build("vt", 60, sample);
    // The question's value, then follow assignments in the main text (after the example).
    std::smatch m;
    ASSERT_TRUE(std::regex_search(s.answer_prefix, m, std::regex("assgined the value ([0-9]+)")));
    const std::string value = m[1];
    const size_t main_at = s.input.rfind("Memorize and track");
    const std::string text = s.input.substr(main_at);
    std::set<std::string> with_value;
    bool grew = true;
    const std::regex direct("VAR ([A-Z]+) = " + value + "\\b"), copy("VAR ([A-Z]+) = VAR ([A-Z]+)");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), direct);
         it != std::sregex_iterator(); ++it)
      with_value.insert((*it)[1]);
    while (grew) {
      grew = false;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), copy);
           it != std::sregex_iterator(); ++it)
        if (with_value.count((*it)[2]) && with_value.insert((*it)[1]).second) grew = true;
    }
    EXPECT_EQ(with_value, std::set<std::string>(s.expected.begin(), s.expected.end()));
    EXPECT_EQ(s.expected.size(), 5u);
    EXPECT_EQ(s.max_new_tokens, 30);
    EXPECT_LT(s.input.find("Memorize and track"), main_at);  // a solved example comes first
  }
}

TEST(RulerTasks, WordTasksExpectedAreTheMostFrequentWords) {
  const RulerSample cwe = build("cwe", 150);
  const std::string list = cwe.input.substr(cwe.input.rfind("Below is a numbered list"));
  std::map<std::string, int> count;
  const std::regex entry("[0-9]+\\. ([a-z]+)");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), entry);
       it != std::sregex_iterator(); ++it)
    ++count[(*it)[1]];
  for (const auto& e : cwe.expected) EXPECT_EQ(count[e], 30) << e;
  EXPECT_EQ(cwe.expected.size(), 10u);
  EXPECT_EQ(count.size(), 150u);

  const RulerSample fwe = build("fwe", 2000, 0, 4096);
  std::map<std::string, int> freq;
  std::istringstream in(fwe.input.substr(0, fwe.input.find("\nQuestion:")));
  for (std::string w; in >> w;)
    if (w.size() == 6 &&
        std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
      ++freq[w];
  std::vector<std::pair<int, std::string>> by;
  for (const auto& [w, n] : freq) by.push_back({-n, w});
  std::sort(by.begin(), by.end());
  ASSERT_GE(by.size(), 3u);
  EXPECT_EQ(fwe.expected, (std::vector<std::string>{by[0].second, by[1].second, by[2].second}));
  EXPECT_GT(-by[2].first, -by[3].first);  // a strict top 3
}

TEST(RulerTasks, FitUsesTheLargestHaystackWithinTheLength) {
  for (const std::string task : {"niah_single_1", "niah_single_2", "vt", "cwe", "fwe"}) {
    SCOPED_TRACE(task);
    const int64_t length = 3000;
    auto s = make_ruler_sample(task, length, 0, 0, resources(), count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_LE(s->prompt_tokens + s->max_new_tokens, length);
    EXPECT_EQ(s->prompt_tokens, *count_words(*s));
    EXPECT_FALSE(s->raw);  // RULER's tasks are chat turns
    // One more unit of haystack would not fit (tokens grow with the haystack).
    auto bigger = build_ruler_sample(task, length, 0, 0, s->haystack_units + 1, resources());
    ASSERT_TRUE(bigger.has_value());
    EXPECT_GT(*count_words(*bigger) + s->max_new_tokens, length);
  }
  auto too_short = make_ruler_sample("cwe", 256, 0, 0, resources(), count_words);
  EXPECT_FALSE(too_short.has_value());
  // qa_1 without its data loaded (ruler_qa_test.cpp tests it with data).
  EXPECT_FALSE(build_ruler_sample("qa_1", 4096, 0, 0, 100, resources()).has_value());
}

TEST(RulerScoring, MatchAllAndPartOnHandMadeOutputs) {
  const std::vector<std::string> want = {"1234567", "7654321", "AbC"};
  EXPECT_DOUBLE_EQ(score_match_all("1234567 and 7654321 and abc", want), 1.0);
  EXPECT_DOUBLE_EQ(score_match_all("numbers: 1234567, abc", want), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(score_match_all("nothing here", want), 0.0);
  EXPECT_DOUBLE_EQ(score_match_all("123456", {"1234567"}), 0.0);  // substring of the output
  EXPECT_DOUBLE_EQ(score_match_all("anything", {}), 0.0);
  EXPECT_DOUBLE_EQ(score_match_part("only 7654321", want), 1.0);
  EXPECT_DOUBLE_EQ(score_match_part("none", want), 0.0);
  EXPECT_EQ(postprocess_prediction("  \n a\tb\x01 c \n"), "a\nb\n c");
  EXPECT_DOUBLE_EQ(score_ruler(RulerMetric::kMatchAll, " 1234567\n7654321 ABC", want), 1.0);
  EXPECT_DOUBLE_EQ(score_ruler(RulerMetric::kMatchPart, "x abc", want), 1.0);
}

}  // namespace
}  // namespace qevict::eval
