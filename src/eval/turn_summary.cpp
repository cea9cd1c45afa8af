// Per-turn diagnostics summary (see turn_summary.h).
#include "eval/turn_summary.h"

#include <fmt/format.h>

#include <map>
#include <tuple>

#include "eval/eval_summary.h"

namespace qevict::eval {

using json = nlohmann::json;

namespace {

constexpr const char* kTiers[4] = {"L", "F", "Q", "E"};

// The four shares of an object {"L", "F", "Q", "E"}; false when one is missing.
bool read_shares(const json& j, double out[4]) {
  if (!j.is_object()) return false;
  for (int k = 0; k < 4; ++k) {
    if (!j.contains(kTiers[k]) || !j[kTiers[k]].is_number()) return false;
    out[k] = j[kTiers[k]].get<double>();
  }
  return true;
}

// Adds the "prompt" and "turn" shares of a turn_mass_json object; false when absent.
bool add_mass(const json& d, const char* key, double prompt[4], double turn[4]) {
  if (!d.contains(key)) return false;
  double p[4], t[4];
  if (!d[key].contains("prompt") || !d[key].contains("turn") || !read_shares(d[key]["prompt"], p) ||
      !read_shares(d[key]["turn"], t))
    return false;
  for (int k = 0; k < 4; ++k) prompt[k] += p[k], turn[k] += t[k];
  return true;
}

void divide(double x[4], int64_t n) {
  if (n > 0)
    for (int k = 0; k < 4; ++k) x[k] /= double(n);
}

std::string pct_or_dash(double x, int64_t n) { return n > 0 ? percent_text(x) : "–"; }

}  // namespace

std::vector<TurnSummaryRow> summarize_turns(const std::vector<json>& results) {
  std::map<ResultKey, TurnSummaryRow> by;
  for (const auto& j : results) {
    if (!j.contains("diagnostics") || !j["diagnostics"].is_object()) continue;
    const json& d = j["diagnostics"];
    const ResultKey key = result_key(j);
    TurnSummaryRow& r = by[key];
    std::tie(r.length, r.protocol, r.variant, r.budget) = key;
    ++r.n;
    r.score += j["score"].get<double>();
    if (d.contains("promotions") && d["promotions"].is_number())
      r.promotions += d["promotions"].get<double>();
    double t[4], ta[4];
    if (d.contains("before") && d["before"].contains("needle_tiers") &&
        read_shares(d["before"]["needle_tiers"], t) && d.contains("after") &&
        d["after"].contains("needle_tiers") && read_shares(d["after"]["needle_tiers"], ta)) {
      const double sum = t[0] + t[1] + t[2] + t[3], sum_a = ta[0] + ta[1] + ta[2] + ta[3];
      if (sum > 0 && sum_a > 0) {
        for (int k = 0; k < 4; ++k) {
          r.needle[k] += t[k] / sum;
          r.needle_after[k] += ta[k] / sum_a;
        }
        ++r.n_needle;
      }
    }
    r.n_fullkv += add_mass(d, "fullkv_mass", r.fullkv_prompt, r.fullkv_turn);
    r.n_own += add_mass(d, "own_mass", r.own_prompt, r.own_turn);
  }
  std::vector<TurnSummaryRow> rows;
  for (auto& [key, r] : by) {
    r.score /= double(r.n);
    r.promotions /= double(r.n);
    divide(r.needle, r.n_needle);
    divide(r.needle_after, r.n_needle);
    divide(r.fullkv_prompt, r.n_fullkv);
    divide(r.fullkv_turn, r.n_fullkv);
    divide(r.own_prompt, r.n_own);
    divide(r.own_turn, r.n_own);
    rows.push_back(r);
  }
  return rows;
}

std::string turn_summary_csv(const std::vector<TurnSummaryRow>& rows) {
  std::string s = "length,protocol,variant,budget,n,score,n_needle";
  for (const char* t : kTiers) s += fmt::format(",needle_{}", t);
  for (const char* t : kTiers) s += fmt::format(",needle_after_{}", t);
  s += ",promotions,n_fullkv";
  for (const char* part : {"prompt", "turn"})
    for (const char* t : kTiers) s += fmt::format(",fullkv_{}_{}", part, t);
  s += ",n_own";
  for (const char* part : {"prompt", "turn"})
    for (const char* t : kTiers) s += fmt::format(",own_{}_{}", part, t);
  s += "\n";
  for (const auto& r : rows) {
    s += fmt::format("{},{},{},{:g},{},{:.4f},{}", r.length, r.protocol, r.variant, r.budget, r.n,
                     r.score, r.n_needle);
    for (const double* v : {r.needle, r.needle_after})
      for (int k = 0; k < 4; ++k) s += fmt::format(",{:.4f}", v[k]);
    s += fmt::format(",{:.2f},{}", r.promotions, r.n_fullkv);
    for (const double* v : {r.fullkv_prompt, r.fullkv_turn})
      for (int k = 0; k < 4; ++k) s += fmt::format(",{:.4f}", v[k]);
    s += fmt::format(",{}", r.n_own);
    for (const double* v : {r.own_prompt, r.own_turn})
      for (int k = 0; k < 4; ++k) s += fmt::format(",{:.4f}", v[k]);
    s += "\n";
  }
  return s;
}

std::string turn_summary_markdown(const std::vector<TurnSummaryRow>& rows) {
  if (rows.empty()) return "";
  std::string md =
      "\n## Turn diagnostics\n\nPer answered turn of a multi-turn protocol (`multi.tK`: question "
      "K), means over its lines, in percent. needle L/F/Q/E: where the asked needle's tokens "
      "were (over layers, or layers and KV heads) when the question arrived, F after: in F after "
      "the answer; promo: windows (any, not only the needle's) promoted during the turn; FullKV "
      "mass L/F/Q/E: the share of FullKV's attention during "
      "the turn (its question and answer tokens) on the text's positions the variant held in "
      "F, Q or had evicted when the question arrived (L: sink, local region, and every "
      "position after the text); own F/Q: the cache's own attention during the turn on its F "
      "and Q windows (tiered caches; the rest is L). Full per-column figures, the question's "
      "queries alone included: turns.csv.\n";
  for (const auto& [length, lr] : rows_by_length(rows)) {
    md += fmt::format(
        "\n### {} tokens\n\n| protocol | variant | n | score | needle L | F | Q | E | F after | "
        "promo | FullKV mass L | F | Q | E | own F | own Q |\n|---|---|---|---|---|---|---|---|"
        "---|---|---|---|---|---|---|---|\n",
        length);
    for (const TurnSummaryRow* r : lr) {
      md += fmt::format("| {} | {} | {} | {} |", r->protocol, variant_label(r->variant, r->budget),
                        r->n, percent_text(r->score));
      for (double x : r->needle) md += fmt::format(" {} |", pct_or_dash(x, r->n_needle));
      md += fmt::format(" {} |", pct_or_dash(r->needle_after[1], r->n_needle));
      md += fmt::format(" {:.1f} |", r->promotions);
      for (double x : r->fullkv_turn) md += fmt::format(" {} |", pct_or_dash(x, r->n_fullkv));
      md += fmt::format(" {} | {} |\n", pct_or_dash(r->own_turn[1], r->n_own),
                        pct_or_dash(r->own_turn[2], r->n_own));
    }
  }
  return md;
}

}  // namespace qevict::eval
