// `qevict eval --dataset` (eval/ruler_dataset.h): RULER-format lines parse into samples (prompt,
// references, answer prefix cut from the input, tokens to generate, index, task, length), and
// malformed lines are errors naming the file and line.
#include "eval/ruler_dataset.h"

#include <gtest/gtest.h>

namespace qevict::eval {
namespace {

TEST(RulerDataset, ParsesRulerLines) {
  const std::string text =
      R"({"index": 0, "input": "Find the number.\nWhat is it? Answer:", "outputs": ["123"], "length": 4000, "answer_prefix": " Answer:"})"
      "\n\n"
      R"({"index": 5, "input": "Q2", "outputs": ["a", "b"], "length": 3990, "tokens_to_generate": 30})"
      "\n"
      R"({"input": "Q3", "outputs": "c", "task": "other", "id": "abc"})"
      "\n";
  DatasetOptions o;
  auto s = parse_dataset(text, "/runs/niah_single_1/validation.jsonl", o);
  ASSERT_TRUE(s.has_value()) << s.error();
  ASSERT_EQ(s->size(), 3u);
  const RulerSample& a = (*s)[0];
  EXPECT_EQ(a.task, "niah_single_1");  // RULER's TASK/validation.jsonl
  EXPECT_EQ(a.input, "Find the number.\nWhat is it?");
  EXPECT_EQ(a.answer_prefix, "Answer:");
  EXPECT_EQ(a.expected, std::vector<std::string>{"123"});
  EXPECT_EQ(a.max_new_tokens, 128);
  EXPECT_EQ(a.length, 4096);  // the task's longest line, rounded up to 1024
  EXPECT_EQ(a.metric, RulerMetric::kMatchAll);
  EXPECT_EQ(a.sample, 0);
  const RulerSample& b = (*s)[1];
  EXPECT_EQ(b.sample, 5);
  EXPECT_EQ(b.max_new_tokens, 30);
  EXPECT_EQ(b.answer_prefix, "");
  EXPECT_EQ(b.length, 4096);
  const RulerSample& c = (*s)[2];
  EXPECT_EQ(c.task, "other");
  EXPECT_EQ(c.sample, 2);  // its position; the string id is its source
  EXPECT_EQ(c.source, "abc");
  EXPECT_EQ(c.expected, std::vector<std::string>{"c"});
  EXPECT_EQ(c.length, 0);  // no length given: the runner counts the prompts

  o.metric = RulerMetric::kMatchPart;
  o.max_new_tokens = 32;
  o.length = 8192;
  s = parse_dataset(R"({"input": "x", "outputs": ["y"]})", "dir/my_qa.jsonl", o);
  ASSERT_TRUE(s.has_value()) << s.error();
  EXPECT_EQ((*s)[0].task, "my_qa");
  EXPECT_EQ((*s)[0].metric, RulerMetric::kMatchPart);
  EXPECT_EQ((*s)[0].max_new_tokens, 32);
  EXPECT_EQ((*s)[0].length, 8192);
}

TEST(RulerDataset, MalformedLinesNameFileAndLine) {
  const std::string good = R"({"input": "x", "outputs": ["y"]})";
  auto error_of = [&](const std::string& bad) {
    auto s = parse_dataset(good + "\n" + good.substr(0, 0) + "\n" + bad + "\n", "f.jsonl", {});
    EXPECT_FALSE(s.has_value()) << bad;
    return s ? std::string() : s.error();
  };
  EXPECT_EQ(error_of("{not json").rfind("f.jsonl:3: not valid JSON", 0), 0u);
  EXPECT_NE(error_of("[1, 2]").find("f.jsonl:3: not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"outputs": ["y"]})").find("f.jsonl:3: no \"input\""), std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x"})").find("no \"outputs\""), std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x", "outputs": [1]})").find("not a string"), std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x", "outputs": []})").find("empty"), std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x", "outputs": ["y"], "length": "4K"})").find("\"length\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x", "outputs": ["y"], "tokens_to_generate": 0})")
                .find("must be positive"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x", "outputs": ["y"], "index": 0})").find("index 0 twice"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"input": "x", "outputs": ["y"], "task": "a|b"})").find("'|'"),
            std::string::npos);
  auto empty = parse_dataset("\n\n", "e.jsonl", {});
  ASSERT_FALSE(empty.has_value());
  EXPECT_NE(empty.error().find("no prompt"), std::string::npos);
  EXPECT_FALSE(load_dataset("/nonexistent.jsonl", {}).has_value());
}

TEST(RulerDataset, TaskNamesAndLengths) {
  EXPECT_EQ(dataset_task_name("a/b/qa_1/test.jsonl"), "qa_1");
  EXPECT_EQ(dataset_task_name("x.jsonl.gz"), "x");
  EXPECT_EQ(dataset_task_name("validation.jsonl"), "validation");
  EXPECT_EQ(round_up_length(4096), 4096);
  EXPECT_EQ(round_up_length(4097), 5120);
  EXPECT_EQ(round_up_length(3000), 3072);
}

}  // namespace
}  // namespace qevict::eval
