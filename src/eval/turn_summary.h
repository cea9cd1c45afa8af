// The per-turn diagnostics of multi-turn protocols (issue 51 item 2), summarised from
// results.jsonl: per (length, protocol — "after", "multi.t1".. —, variant, budget) over the
// lines that carry "diagnostics" (eval_protocol.h), what tells "evicted before the question"
// from "kept in Q but not promoted": the needle tokens' shares by tier when the question
// arrived, the promotions during the turn, FullKV's attention during the turn by the
// variant's tiers, the cache's own attention by tier, and the score. Written as turns.csv and
// a section of summary.md (eval_summary.h) when a results file has such lines.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qevict::eval {

// Shares in L, F, Q, E order.
struct TurnSummaryRow {
  int64_t length = 0;
  std::string protocol, variant;
  double budget = 0.0;
  int64_t n = 0;                          // lines
  double score = 0.0;                     // mean
  int64_t n_needle = 0;                   // lines whose needles were found (niah tasks)
  double needle[4] = {0, 0, 0, 0};        // mean share of the needle tokens (over units) per tier
  double needle_after[4] = {0, 0, 0, 0};  // the same after the answer
  double promotions = 0.0;                // mean promotions during the turn
  // FullKV's attention by the variant's tiers: the turn's prompt queries, all its queries.
  int64_t n_fullkv = 0;
  double fullkv_prompt[4] = {0, 0, 0, 0}, fullkv_turn[4] = {0, 0, 0, 0};
  int64_t n_own = 0;  // the cache's own attention by tier (tiered caches)
  double own_prompt[4] = {0, 0, 0, 0}, own_turn[4] = {0, 0, 0, 0};
};

// Rows sorted by length, protocol, variant, budget; none when no line has diagnostics.
std::vector<TurnSummaryRow> summarize_turns(const std::vector<nlohmann::json>& results);
std::string turn_summary_csv(const std::vector<TurnSummaryRow>& rows);
// A section: "## Turn diagnostics" and one table per length, shares in percent ("–": none).
std::string turn_summary_markdown(const std::vector<TurnSummaryRow>& rows);

}  // namespace qevict::eval
