// The eval suite's bookkeeping without a model: variant columns from specs, resumable results
// files (partial lines skipped), haystack material read from plain and gzip files, and the
// summary's means and bootstrap intervals on hand-made scores.
#include "eval/eval_summary.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/kv_names.h"
#include "eval/eval_runner.h"
#include "eval/ruler_resources.h"

namespace qevict::eval {
namespace {

using json = nlohmann::json;

std::string temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() /
                 ("qevict_eval_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

json result(const std::string& task, const std::string& variant, double budget, int sample,
            double score) {
  return json{{"task", task},     {"length", 4096}, {"variant", variant}, {"budget", budget},
              {"sample", sample}, {"score", score}, {"model", "m.gguf"}};
}

TEST(EvalVariants, FullRunsOnceOthersAtEveryBudget) {
  EvalOptions o;
  o.variants = {"full", "qevict", "qevict:score=age:q=0"};
  o.budgets = {0.2, 0.1};
  auto v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  ASSERT_EQ(v->size(), 5u);
  EXPECT_EQ((*v)[0].spec, "full");
  EXPECT_EQ((*v)[0].budget, 0.0);
  EXPECT_EQ((*v)[1].params.policy, "qevict");
  EXPECT_EQ((*v)[1].params.budget_fraction, 0.2);
  EXPECT_EQ((*v)[2].params.budget_fraction, 0.1);
  EXPECT_STREQ(to_string((*v)[3].params.score), "age");
  EXPECT_EQ((*v)[3].params.q, 0.0);
  EXPECT_STREQ(to_string((*v)[1].params.score), "sum");
  o.variants = {"nosuchpolicy"};
  EXPECT_FALSE(expand_variants(o).has_value());
  o.variants = {"qevict:score=median"};
  EXPECT_FALSE(expand_variants(o).has_value());
  o.variants = {"qevict:window=x"};
  EXPECT_FALSE(expand_variants(o).has_value());
  o.variants = {"qevict", "qevict"};
  EXPECT_FALSE(expand_variants(o).has_value());
  EXPECT_EQ(eval_cell_key("vt", 4096, "qevict", 0.2, 3), "vt|4096|qevict|0.2|3");
}

// A route written in the spec wins over the policy's own default (SnapKV's family and the
// quantizers route at the end unless told otherwise; the spec once lost to that default).
TEST(EvalVariants, RouteInTheSpecOverridesThePolicyDefault) {
  EvalOptions o;
  o.variants = {"snapkv", "snapkv:route=chunk", "kivi:route=chunk",
                "qevict", "qevict:route=chunk", "h2o"};
  o.budgets = {0.2};
  auto v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  ASSERT_EQ(v->size(), 6u);
  EXPECT_STREQ(to_string((*v)[0].params.prefill_route), "end");
  EXPECT_STREQ(to_string((*v)[1].params.prefill_route), "chunk");
  EXPECT_STREQ(to_string((*v)[2].params.prefill_route), "chunk");
  EXPECT_STREQ(to_string((*v)[3].params.prefill_route), "end");
  EXPECT_EQ((*v)[3].params.prefill_window, 32);
  EXPECT_STREQ(to_string((*v)[4].params.prefill_route), "chunk");
  EXPECT_EQ((*v)[4].params.prefill_window, 0);
  EXPECT_STREQ(to_string((*v)[5].params.prefill_route), "chunk");
}

TEST(EvalVariants, PoolIsAQevictOption) {
  EvalOptions o;
  o.variants = {"qevict:pool=2"};
  o.budgets = {0.2};
  auto v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  ASSERT_EQ(v->size(), 1u);
  EXPECT_EQ((*v)[0].params.pool, 2);
  EXPECT_EQ((*v)[0].params.prefill_window, 32);  // the row's defaults still apply
  o.variants = {"qevict", "qevict:pool=0"};      // the default pools; 0 turns it off
  v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  EXPECT_EQ((*v)[0].params.pool, 2);
  EXPECT_EQ((*v)[1].params.pool, 0);
  o.variants = {"snapkv:pool=2"};
  EXPECT_FALSE(expand_variants(o).has_value());  // SnapKV pools tokens its own way
  o.variants = {"qevict:pool_side=after"};
  v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  EXPECT_STREQ(to_string((*v)[0].params.pool_side), "after");
  EXPECT_EQ((*v)[0].params.pool, 2);
  o.variants = {"qevict:pool_side=before"};
  EXPECT_FALSE(expand_variants(o).has_value());
  o.variants = {"h2o:pool_side=after"};
  EXPECT_FALSE(expand_variants(o).has_value());
}

// A spec that pins neither bits nor vbits runs qevict's default layout (K4V2); each key
// pinned keeps its value, so a column's name says what ran (grids name INT2 ":bits=2").
TEST(EvalVariants, BitsKeysPinTheLowBitLayout) {
  EvalOptions o;
  o.variants = {"qevict",         "qevict:bits=2",         "qevict:bits=4",
                "qevict:vbits=4", "qevict:bits=2:vbits=4", "streaming"};
  o.budgets = {0.2};
  auto v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  ASSERT_EQ(v->size(), 6u);
  const std::pair<int, int> want[] = {{4, 2}, {2, 0}, {4, 0}, {4, 4}, {2, 4}, {2, 0}};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ((*v)[i].params.bits, want[i].first) << (*v)[i].spec;
    EXPECT_EQ((*v)[i].params.value_bits, want[i].second) << (*v)[i].spec;
  }
  o.variants = {"qevict"};
  o.given.bits = true;  // --kv-bits on the command line pins every variant's
  o.base.bits = 2;
  v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  EXPECT_EQ((*v)[0].params.bits, 2);
  EXPECT_EQ((*v)[0].params.value_bits, 0);
}

TEST(EvalVariants, GroupSetsTheValueQuantizationGroup) {
  EvalOptions o;
  o.variants = {"qevict:group=16", "qevict"};
  o.budgets = {0.2};
  auto v = expand_variants(o);
  ASSERT_TRUE(v.has_value()) << v.error();
  ASSERT_EQ(v->size(), 2u);
  EXPECT_EQ((*v)[0].params.value_group, 16);
  EXPECT_EQ((*v)[1].params.value_group, 0);  // head_dim
  o.variants = {"qevict:group=-1"};
  EXPECT_FALSE(expand_variants(o).has_value());
  o.variants = {"qevict:group=x"};
  EXPECT_FALSE(expand_variants(o).has_value());
}

TEST(EvalResults, PartialAndForeignLinesAreSkipped) {
  const std::string dir = temp_dir("results");
  {
    std::ofstream f(dir + "/results.jsonl");
    f << result("vt", "full", 0, 0, 1.0).dump() << "\n"
      << "{\"task\": \"vt\"}\n"  // not a result line
      << result("vt", "full", 0, 1, 0.5).dump() << "\n"
      << "{\"task\": \"vt\", \"len";  // killed while writing
  }
  int64_t bad = 0;
  auto r = read_eval_results(dir + "/results.jsonl", &bad);
  ASSERT_TRUE(r.has_value()) << r.error();
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(bad, 2);
  auto none = read_eval_results(dir + "/missing.jsonl", &bad);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
  std::filesystem::remove_all(dir);
}

// A fresh clone holds only the committed results.jsonl.gz: --summary-only summarizes it. An
// empty directory is an error that leaves the tables already there alone.
TEST(EvalSummary, WrittenFromTheGzipWhenThePlainFileIsAbsent) {
  const std::string dir = temp_dir("summary_gz");
  {
    gzFile f = gzopen((dir + "/results.jsonl.gz").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < 4; ++i) {
      const std::string line = result("vt", "full", 0, i, i < 2 ? 1.0 : 0.0).dump() + "\n";
      ASSERT_GT(gzwrite(f, line.data(), unsigned(line.size())), 0);
    }
    ASSERT_EQ(gzclose(f), Z_OK);
  }
  auto md = write_eval_summary(dir);
  ASSERT_TRUE(md.has_value()) << md.error();
  EXPECT_NE(md->find("| vt | 50.0"), std::string::npos) << *md;
  EXPECT_FALSE(std::filesystem::exists(dir + "/results.jsonl"));
  std::filesystem::remove(dir + "/results.jsonl.gz");
  auto none = write_eval_summary(dir);
  EXPECT_FALSE(none.has_value());
  auto kept = read_text_file(dir + "/summary.md");
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(*kept, *md);
  std::filesystem::remove_all(dir);
}

TEST(EvalSummary, MeansIntervalsAndMacro) {
  std::vector<json> rs;
  for (int i = 0; i < 10; ++i) rs.push_back(result("vt", "full", 0, i, 1.0));
  for (int i = 0; i < 10; ++i) rs.push_back(result("cwe", "full", 0, i, i < 5 ? 1.0 : 0.0));
  for (int i = 0; i < 4; ++i) rs.push_back(result("vt", "qevict", 0.2, i, 0.25 * i));
  const auto rows = summarize(rs);
  auto find = [&](const std::string& task, const std::string& variant) -> const SummaryRow* {
    for (const auto& r : rows)
      if (r.task == task && r.variant == variant) return &r;
    return nullptr;
  };
  const SummaryRow* vt = find("vt", "full");
  ASSERT_NE(vt, nullptr);
  EXPECT_EQ(vt->n, 10);
  EXPECT_DOUBLE_EQ(vt->mean, 1.0);
  EXPECT_DOUBLE_EQ(vt->lo, 1.0);  // no spread, no interval
  EXPECT_DOUBLE_EQ(vt->hi, 1.0);
  const SummaryRow* cwe = find("cwe", "full");
  ASSERT_NE(cwe, nullptr);
  EXPECT_DOUBLE_EQ(cwe->mean, 0.5);
  // Bootstrap of a 5/10 proportion: the 95 % interval is about [0.2, 0.8].
  EXPECT_GE(cwe->lo, 0.1);
  EXPECT_LE(cwe->lo, 0.3);
  EXPECT_GE(cwe->hi, 0.7);
  EXPECT_LE(cwe->hi, 0.9);
  const SummaryRow* macro = find("macro", "full");
  ASSERT_NE(macro, nullptr);
  EXPECT_DOUBLE_EQ(macro->mean, 0.75);
  EXPECT_EQ(macro->n, 20);
  EXPECT_LT(macro->lo, 0.75);
  EXPECT_GT(macro->hi, 0.75);
  const SummaryRow* q = find("vt", "qevict");
  ASSERT_NE(q, nullptr);
  EXPECT_DOUBLE_EQ(q->mean, 0.375);
  EXPECT_EQ(find("macro", "qevict"), nullptr);  // one task: no macro row
  EXPECT_EQ(rows.back().task, "macro");         // macro rows after the tasks of their length
  // Same input, same intervals: the bootstrap has a fixed seed.
  EXPECT_EQ(summary_csv(summarize(rs)), summary_csv(rows));
  const std::string csv = summary_csv(rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')), "task,length,variant,budget,n,mean,ci95_low,ci95_high");
  EXPECT_NE(csv.find("cwe,4096,full,0,10,0.5000,"), std::string::npos) << csv;
  const std::string md = summary_markdown(rows);
  EXPECT_NE(md.find("| task | full | qevict@0.2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| vt | 100.0 [100.0, 100.0] 10 | 37.5 ["), std::string::npos) << md;
}

// With qa_1/qa_2 present, the macro over every RULER task and beside it the one without qa.
TEST(EvalSummary, MacroWithAndWithoutQa) {
  std::vector<json> rs;
  for (int i = 0; i < 4; ++i) {
    rs.push_back(result("vt", "full", 0.0, i, 1.0));
    rs.push_back(result("cwe", "full", 0.0, i, 0.5));
    rs.push_back(result("qa_1", "full", 0.0, i, 0.0));
    rs.push_back(result("lcc", "full", 0.0, i, 0.9));  // not RULER's: in neither
  }
  const auto rows = summarize(rs);
  ASSERT_GE(rows.size(), 2u);
  const SummaryRow& with = rows[rows.size() - 2];
  const SummaryRow& without = rows.back();
  EXPECT_EQ(with.task, "macro");
  EXPECT_DOUBLE_EQ(with.mean, 0.5);
  EXPECT_EQ(with.n, 12);
  EXPECT_EQ(without.task, "macro_no_qa");
  EXPECT_DOUBLE_EQ(without.mean, 0.75);
  EXPECT_EQ(without.n, 8);
  EXPECT_NE(summary_markdown(rows).find("| **macro_no_qa** |"), std::string::npos);
}

// doc_qa's reference score is a row doc_qa_ref beside doc_qa, from the lines that have it:
// lines written before it (no score_ref) still summarise, and it joins no macro.
TEST(EvalSummary, DocQaReferenceRowFromTheLinesThatHaveIt) {
  std::vector<json> rs;
  for (int i = 0; i < 4; ++i) {
    json full = result("doc_qa", "full", 0.0, i, 1.0);
    json q = result("doc_qa", "qevict", 0.2, i, 0.5);
    if (i < 3) {  // the fourth line of each is from before score_ref
      full["score_ref"] = 0.25 * i;
      q["score_ref"] = 0.5;
    }
    rs.push_back(full);
    rs.push_back(q);
    rs.push_back(result("vt", "full", 0.0, i, 1.0));
    rs.push_back(result("cwe", "full", 0.0, i, 0.5));
  }
  rs.back()["score_ref"] = "not a number";  // ignored, not fatal
  const auto rows = summarize(rs);
  auto find = [&](const std::string& task, const std::string& variant) -> const SummaryRow* {
    for (const auto& r : rows)
      if (r.task == task && r.variant == variant) return &r;
    return nullptr;
  };
  const SummaryRow* agree = find("doc_qa", "full");
  ASSERT_NE(agree, nullptr);
  EXPECT_EQ(agree->n, 4);
  EXPECT_DOUBLE_EQ(agree->mean, 1.0);
  const SummaryRow* ref = find("doc_qa_ref", "full");
  ASSERT_NE(ref, nullptr);
  EXPECT_EQ(ref->n, 3);
  EXPECT_DOUBLE_EQ(ref->mean, 0.25);  // (0 + 0.25 + 0.5) / 3: FullKV is not 100 by definition
  ASSERT_NE(find("doc_qa_ref", "qevict"), nullptr);
  EXPECT_DOUBLE_EQ(find("doc_qa_ref", "qevict")->mean, 0.5);
  EXPECT_EQ(find("cwe_ref", "full"), nullptr);
  const SummaryRow* macro = find("macro", "full");
  ASSERT_NE(macro, nullptr);
  EXPECT_DOUBLE_EQ(macro->mean, 0.75);  // vt and cwe only
  const std::string md = summary_markdown(rows);
  EXPECT_NE(md.find("| doc_qa_ref | 25.0 ["), std::string::npos) << md;
  EXPECT_LT(md.find("| doc_qa |"), md.find("| doc_qa_ref |"));
  // Results without any score_ref: no doc_qa_ref row.
  std::vector<json> old = {result("doc_qa", "full", 0.0, 0, 1.0)};
  for (const auto& r : summarize(old)) EXPECT_NE(r.task, "doc_qa_ref");
}

TEST(RulerResources, PlainAndGzipFilesAndFilters) {
  const std::string dir = temp_dir("resources");
  const std::string text = "Contents\n=== ═══\nChapter 1. It starts here. Then ─── more.\n";
  {
    std::ofstream f(dir + "/plain.txt");
    f << text;
  }
  gzFile g = gzopen((dir + "/text.gz").c_str(), "wb");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(gzwrite(g, text.data(), unsigned(text.size())), int(text.size()));
  gzclose(g);
  auto a = read_text_file(dir + "/plain.txt"), b = read_text_file(dir + "/text.gz");
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(*a, text);
  EXPECT_EQ(*b, text);
  EXPECT_FALSE(read_text_file(dir + "/missing").has_value());
  EXPECT_EQ(prose_words(text, "Chapter 1."),
            (std::vector<std::string>{"Chapter", "1.", "It", "starts", "here.", "Then", "more."}));
  EXPECT_EQ(prose_words(text, "absent").front(), "Contents");
  EXPECT_EQ(prose_words("Toc Chapter\xc2\xa0"
                        "1.\xc2\xa0Go on.",
                        "Chapter 1. Go"),
            (std::vector<std::string>{"Chapter", "1.", "Go", "on."}));
  EXPECT_EQ(plain_words("zebra\nab\nAlice\ndon't\nzebra\napple\nextraordinarily\n"),
            (std::vector<std::string>{"apple", "zebra"}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qevict::eval
