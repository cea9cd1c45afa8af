// Long-document tasks: lcc's target is the line after its context in the real file and is code,
// samples are deterministic and fit their length, doc_qa asks about a headword in the middle of
// its excerpt, and the scores (edit similarity, exact match, ROUGE-L) on hand-worked cases.
#include "eval/longdoc_tasks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace qevict::eval {
namespace {

namespace fs = std::filesystem;

// Whitespace-separated words as tokens: a stand-in for a model tokenizer.
Expected<int64_t> count_words(const RulerSample& s) {
  std::istringstream in(s.input + " " + s.answer_prefix);
  int64_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

// A directory with two generated Python files (one is data, not code) and a test directory.
struct CodeDir {
  fs::path dir;
  CodeDir() {
    dir = fs::temp_directory_path() / ("qevict_lcc_" + std::to_string(::getpid()));
    fs::create_directories(dir / "pkg");
    fs::create_directories(dir / "test");
    std::ofstream code(dir / "pkg" / "mod.py");
    for (int i = 0; i < 400; ++i) {
      code << "def f" << i << "(x):\n";
      code << "    # step " << i << "\n";
      code << "    y = x * " << i << " + " << (i % 7) << "\n";
      code << "\n";
      code << "    return y\n";
    }
    std::ofstream data(dir / "table.py");
    for (int i = 0; i < 3000; ++i) data << "T" << i << " = " << i * 3 << "\n";
    std::ofstream test(dir / "test" / "test_mod.py");
    for (int i = 0; i < 800; ++i) test << "def t" << i << "(): pass\n";
  }
  ~CodeDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

RulerResources prose() {
  RulerResources r;
  for (int i = 0; i < 5000; ++i) {
    // Appended, not `":term" + std::to_string(i)`: GCC 12 warns (-Wrestrict, a false
    // positive) on operator+(const char*, string&&).
    std::string w = i % 97 == 50 ? ":term" : "w";
    w += std::to_string(i);
    if (i % 97 == 50) w += ':';
    r.essay_words.push_back(std::move(w));
  }
  return r;
}

TEST(LongdocTasks, CodeFilesAreCodeOutsideTestDirectories) {
  CodeDir d;
  auto files = find_code_files(d.dir.string(), 1000);
  ASSERT_TRUE(files.has_value()) << files.error();
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ(fs::path((*files)[0]).filename(), "mod.py");
  EXPECT_FALSE(find_code_files((d.dir / "missing").string(), 1000).has_value());
}

TEST(LongdocTasks, LccTargetIsTheCodeLineAfterItsContext) {
  CodeDir d;
  RulerResources res;
  res.code_files = *find_code_files(d.dir.string(), 1000);
  for (int sample = 0; sample < 6; ++sample) {
    SCOPED_TRACE(sample);
    auto s = make_ruler_sample("lcc", 600, sample, 0, res, count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_LE(s->prompt_tokens + s->max_new_tokens, 600);
    EXPECT_EQ(s->max_new_tokens, 64);
    EXPECT_EQ(s->metric, RulerMetric::kEditSim);
    EXPECT_TRUE(s->raw);  // no chat template: the model continues the file
    // The file's lines: the target is line N (source "path:N"), the context the lines before.
    const size_t colon = s->source.rfind(':');
    const int line = std::stoi(s->source.substr(colon + 1));
    std::ifstream in(s->source.substr(0, colon));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    ASSERT_LE(line, int(lines.size()));
    const std::string target = lines[size_t(line - 1)];
    EXPECT_EQ(s->expected.at(0), target.substr(target.find_first_not_of(' ')));
    EXPECT_NE(target.find_first_not_of(' '), std::string::npos);
    EXPECT_NE(target[target.find_first_not_of(' ')], '#');  // a comment is never the target
    // The prompt is the context lines alone, ending with the line before the target.
    const std::string tail = "\n" + lines[size_t(line - 2)] + "\n";
    EXPECT_EQ(s->input.substr(s->input.size() - tail.size()), tail);
    EXPECT_EQ(s->input, [&] {
      std::string c;
      for (int i = line - 1 - int(s->haystack_units); i < line - 1; ++i)
        c += lines[size_t(i)] + "\n";
      return c;
    }());
    // Deterministic, and one more line of context would not fit.
    auto again = make_ruler_sample("lcc", 600, sample, 0, res, count_words);
    EXPECT_EQ(again->input, s->input);
    auto bigger = build_longdoc_sample("lcc", 600, sample, 0, s->haystack_units + 1, res);
    ASSERT_TRUE(bigger.has_value());
    EXPECT_GT(*count_words(*bigger) + 64, 600);
  }
  RulerResources none;
  EXPECT_FALSE(build_longdoc_sample("lcc", 600, 0, 0, 50, none).has_value());
  // No file is long enough for 100K tokens of context.
  EXPECT_FALSE(build_longdoc_sample("lcc", 100000, 0, 0, 50, res).has_value());
}

TEST(LongdocTasks, DocQaAsksAboutAHeadwordInTheMiddleOfItsExcerpt) {
  const RulerResources res = prose();
  for (int sample = 0; sample < 5; ++sample) {
    auto s = make_ruler_sample("doc_qa", 1000, sample, 0, res, count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_LE(s->prompt_tokens + s->max_new_tokens, 1000);
    EXPECT_EQ(s->metric, RulerMetric::kAgreeFull);
    EXPECT_FALSE(s->raw);  // a question to a chat model: its template
    ASSERT_EQ(s->source.front(), ':');
    const size_t at = s->input.find(" " + s->source + " ");
    ASSERT_NE(at, std::string::npos) << s->source << " is not in the document";
    const size_t q = s->input.find("\n\nQuestion:");
    EXPECT_GT(at, q / 5);
    EXPECT_LT(at, q - q / 5);
    EXPECT_NE(s->input.find("about the term '" + s->source + "'"), std::string::npos);
    auto sum = make_ruler_sample("doc_sum", 1000, sample, 0, res, count_words);
    ASSERT_TRUE(sum.has_value());
    EXPECT_EQ(sum->answer_prefix, "Summary:");
  }
}

TEST(LongdocScoring, EditSimilarityExactMatchAndRougeL) {
  // First code line: fences and comments are skipped; indentation does not count.
  EXPECT_DOUBLE_EQ(code_line_similarity("```python\n    return y\n```", "return y"), 1.0);
  EXPECT_TRUE(code_line_exact("\n\n  x = 1\ny = 2", "x = 1"));
  EXPECT_FALSE(code_line_exact("x = 2", "x = 1"));
  // "abcd" vs "abxd": LCS 3 of 8 characters -> 0.75.
  EXPECT_DOUBLE_EQ(code_line_similarity("abcd", "abxd"), 0.75);
  EXPECT_DOUBLE_EQ(code_line_similarity("", "abc"), 0.0);
  EXPECT_DOUBLE_EQ(score_ruler(RulerMetric::kEditSim, "abcd", {"abxd"}), 0.75);
  // ROUGE-L over words: LCS "the cat" of 3 and 4 words: P 2/3, R 2/4 -> F 4/7.
  EXPECT_NEAR(rouge_l_f1("The cat sat", "the big cat ran"), 4.0 / 7.0, 1e-12);
  EXPECT_DOUBLE_EQ(rouge_l_f1("Same words.", "same, words"), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l_f1("", ""), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l_f1("a", ""), 0.0);
  EXPECT_NEAR(score_ruler(RulerMetric::kAgreeFull, " The cat sat\n", {"the big cat ran"}),
              4.0 / 7.0, 1e-12);
}

}  // namespace
}  // namespace qevict::eval
