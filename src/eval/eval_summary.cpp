// Summary tables of `qevict eval` results (see eval_summary.h).
#include "eval/eval_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <tuple>

#include "core/atomic_file.h"
#include "eval/ruler_resources.h"
#include "eval/ruler_tasks.h"
#include "eval/turn_summary.h"

namespace qevict::eval {

using json = nlohmann::json;

namespace {

// The fields every result line must have, with their types: a line without them is not ours.
bool well_formed(const json& j) {
  return j.is_object() && j.contains("task") && j["task"].is_string() && j.contains("length") &&
         j["length"].is_number_integer() && j.contains("variant") && j["variant"].is_string() &&
         j.contains("budget") && j["budget"].is_number() && j.contains("sample") &&
         j["sample"].is_number_integer() && j.contains("score") && j["score"].is_number() &&
         (!j.contains("model") || j["model"].is_string());
}

constexpr int kResamples = 2000;
constexpr uint32_t kBootstrapSeed = 20240527u;

// Uniform index in [0, n) from mt19937 by rejection (the standard distributions are
// implementation-defined; this keeps intervals identical across standard libraries).
size_t draw(std::mt19937& g, size_t n) {
  const uint64_t range = uint64_t(1) << 32;
  const uint64_t limit = range - range % n;
  for (;;) {
    const uint64_t x = g();
    if (x < limit) return size_t(x % n);
  }
}

double mean_of(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// 2.5 % and 97.5 % percentiles of a sorted vector (nearest rank).
std::pair<double, double> percentiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * double(v.size())))]; };
  return {at(0.025), at(0.975)};
}

// Bootstrap of the mean of the per-group means (one group: a plain bootstrap of the mean).
std::pair<double, double> bootstrap(const std::vector<std::vector<double>>& groups) {
  std::mt19937 g(kBootstrapSeed);
  std::vector<double> stats(kResamples);
  for (int r = 0; r < kResamples; ++r) {
    double sum = 0.0;
    for (const auto& grp : groups) {
      double s = 0.0;
      for (size_t i = 0; i < grp.size(); ++i) s += grp[draw(g, grp.size())];
      sum += s / double(grp.size());
    }
    stats[size_t(r)] = sum / double(groups.size());
  }
  return percentiles(std::move(stats));
}

std::string column_name(const std::string& variant, double budget, const std::string& protocol) {
  const std::string c = variant_label(variant, budget);
  return protocol == "end" ? c : c + " [" + protocol + "]";
}

}  // namespace

std::string result_protocol_label(const json& j) {
  if (!j.contains("protocol") || !j["protocol"].is_string()) return "end";
  const std::string p = j["protocol"].get<std::string>();
  if (j.contains("turn") && j["turn"].is_number_integer())
    return fmt::format("{}.t{}", p, j["turn"].get<int64_t>());
  return p;
}

ResultKey result_key(const json& j) {
  return {j["length"].get<int64_t>(), result_protocol_label(j), j["variant"].get<std::string>(),
          j["budget"].get<double>()};
}

std::string variant_label(const std::string& variant, double budget) {
  return budget > 0 ? fmt::format("{}@{:g}", variant, budget) : variant;
}

std::string percent_text(double share) { return fmt::format("{:.1f}", 100.0 * share); }

Expected<std::vector<json>> read_eval_results(const std::string& path, int64_t* n_bad) {
  std::vector<json> out;
  if (n_bad) *n_bad = 0;
  if (!std::filesystem::exists(path)) return out;
  auto text = read_text_file(path);  // gunzips a .gz
  if (!text) return Status::error(fmt::format("{}: cannot read: {}", path, text.error()));
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!well_formed(j)) {
      if (n_bad) ++*n_bad;
      continue;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<SummaryRow> summarize(const std::vector<json>& results) {
  // (length, protocol, variant, budget) -> task -> scores
  std::map<ResultKey, std::map<std::string, std::vector<double>>> by;
  for (const auto& j : results) {
    auto& tasks = by[result_key(j)];
    const std::string task = j["task"].get<std::string>();
    tasks[task].push_back(j["score"].get<double>());
    // doc_qa's reference score (longdoc_tasks.h) as a task of its own, from the lines that
    // have it: results written before it summarise as they did.
    if (j.contains("score_ref") && j["score_ref"].is_number())
      tasks[task + "_ref"].push_back(j["score_ref"].get<double>());
  }
  std::vector<SummaryRow> rows;
  for (const auto& [col, tasks] : by) {
    const auto& [length, protocol, variant, budget] = col;
    // The macro over every RULER task present and, when qa_1/qa_2 are among them, beside it
    // the macro without them (the 11 synthetic tasks of the grids before issue 53).
    struct Macro {
      std::vector<std::vector<double>> groups;
      double sum = 0.0;
      int64_t n = 0;
    } all, synthetic;
    for (const auto& [task, scores] : tasks) {
      SummaryRow r{task,           length, variant, budget, protocol, int64_t(scores.size()),
                   mean_of(scores)};
      std::tie(r.lo, r.hi) = bootstrap({scores});
      rows.push_back(r);
      if (!is_ruler_task(task)) continue;  // the macro is RULER's: its tasks only
      for (Macro* m : {&all, &synthetic}) {
        if (m == &synthetic && (task == "qa_1" || task == "qa_2")) continue;
        m->groups.push_back(scores);
        m->sum += r.mean;
        m->n += r.n;
      }
    }
    for (const auto& [name, m] :
         {std::pair<const char*, const Macro*>{"macro", &all}, {"macro_no_qa", &synthetic}}) {
      if (m->groups.size() <= 1) continue;
      if (m == &synthetic && synthetic.groups.size() == all.groups.size()) continue;
      SummaryRow r{
          name, length, variant, budget, protocol, m->n, m->sum / double(m->groups.size())};
      std::tie(r.lo, r.hi) = bootstrap(m->groups);
      rows.push_back(r);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const SummaryRow& a, const SummaryRow& b) {
    auto key = [](const SummaryRow& r) {
      return std::make_tuple(r.length, r.task.rfind("macro", 0) == 0, r.task, r.protocol != "end",
                             r.protocol, r.variant, r.budget);
    };
    return key(a) < key(b);
  });
  return rows;
}

std::string summary_csv(const std::vector<SummaryRow>& rows) {
  const bool protocols = std::any_of(rows.begin(), rows.end(),
                                     [](const SummaryRow& r) { return r.protocol != "end"; });
  std::string s = "task,length,variant,budget,n,mean,ci95_low,ci95_high";
  s += protocols ? ",protocol\n" : "\n";
  for (const auto& r : rows) {
    s += fmt::format("{},{},{},{:g},{},{:.4f},{:.4f},{:.4f}", r.task, r.length, r.variant, r.budget,
                     r.n, r.mean, r.lo, r.hi);
    s += protocols ? "," + r.protocol + "\n" : "\n";
  }
  return s;
}

std::string summary_markdown(const std::vector<SummaryRow>& rows) {
  std::string md =
      "# qevict eval: RULER-style tasks\n\nScore in percent (string_match_all: share of the "
      "expected strings found in the output), `mean [95 % interval] n`; intervals are "
      "percentile bootstrap (2,000 resamples; for macro, resampled within each task). FullKV "
      "has no budget; the others run at the budget after `@` (a fraction of the full cache for "
      "prompt + generated tokens). macro: the mean over the RULER tasks present; macro_no_qa: the "
      "same without qa_1/qa_2 (qa: "
      "string_match_part, any reference found). Long-document "
      "tasks: lcc scores the edit similarity of the first code line to the file's next line; "
      "doc_qa and doc_sum the ROUGE-L F1 of the output against FullKV's own (FullKV: 100 by "
      "definition); doc_qa_ref scores doc_qa's answers against the asked headword's own "
      "entry in the excerpt (keyword recall: the share of the content words of a sense's first "
      "sentence, or of a note before it such as an acronym's expansion, found in the answer; "
      "the best over the entry's candidates).\n";
  for (const auto& [length, lr] : rows_by_length(rows)) {
    std::vector<std::string> cols, tasks;
    std::map<std::pair<std::string, std::string>, const SummaryRow*> cell;
    for (const SummaryRow* r : lr) {
      const std::string c = column_name(r->variant, r->budget, r->protocol);
      if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
      if (std::find(tasks.begin(), tasks.end(), r->task) == tasks.end()) tasks.push_back(r->task);
      cell[{r->task, c}] = r;
    }
    md += fmt::format("\n## {} tokens\n\n| task |", length);
    for (const auto& c : cols) md += " " + c + " |";
    md += "\n|---|";
    for (size_t i = 0; i < cols.size(); ++i) md += "---|";
    md += "\n";
    for (const auto& t : tasks) {
      md += t.rfind("macro", 0) == 0 ? "| **" + t + "** |" : "| " + t + " |";
      for (const auto& c : cols) {
        auto it = cell.find({t, c});
        if (it == cell.end()) {
          md += " – |";
          continue;
        }
        const SummaryRow& r = *it->second;
        md += fmt::format(" {} [{}, {}] {} |", percent_text(r.mean), percent_text(r.lo),
                          percent_text(r.hi), r.n);
      }
      md += "\n";
    }
  }
  return md;
}

Expected<std::string> write_eval_summary(const std::string& out_dir) {
  int64_t n_bad = 0;
  std::string path = out_dir + "/results.jsonl";
  if (!std::filesystem::exists(path)) {
    // A fresh clone holds only the committed results.jsonl.gz: summarize that. With neither,
    // there is nothing to summarize, and the tables a directory may hold must stay.
    path += ".gz";
    if (!std::filesystem::exists(path))
      return Status::error(fmt::format("{}: no results.jsonl or results.jsonl.gz", out_dir));
  }
  auto res = read_eval_results(path, &n_bad);
  if (!res) return res.status();
  const auto rows = summarize(*res);
  std::string md = summary_markdown(rows);
  // Multi-turn protocols: their per-turn diagnostics (turn_summary.h).
  const auto turns = summarize_turns(*res);
  md += turn_summary_markdown(turns);
  if (n_bad > 0)
    md += fmt::format("\n{} line(s) of results.jsonl did not parse and were left out.\n", n_bad);
  std::vector<std::pair<std::string, std::string>> files{{"summary.csv", summary_csv(rows)},
                                                         {"summary.md", md}};
  if (!turns.empty()) files.emplace_back("turns.csv", turn_summary_csv(turns));
  for (const auto& [name, text] : files)
    QEVICT_RETURN_IF_ERROR(write_file_atomic(out_dir + "/" + name, text));
  return md;
}

}  // namespace qevict::eval
