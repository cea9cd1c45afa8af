// The markdown summary of the diagnose runner's JSON (diagnose_markdown).
#include <fmt/format.h>

#include "eval/diagnose.h"

namespace qevict::eval {

using json = nlohmann::json;

namespace {

std::string pct(const json& x) {
  if (!x.is_number() || x.get<double>() < 0.0) return "n/a";
  return fmt::format("{:.1f} %", 100.0 * x.get<double>());
}
std::string num(const json& x, int digits = 4) {
  if (!x.is_number() || x.get<double>() < -1.0) return "n/a";
  if (x.get<double>() < 0.0) return "n/a";
  return fmt::format("{:.{}f}", x.get<double>(), digits);
}
const json& at(const json& j, std::initializer_list<const char*> path) {
  static const json null_json;
  const json* cur = &j;
  for (const char* k : path) {
    if (!cur->is_object() || !cur->contains(k)) return null_json;
    cur = &(*cur)[k];
  }
  return *cur;
}

}  // namespace

std::string diagnose_markdown(const json& j) {
  std::string md;
  const json& c = j["config"];
  const json& vs = j["variants"];
  md += "# qevict diagnose\n\n";
  md += fmt::format(
      "{}{}Prefill {} tokens, then {} decode steps of FullKV's greedy continuation "
      "teacher-forced into every variant; budget {} per layer for every variant; {} layers, "
      "{} KV heads. Lockstep run {:.1f} s on {} threads.\n\n",
      c.contains("model") ? fmt::format("Model `{}`. ", c["model"].get<std::string>()) : "",
      c.contains("text") ? fmt::format("Text `{}`. ", c["text"].get<std::string>()) : "",
      c["prefill"].get<int64_t>(), c["gen"].get<int64_t>(),
      c["budget_bytes"].get<int64_t>() > 0
          ? fmt::format("{} bytes", c["budget_bytes"].get<int64_t>())
          : fmt::format("{:.0f} % of the full cache", 100.0 * c["budget_fraction"].get<double>()),
      c["n_layers"].get<int>(), c["n_kv_heads"].get<int>(),
      at(j, {"seconds", "total_lockstep"}).get<double>(), c["threads"].get<int>());
  md += "## Per variant\n\n";
  md +=
      "| variant | cache | FMM mean | FMM last ¼ | mass F | mass Q | mass E | mass sink+local | "
      "churn kept | churn F | LIR online | top-1 vs FullKV | mean KL | young-window eviction | "
      "bytes held |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& name : c["variants"]) {
    const json& v = vs[name.get<std::string>()];
    md += fmt::format(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2f} MiB |\n",
        name.get<std::string>(), v["describe"].get<std::string>(), pct(v["fmm_mean"]),
        pct(v["fmm_last_quarter_mean"]), pct(at(v, {"mass_by_tier", "full"})),
        pct(at(v, {"mass_by_tier", "quant"})), pct(at(v, {"mass_by_tier", "evicted"})),
        pct(at(v, {"mass_by_tier", "local"})), num(at(v, {"churn", "kept"})),
        num(at(v, {"churn", "full"})), pct(at(v, {"lir", "lir"})), pct(v["top1_agreement"]),
        num(v["mean_kl"]), pct(at(v, {"young_window_eviction", "share"})),
        v["bytes_held"].get<double>() / 1048576.0);
  }
  md += fmt::format(
      "\nFullKV holds {:.2f} MiB. \"Bytes held\" is what each cache object really holds at the "
      "end (pools in whole chunks, RoPE table, scratch), not the budget.\n",
      j["full"]["bytes_held"].get<double>() / 1048576.0);
  auto var = [&](const char* n, std::initializer_list<const char*> path) -> const json& {
    static const json null_json;
    if (!vs.contains(n)) return null_json;
    return at(vs[n], path);
  };
  md += "\n## Against the paper (SPEC §9: Llama-3.1-8B-Instruct, 512 + 256 tokens, 20 %)\n\n";
  md += "| diagnostic | ours | paper |\n|---|---|---|\n";
  md += fmt::format(
      "| selection churn R1 / R3 / R4 (kept set, windows routed at both events) "
      "| {} / {} / {} | 0.017 / 0.0012 / 0.018 |\n",
      num(var("R1", {"churn", "kept"})), num(var("R3", {"churn", "kept"})),
      num(var("R4", {"churn", "kept"})));
  md += fmt::format("| churn of the F set R1 / R3 / R4 | {} / {} / {} | — |\n",
                    num(var("R1", {"churn", "full"})), num(var("R3", {"churn", "full"})),
                    num(var("R4", {"churn", "full"})));
  md += fmt::format(
      "| global LIR, online R3 vs oracle (cumulative FullKV attention; future FullKV "
      "attention) | {} vs {}; {} | 6.18 % vs 0.98 % |\n",
      pct(var("R3", {"lir", "lir"})), pct(at(j, {"oracle", "cumulative", "lir"})),
      pct(at(j, {"oracle", "future", "lir"})));
  md += fmt::format(
      "| mass by tier R2: F / E (of all mass; of the routed history's mass) | {} / {}; {} / {} "
      "| 33.3 % / 64.8 % |\n",
      pct(var("R2", {"mass_by_tier", "full"})), pct(var("R2", {"mass_by_tier", "evicted"})),
      pct(var("R2", {"history_mass_by_tier", "full"})),
      pct(var("R2", {"history_mass_by_tier", "evicted"})));
  md += fmt::format(
      "| mass by tier R3: F / Q / E (of all mass; of the routed history's mass) | {} / {} / {}; "
      "{} / {} / {} | 19.7 % / 42.6 % / 35.7 % |\n",
      pct(var("R3", {"mass_by_tier", "full"})), pct(var("R3", {"mass_by_tier", "quant"})),
      pct(var("R3", {"mass_by_tier", "evicted"})), pct(var("R3", {"history_mass_by_tier", "full"})),
      pct(var("R3", {"history_mass_by_tier", "quant"})),
      pct(var("R3", {"history_mass_by_tier", "evicted"})));
  md += fmt::format(
      "| score cosine, INT2 scores vs FullKV attention on Q windows (R3; global / mean per "
      "layer·interval) | {} / {} | 0.9824 |\n",
      num(var("R3", {"score_cosine", "global"})),
      num(var("R3", {"score_cosine", "mean_per_layer_interval"})));
  md += fmt::format(
      "| FMM mean R1 / R2 / R3 / R4; R3 with Q counted as evicted | {} / {} / {} / {}; {} | "
      "Fig. 1a: windows below tokens; R3 without Q jumps back near R1/R2 |\n",
      pct(var("R1", {"fmm_mean"})), pct(var("R2", {"fmm_mean"})), pct(var("R3", {"fmm_mean"})),
      pct(var("R4", {"fmm_mean"})), pct(var("R3", {"fmm_q_as_evicted_mean"})));
  md += fmt::format(
      "| ledger held by promoted windows, R3: max bytes/layer (share of budget); promotions / "
      "demotions in decode | {} B ({}); {} / {} | not reported |\n",
      num(var("R3", {"ledger", "max_bytes_per_layer"}), 0),
      pct(var("R3", {"ledger", "max_share_of_budget"})),
      num(var("R3", {"ledger", "promotions_decode"}), 0),
      num(var("R3", {"ledger", "demotions_decode"}), 0));
  md += fmt::format(
      "| oscillating workload: ledger held at most (share of budget), non-strict / strict; "
      "moves per event | {} / {}; {:.1f} | not reported |\n",
      pct(at(j, {"oscillation", "non_strict", "max_ledger_share_of_budget"})),
      pct(at(j, {"oscillation", "strict", "max_ledger_share_of_budget"})),
      at(j, {"oscillation", "non_strict", "events"}).size()
          ? double(at(j, {"oscillation", "non_strict", "promotions"}).get<int64_t>() +
                   at(j, {"oscillation", "non_strict", "demotions"}).get<int64_t>()) /
                double(at(j, {"oscillation", "non_strict", "events"}).size())
          : 0.0);
  md += fmt::format("| young-window eviction R3 | {} | 91.5 % (follow-up) |\n",
                    pct(var("R3", {"young_window_eviction", "share"})));
  return md;
}

}  // namespace qevict::eval
