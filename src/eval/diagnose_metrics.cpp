// The diagnose runner's per-variant metrics: FMM, mass by tier, churn, global LIR, ledger,
// score cosine and the tier map, from the traces the runner recorded (diagnose_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eval/diagnose_internal.h"

namespace qevict::eval::detail {

void snapshot(Variant& v, int n_layers) {
  Snapshot s;
  s.n_past = v.cache->n_past();
  v.cache->report(&v.report, ReportDetail::kTiers);
  for (int u = 0; u < v.units; ++u)
    s.windows.push_back(window_tiers(v.report.position_tiers[size_t(u)], v.sink, v.unit));
  if (v.windowed) {
    s.scores = v.report.window_scores;
    double ledger = 0.0;
    for (const auto& ls : v.report.layers) {
      ledger += double(ls.bytes_ledger_of_full);
      s.promotions += ls.promotions;
      s.demotions += ls.demotions;
    }
    s.ledger_bytes_per_layer = ledger / n_layers;
  }
  v.snaps.push_back(std::move(s));
}

double mean_valid(const std::vector<double>& x) {
  double s = 0.0;
  int64_t n = 0;
  for (double v : x)
    if (v >= 0.0) {
      s += v;
      ++n;
    }
  return n ? s / double(n) : -1.0;
}

json lir_json(const LirCounts& c) {
  return json{
      {"windows", c.windows}, {"left_full", c.left}, {"returned", c.returned}, {"lir", c.lir()}};
}

json mass_json(const TierMass& m) {
  return json{{"full", m.full}, {"quant", m.quant}, {"evicted", m.evicted}, {"local", m.local}};
}

// The same shares over the routed history only (sink and local region left out).
json history_mass_json(const TierMass& m) {
  const double h = m.full + m.quant + m.evicted;
  if (h <= 0.0) return json{{"full", 0.0}, {"quant", 0.0}, {"evicted", 0.0}};
  return json{{"full", m.full / h}, {"quant", m.quant / h}, {"evicted", m.evicted / h}};
}

// Every number of one variant (and its tier map on `map_layer`) from the recorded traces.
json variant_json(const Variant& v, const std::vector<float>& hist, const DiagnoseOptions& o,
                  int NL, int H, int64_t n_ctx, int map_layer) {
  json j;
  j["policy"] = v.params.policy;
  j["describe"] = v.cache->describe();
  j["unit_tokens"] = v.unit;
  j["sink"] = v.sink;
  j["local"] = v.params.local;
  j["route_every"] = v.params.route_every;
  j["q"] = v.params.q;
  j["score"] = v.params.score;
  j["per_head"] = v.per_head;
  j["bytes_held"] = v.report.bytes_held;
  j["routing_events"] = v.report.routing_events;
  if (v.report.budget.budgeted()) j["budget_bytes_per_layer"] = v.report.budget.total;
  j["fmm"] = v.fmm;
  j["fmm_q_as_evicted"] = v.fmm_q;
  double fmm_mean = 0.0, fmm_last = 0.0;
  for (double x : v.fmm) fmm_mean += x / double(v.fmm.size());
  const size_t q4 = v.fmm.size() - v.fmm.size() / 4;
  for (size_t i = q4; i < v.fmm.size(); ++i) fmm_last += v.fmm[i] / double(v.fmm.size() - q4);
  double fmmq_mean = 0.0;
  for (double x : v.fmm_q) fmmq_mean += x / double(v.fmm_q.size());
  j["fmm_mean"] = fmm_mean;
  j["fmm_last_quarter_mean"] = fmm_last;
  j["fmm_q_as_evicted_mean"] = fmmq_mean;
  j["mass_by_tier"] = mass_json(v.mass);
  j["history_mass_by_tier"] = history_mass_json(v.mass);
  j["top1_agreement"] = v.compared ? double(v.top1) / double(v.compared) : 0.0;
  j["mean_kl"] = v.compared ? v.kl_sum / double(v.compared) : 0.0;

  // Churn between consecutive routing events (decode phase: the end-of-prefill snapshot
  // is the first).
  std::vector<double> d_kept, d_full, d_raw;
  for (size_t k = 0; k + 1 < v.snaps.size(); ++k)
    for (int u = 0; u < v.units; ++u) {
      const auto& a = v.snaps[k].windows[u];
      const auto& b = v.snaps[k + 1].windows[u];
      d_kept.push_back(jaccard_distance(a, b, KeepSet::kFullOrQuant, true));
      d_full.push_back(jaccard_distance(a, b, KeepSet::kFull, true));
      d_raw.push_back(jaccard_distance(a, b, KeepSet::kFullOrQuant, false));
    }
  j["churn"] = {{"kept", mean_valid(d_kept)},
                {"full", mean_valid(d_full)},
                {"kept_incl_newly_aged", mean_valid(d_raw)},
                {"snapshots", v.snaps.size()}};

  // Global LIR of the full-precision set, per unit, summed.
  LirCounts lir;
  for (int u = 0; u < v.units; ++u) {
    std::vector<std::vector<uint8_t>> in_full;
    for (const auto& s : v.snaps) {
      std::vector<uint8_t> row(s.windows[u].size());
      for (size_t w = 0; w < row.size(); ++w) row[w] = s.windows[u][w] == Tier::kFull;
      in_full.push_back(std::move(row));
    }
    lir += lir_counts(in_full);
  }
  j["lir"] = lir_json(lir);

  if (v.windowed) {
    const KvLayerReport tot = v.report.total();
    const int64_t aged = tot.aged, young = tot.evicted_at_first_routing,
                  quantizations = tot.quantizations;
    j["young_window_eviction"] = {{"aged", aged},
                                  {"evicted_at_first_routing", young},
                                  {"share", aged ? double(young) / double(aged) : 0.0}};
    j["capacity_full"] = v.report.budget.capacity_full;
    j["capacity_quant"] = v.report.budget.capacity_quant;
    // Ledger copies held by promoted windows, against the moves that create them.
    double led_max = 0.0, led_mean = 0.0;
    json per_event = json::array();
    for (size_t k = 0; k < v.snaps.size(); ++k) {
      const auto& s = v.snaps[k];
      led_max = std::max(led_max, s.ledger_bytes_per_layer);
      led_mean += s.ledger_bytes_per_layer / double(v.snaps.size());
      const int64_t moves =
          k ? (s.promotions - v.snaps[k - 1].promotions) + (s.demotions - v.snaps[k - 1].demotions)
            : 0;
      per_event.push_back({{"n_past", s.n_past},
                           {"ledger_bytes_per_layer", s.ledger_bytes_per_layer},
                           {"moves", moves}});
    }
    const int64_t promos = v.snaps.back().promotions - v.snaps.front().promotions;
    const int64_t demos = v.snaps.back().demotions - v.snaps.front().demotions;
    j["ledger"] = {{"max_bytes_per_layer", led_max},
                   {"mean_bytes_per_layer", led_mean},
                   {"max_share_of_budget", led_max / double(v.report.budget.total)},
                   {"promotions_decode", promos},
                   {"demotions_decode", demos},
                   {"quantizations", quantizations},
                   {"per_event", per_event}};
  }

  // Score agreement: on the windows a variant holds in Q during a routing interval, the
  // score it accumulated from attention on low-bit keys vs FullKV's attention on the
  // same windows over the same steps.
  if (v.windowed && v.params.q > 0.0) {
    std::vector<double> ga, gb, per;
    std::vector<double> wm, acc;
    for (size_t k = 0; k + 1 < v.snaps.size(); ++k) {
      const auto& s0 = v.snaps[k];
      const auto& s1 = v.snaps[k + 1];
      for (int l = 0; l < NL; ++l) {
        const auto& tiers = s0.windows[l];
        const int64_t nw = int64_t(tiers.size());
        acc.assign(size_t(nw), 0.0);
        for (int64_t t = s0.n_past - o.prefill; t < s1.n_past - o.prefill; ++t) {
          window_sums(hist.data() + (size_t(t) * NL + l) * n_ctx, n_ctx, v.sink, v.unit, nw, &wm);
          for (int64_t w = 0; w < nw; ++w) acc[w] += wm[w];
        }
        std::vector<double> a, b;
        for (int64_t w = 0; w < nw; ++w) {
          if (tiers[w] != Tier::kQuant) continue;
          a.push_back(s1.scores[l][w] - s0.scores[l][w]);
          b.push_back(acc[w]);
        }
        ga.insert(ga.end(), a.begin(), a.end());
        gb.insert(gb.end(), b.begin(), b.end());
        if (a.size() >= 2) per.push_back(cosine(a, b));
      }
    }
    j["score_cosine"] = {{"global", cosine(ga, gb)},
                         {"mean_per_layer_interval", mean_valid(per)},
                         {"pairs", ga.size()}};
  }

  // Tier map: one layer (KV head 0), windows × routing events.
  json tm;
  tm["layer"] = map_layer;
  tm["unit_tokens"] = v.unit;
  tm["sink"] = v.sink;
  json ev = json::array();
  const int u = v.per_head ? map_layer * H : map_layer;
  for (const auto& s : v.snaps) {
    // Policies that route every step (streaming, h2o) are drawn every 8 steps.
    if ((s.n_past - o.prefill) % 8 != 0) continue;
    std::string row;
    for (Tier t : s.windows[u]) row += tier_char(t);
    ev.push_back({{"n_past", s.n_past}, {"tiers", row}});
  }
  tm["events"] = ev;
  j["tier_map"] = tm;
  return j;
}

}  // namespace qevict::eval::detail
