// Evaluation protocols (issue 51): every RULER prompt with a question splits into its
// instruction-and-text part and its question, byte for byte; the protocols' list, which tasks
// each applies to, their cell keys (end: the key of every grid before protocols) and their
// summary rows, kept apart from end's.
#include "eval/eval_protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "eval/eval_runner.h"
#include "eval/eval_summary.h"

namespace qevict::eval {
namespace {

using json = nlohmann::json;

// Synthetic material (as ruler_tasks_test.cpp): 2,000 words and 6,000 words of "prose".
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
      if (i % 9 == 0) w[0] = 'Q';
      if (i % 9 == 8) w += ".";
      r.essay_words.push_back(w);
    }
    return r;
  }();
  return res;
}

TEST(PromptSplit, EveryTaskWithAQuestionSplitsAtIt) {
  for (const std::string task :
       {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
        "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"}) {
    SCOPED_TRACE(task);
    auto s = build_ruler_sample(task, 4096, 1, 0, 200, resources());
    ASSERT_TRUE(s.has_value()) << s.error();
    ASSERT_GE(s->question_at, 0);
    const std::string c = sample_context(*s), q = sample_question(*s);
    ASSERT_FALSE(c.empty());
    ASSERT_FALSE(q.empty());
    // context, the whitespace between, the question: the prompt of `end`, byte for byte.
    EXPECT_EQ(s->input.substr(0, c.size()), c);
    EXPECT_EQ(s->input.substr(size_t(s->question_at)), q);
    const std::string sep = s->input.substr(c.size(), size_t(s->question_at) - c.size());
    EXPECT_FALSE(sep.empty());
    EXPECT_EQ(sep.find_first_not_of('\n'), std::string::npos) << "separator: newlines only";
    // The question is the template's last line (niah: "What ...?"; the others "Question: ").
    const bool niah = task.rfind("niah_", 0) == 0;
    EXPECT_EQ(q.rfind(niah ? "What " : "Question: ", 0), 0u) << q;
    EXPECT_EQ(q.find('\n'), std::string::npos) << q;
    // Nothing the answer needs is in the question: the needles stay in the text.
    for (const auto& e : s->expected) {
      EXPECT_NE(c.find(e), std::string::npos) << e;
      EXPECT_EQ(q.find(e), std::string::npos) << e;
    }
  }
}

TEST(PromptSplit, NoQuestionNoParts) {
  RulerSample s;
  s.input = "def f():\n    return 1\n";
  EXPECT_EQ(s.question_at, -1);
  EXPECT_EQ(sample_context(s), "");
  EXPECT_EQ(sample_question(s), "");
}

TEST(Protocols, ParsedInOrderEachOnce) {
  auto p = parse_protocols("end,after,first");
  ASSERT_TRUE(p.has_value()) << p.error();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0], EvalProtocol::kEnd);
  EXPECT_EQ((*p)[1], EvalProtocol::kAfter);
  EXPECT_EQ((*p)[2], EvalProtocol::kFirst);
  EXPECT_STREQ(protocol_name((*p)[1]), "after");
  EXPECT_FALSE(parse_protocols("end,end").has_value());
  EXPECT_FALSE(parse_protocols("later").has_value());
  EXPECT_FALSE(parse_protocols("").has_value());
  auto multi = parse_protocols("after,multi");
  ASSERT_TRUE(multi.has_value()) << multi.error();
  EXPECT_EQ((*multi)[1], EvalProtocol::kMulti);
  EXPECT_EQ(protocol_answers(EvalProtocol::kMulti), 4);
  EXPECT_EQ(protocol_answers(EvalProtocol::kAfter), 1);
  EXPECT_EQ(protocol_label(EvalProtocol::kMulti, 0), "multi.t1");
  EXPECT_EQ(protocol_label(EvalProtocol::kMulti, 3), "multi.t4");
  EXPECT_EQ(protocol_label(EvalProtocol::kAfter, 0), "after");
}

// multi asks every key of the 4-key niah tasks alone: each question names one key, its
// expected value is that key's needle in the text, and the prompt of `end` is unchanged.
TEST(PromptSplit, FourKeyTasksCarryOneQuestionPerKey) {
  for (const std::string task : {"niah_multikey_1", "niah_multiquery"}) {
    SCOPED_TRACE(task);
    auto s = build_ruler_sample(task, 4096, 2, 0, 200, resources());
    ASSERT_TRUE(s.has_value()) << s.error();
    ASSERT_EQ(s->questions.size(), 4u);
    std::set<std::string> values;
    for (const RulerQuestion& q : s->questions) {
      ASSERT_EQ(q.expected.size(), 1u);
      values.insert(q.expected[0]);
      EXPECT_EQ(q.question.rfind("What is the special magic number for ", 0), 0u) << q.question;
      const std::string key = q.question.substr(37, q.question.find(" mentioned") - 37);
      EXPECT_NE(s->input.find("for " + key + " is: " + q.expected[0] + "."), std::string::npos)
          << key;
      EXPECT_EQ(q.answer_prefix,
                "The special magic number for " + key + " mentioned in the provided text is");
    }
    EXPECT_EQ(values.size(), 4u) << "four independent keys";
    // The questions are drawn from the sample, not from its random stream: the prompt is the
    // one every grid before them saw.
    auto again = build_ruler_sample(task, 4096, 2, 0, 200, resources());
    EXPECT_EQ(again->input, s->input);
  }
  for (const std::string task : {"niah_single_1", "niah_multikey_2", "niah_multivalue", "vt"}) {
    auto s = build_ruler_sample(task, 4096, 2, 0, 200, resources());
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_TRUE(s->questions.empty()) << task;
    EXPECT_FALSE(protocol_applies(EvalProtocol::kMulti, task)) << task;
  }
  EXPECT_TRUE(protocol_applies(EvalProtocol::kMulti, "niah_multikey_1"));
  EXPECT_TRUE(protocol_applies(EvalProtocol::kMulti, "niah_multiquery"));
}

TEST(Protocols, WhichTasksEachAppliesTo) {
  for (const std::string t : {"niah_single_1", "niah_multiquery", "vt", "qa_1", "qa_2"}) {
    EXPECT_TRUE(protocol_applies(EvalProtocol::kAfter, t)) << t;
    EXPECT_TRUE(protocol_applies(EvalProtocol::kFirst, t)) << t;
  }
  for (const std::string t : {"cwe", "fwe"}) {
    EXPECT_TRUE(protocol_applies(EvalProtocol::kAfter, t)) << t;
    EXPECT_FALSE(protocol_applies(EvalProtocol::kFirst, t)) << t;
  }
  for (const std::string t : {"lcc", "doc_qa", "doc_sum", "my_dataset_task"}) {
    EXPECT_TRUE(protocol_applies(EvalProtocol::kEnd, t)) << t;
    EXPECT_FALSE(protocol_applies(EvalProtocol::kAfter, t)) << t;
    EXPECT_FALSE(protocol_applies(EvalProtocol::kFirst, t)) << t;
  }
}

TEST(Protocols, CellKeysOfEndAreTheOldOnesOthersCarryTheProtocol) {
  // The key results files of grids before protocols were resumed by.
  EXPECT_EQ(eval_cell_key("vt", 4096, "qevict", 0.2, 3), "vt|4096|qevict|0.2|3");
  EXPECT_EQ(eval_cell_key("vt", 4096, "qevict", 0.2, 3, "end"), "vt|4096|qevict|0.2|3");
  EXPECT_EQ(eval_cell_key("vt", 4096, "full", 0.0, 0, "after"), "vt|4096|full|0|0|after");
  const std::string e = eval_cell_key("vt", 4096, "snapkv", 0.1, 1, "end");
  const std::string a = eval_cell_key("vt", 4096, "snapkv", 0.1, 1, "after");
  const std::string f = eval_cell_key("vt", 4096, "snapkv", 0.1, 1, "first");
  EXPECT_NE(e, a);
  EXPECT_NE(e, f);
  EXPECT_NE(a, f);
}

json result(const std::string& task, const std::string& protocol, int sample, double score) {
  json j{{"task", task},     {"length", 4096}, {"variant", "qevict"}, {"budget", 0.2},
         {"sample", sample}, {"score", score}, {"model", "m.gguf"}};
  if (!protocol.empty()) j["protocol"] = protocol;
  return j;
}

TEST(Protocols, SummaryKeepsProtocolsApart) {
  std::vector<json> rs;
  for (int i = 0; i < 4; ++i) {
    rs.push_back(result("vt", "", i, 1.0));  // a line of a grid before protocols: end
    rs.push_back(result("vt", "after", i, 0.0));
  }
  // End alone: the summary of a grid before protocols, no protocol column.
  std::vector<json> end_only(rs.begin(), rs.end());
  end_only.erase(std::remove_if(end_only.begin(), end_only.end(),
                                [](const json& j) { return j.contains("protocol"); }),
                 end_only.end());
  const std::string csv_end = summary_csv(summarize(end_only));
  EXPECT_EQ(csv_end.substr(0, csv_end.find('\n')),
            "task,length,variant,budget,n,mean,ci95_low,ci95_high");

  const auto rows = summarize(rs);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].protocol, "end");
  EXPECT_DOUBLE_EQ(rows[0].mean, 1.0);
  EXPECT_EQ(rows[1].protocol, "after");
  EXPECT_DOUBLE_EQ(rows[1].mean, 0.0);
  const std::string csv = summary_csv(rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "task,length,variant,budget,n,mean,ci95_low,ci95_high,protocol");
  EXPECT_NE(csv.find("vt,4096,qevict,0.2,4,0.0000,0.0000,0.0000,after"), std::string::npos) << csv;
  const std::string md = summary_markdown(rows);
  EXPECT_NE(md.find("| task | qevict@0.2 | qevict@0.2 [after] |"), std::string::npos) << md;

  // multi: a row per question's turn.
  json m = result("vt", "multi", 0, 1.0);
  EXPECT_EQ(result_protocol_label(m), "multi");
  m["turn"] = 3;
  EXPECT_EQ(result_protocol_label(m), "multi.t3");
  EXPECT_EQ(result_protocol_label(result("vt", "", 0, 1.0)), "end");
  rs.push_back(m);
  const auto rows3 = summarize(rs);
  ASSERT_EQ(rows3.size(), 3u);
  EXPECT_EQ(rows3[2].protocol, "multi.t3");
}

}  // namespace
}  // namespace qevict::eval
