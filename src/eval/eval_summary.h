// Reading `qevict eval`'s results.jsonl and summarising it: mean score per (task, variant,
// budget, length) with n and a 95 % percentile-bootstrap interval (scores are recalls in
// [0, 1], not all binary, so a binomial interval would not apply), plus a macro row per
// (variant, budget, length) — the mean of the task means, its interval from a bootstrap that
// resamples within each task. Written as summary.csv and summary.md.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/status.h"

namespace qevict::eval {

// The complete lines of a results file, plain or gzip (missing file: none). A line that does
// not parse — the tail of a run killed while writing — is skipped and counted in *n_bad.
Expected<std::vector<nlohmann::json>> read_eval_results(const std::string& path, int64_t* n_bad);

// The protocol of a result line as cell keys and summary rows name it: "end" for lines
// without one, "multi.tK" for turn K of multi, else the line's protocol.
std::string result_protocol_label(const nlohmann::json& j);

// The cell a result line counts in — (length, protocol label, variant, budget) — as both
// summarize() and summarize_turns() (turn_summary.h) group lines; std::map order is their rows'.
using ResultKey = std::tuple<int64_t, std::string, std::string, double>;
ResultKey result_key(const nlohmann::json& j);

// Helpers of the summary tables (here and turn_summary.cpp). A variant's name as a label:
// "variant@budget", or the name alone without a budget (FullKV).
std::string variant_label(const std::string& variant, double budget);
// A share in [0, 1] as percent with one decimal ("42.5").
std::string percent_text(double share);
// Rows (anything with an int64_t `length`) by length, ascending, each group in the rows' order:
// summary.md has one table per length.
template <class Row>
std::map<int64_t, std::vector<const Row*>> rows_by_length(const std::vector<Row>& rows) {
  std::map<int64_t, std::vector<const Row*>> by_len;
  for (const Row& r : rows) by_len[r.length].push_back(&r);
  return by_len;
}

struct SummaryRow {
  std::string task;  // "macro" for the mean over tasks
  int64_t length = 0;
  std::string variant;
  double budget = 0.0;
  std::string protocol = "end";           // eval_protocol.h; lines without one: end
  int64_t n = 0;                          // samples
  double mean = 0.0, lo = 0.0, hi = 0.0;  // score in [0, 1] and its 95 % interval
};

// Rows sorted by length, task (macro last), variant, budget. Bootstrap: 2000 resamples, fixed
// seed, so a summary is reproducible.
std::vector<SummaryRow> summarize(const std::vector<nlohmann::json>& results);

// A protocol column is added when a row's protocol is not `end` (summaries of grids before
// protocols stay as they were).
std::string summary_csv(const std::vector<SummaryRow>& rows);
// One table per length: a row per task (and macro), a column per variant@budget (and
// " [protocol]" when not `end`), cells "mean [lo, hi] n" in percent.
std::string summary_markdown(const std::vector<SummaryRow>& rows);

// Reads DIR/results.jsonl (or, when absent, the committed DIR/results.jsonl.gz) and writes
// DIR/summary.csv and DIR/summary.md (and, when lines carry per-turn diagnostics, DIR/turns.csv
// and a section of summary.md: turn_summary.h); returns the markdown. Neither file: an error, and
// the summaries already there are left alone.
Expected<std::string> write_eval_summary(const std::string& out_dir);

}  // namespace qevict::eval
