// Lockstep diagnostics runner (see diagnose.h).
#include "eval/diagnose.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "engine/perplexity.h"
#include "engine/sampling.h"
#include "eval/metrics.h"
#include "eval/oscillation.h"
#include "kvcache/full_cache.h"
#include "kvcache/head_cache.h"
#include "kvcache/tiered_cache.h"

namespace qevict::eval {

using json = nlohmann::json;

Status DiagnoseOptions::validate() const {
  if (prefill < 1) return Status::error("--prefill must be at least 1 token");
  if (gen < 1) return Status::error("--gen must be at least 1 step");
  if (chunk < 1) return Status::error("the prefill chunk must be at least 1 token");
  if (budget_bytes <= 0 && !(budget > 0.0))
    return Status::error("give a budget: --kv-budget FRACTION or --kv-budget-bytes N");
  if (variants.empty()) return Status::error("no variants to run (--variants)");
  for (size_t i = 0; i < variants.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (variants[i] == variants[j])
        return Status::error(fmt::format("variant '{}' given twice", variants[i]));
  return Status::ok();
}

Expected<KvCacheParams> variant_params(const std::string& name, const DiagnoseOptions& o) {
  KvCacheParams p = o.base;
  p.trace_path.clear();
  p.budget_fraction = o.budget_bytes > 0 ? 0.0 : o.budget;
  p.budget_bytes = o.budget_bytes;
  if (name == "R1" || name == "R2" || name == "R3" || name == "R4") {
    p.policy = "qevict";
    p.window = name == "R1" ? 1 : name == "R4" ? 32 : 8;
    if (name == "R1" || name == "R2") p.q = 0.0;
  } else if (name == "streaming" || name == "h2o") {
    p.policy = name;
    const KvCacheParams defaults;
    p.sink = defaults.sink;
    p.local = defaults.local;
    p.window = defaults.window;
    p.route_every = defaults.route_every;
    p.q = defaults.q;
    p.score = defaults.score;  // their own rules: --kv-score shapes R1–R4 only
    QEVICT_RETURN_IF_ERROR(apply_policy_defaults(&p, KvParamsGiven{}));
  } else {
    return Status::error(
        fmt::format("unknown variant '{}' (known: R1, R2, R3, R4, streaming, h2o)", name));
  }
  QEVICT_RETURN_IF_ERROR(p.validate());
  return p;
}

namespace {

using Clock = std::chrono::steady_clock;

// FullKV's attention: prompt queries summed per position, decode steps one row per step.
class Recorder final : public AttentionObserver {
 public:
  Recorder(int n_layers, int n_kv_heads, int64_t n_ctx)
      : nl_(n_layers),
        h_(n_kv_heads),
        n_ctx_(n_ctx),
        prefill_(size_t(n_layers) * n_ctx, 0.0),
        step_(size_t(n_layers)) {}
  void on_attention(int layer, int64_t n_keys, const float* probs) override {
    if (!decode_) {
      double* acc = prefill_.data() + size_t(layer) * n_ctx_;
      for (int h = 0; h < h_; ++h)
        for (int64_t p = 0; p < n_keys; ++p) acc[p] += double(probs[h * n_keys + p]) / h_;
      return;
    }
    step_[size_t(layer)].assign(probs, probs + size_t(h_) * n_keys);
    n_keys_ = n_keys;
  }
  void set_decode() { decode_ = true; }
  int64_t n_keys() const { return n_keys_; }
  // Step row of one KV head, or (head = -1) averaged over KV heads into `out`.
  const float* head_row(int layer, int h) const {
    return step_[size_t(layer)].data() + size_t(h) * n_keys_;
  }
  void avg_row(int layer, float* out) const {
    std::fill_n(out, n_keys_, 0.0f);
    for (int h = 0; h < h_; ++h) {
      const float* r = head_row(layer, h);
      for (int64_t p = 0; p < n_keys_; ++p) out[p] += r[p] / float(h_);
    }
  }
  const double* prefill_row(int layer) const { return prefill_.data() + size_t(layer) * n_ctx_; }

 private:
  int nl_, h_;
  int64_t n_ctx_;
  bool decode_ = false;
  std::vector<double> prefill_;           // [layer][n_ctx]
  std::vector<std::vector<float>> step_;  // [layer] -> [n_kv_heads][n_keys]
  int64_t n_keys_ = 0;
};

struct Snapshot {
  int64_t n_past = 0;
  std::vector<std::vector<Tier>> windows;   // [unit] window tiers
  std::vector<std::vector<double>> scores;  // [layer] window scores (tiered caches)
  double ledger_bytes_per_layer = 0.0;      // ledger copies held by windows in F
  int64_t promotions = 0, demotions = 0;    // totals so far
};

struct Variant {
  std::string name;
  KvCacheParams params;
  std::unique_ptr<SequenceKvCache> cache;
  TieredKvCache* tiered = nullptr;
  HeadKvCache* heads = nullptr;
  int sink = 0, unit = 1, units = 0;  // units: layers × (per-head ? KV heads : 1)
  bool per_head = false;
  std::vector<std::vector<Tier>> tiers;  // [unit] position tiers before the current step
  std::vector<float> logits;
  std::vector<double> fmm, fmm_q;
  TierMass mass;
  int64_t top1 = 0, compared = 0;
  double kl_sum = 0.0;
  int64_t last_events = 0;
  std::vector<Snapshot> snaps;
};

void snapshot(Variant& v, int n_layers, int n_kv_heads) {
  Snapshot s;
  s.n_past = v.cache->n_past();
  std::vector<Tier> pos;
  for (int u = 0; u < v.units; ++u) {
    const int l = v.per_head ? u / n_kv_heads : u, h = v.per_head ? u % n_kv_heads : 0;
    v.cache->position_tiers(l, h, &pos);
    s.windows.push_back(window_tiers(pos, v.sink, v.unit));
  }
  if (v.tiered) {
    s.scores.resize(size_t(n_layers));
    for (int l = 0; l < n_layers; ++l)
      for (int32_t w = 0; w < v.tiered->n_windows(l); ++w)
        s.scores[size_t(l)].push_back(v.tiered->window_score(l, w));
    const TierStats st = v.tiered->stats();
    double ledger = 0.0;
    for (const auto& ls : st.layers) {
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

// Σ of a position row over each window [sink + w·ω, sink + (w+1)·ω), w < n_windows.
template <typename T>
void window_sums(const T* row, int64_t n_pos, int sink, int omega, int64_t n_windows,
                 std::vector<double>* out) {
  out->assign(size_t(n_windows), 0.0);
  for (int64_t w = 0; w < n_windows; ++w)
    for (int64_t p = sink + w * omega; p < std::min<int64_t>(sink + (w + 1) * omega, n_pos); ++p)
      (*out)[size_t(w)] += double(row[p]);
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
  j["bytes_held"] = v.cache->bytes_held();
  j["routing_events"] = v.cache->routing_events();
  if (v.tiered) j["budget_bytes_per_layer"] = v.tiered->budget_bytes();
  if (v.heads) j["budget_bytes_per_layer"] = v.heads->budget_bytes();
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

  if (v.tiered) {
    const TierStats st = v.tiered->stats();
    int64_t aged = 0, young = 0, quantizations = 0;
    for (const auto& ls : st.layers) {
      aged += ls.aged;
      young += ls.evicted_at_first_routing;
      quantizations += ls.quantizations;
    }
    j["young_window_eviction"] = {{"aged", aged},
                                  {"evicted_at_first_routing", young},
                                  {"share", aged ? double(young) / double(aged) : 0.0}};
    j["capacity_full"] = st.capacity_full;
    j["capacity_quant"] = st.capacity_quant;
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
                   {"max_share_of_budget", led_max / double(v.tiered->budget_bytes())},
                   {"promotions_decode", promos},
                   {"demotions_decode", demos},
                   {"quantizations", quantizations},
                   {"per_event", per_event}};
  }

  // Score agreement: on the windows a variant holds in Q during a routing interval, the
  // score it accumulated from attention on low-bit keys vs FullKV's attention on the
  // same windows over the same steps.
  if (v.tiered && v.params.q > 0.0) {
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

// Oracle LIR in R3's geometry and F capacity: rank windows at each R3 routing event by
// FullKV attention — (a) received so far (the exact version of the online score, with no
// compression feedback), (b) received from then to the end of the run (hindsight).
json oracle_json(const Variant& r3, const Recorder& rec, const std::vector<float>& hist,
                 const DiagnoseOptions& o, int NL, int64_t n_ctx) {
  const int S = r3.params.sink, W = r3.params.window, L = r3.params.local;
  const int64_t K = r3.tiered->stats().capacity_full;
  std::vector<std::vector<double>> decode_total(size_t(NL), std::vector<double>(n_ctx, 0.0));
  for (int64_t t = 0; t < o.gen; ++t)
    for (int l = 0; l < NL; ++l) {
      const float* row = hist.data() + (size_t(t) * NL + l) * n_ctx;
      for (int64_t p = 0; p < n_ctx; ++p) decode_total[l][p] += row[p];
    }
  std::vector<std::vector<double>> cum(size_t(NL), std::vector<double>(n_ctx, 0.0));
  LirCounts lir_cum, lir_fut;
  std::vector<std::vector<std::vector<uint8_t>>> rows_cum(NL), rows_fut(NL);
  int64_t t_done = 0;  // decode steps folded into cum
  std::vector<double> pos_score(static_cast<size_t>(n_ctx)), wm;
  for (const auto& s : r3.snaps) {
    for (; t_done < s.n_past - o.prefill; ++t_done)
      for (int l = 0; l < NL; ++l) {
        const float* row = hist.data() + (size_t(t_done) * NL + l) * n_ctx;
        for (int64_t p = 0; p < n_ctx; ++p) cum[l][p] += row[p];
      }
    const int64_t n_cand = std::max<int64_t>(0, (s.n_past - L - S) / W);
    const bool has_future = o.gen - t_done >= r3.params.route_every;
    for (int l = 0; l < NL; ++l) {
      const double* pre = rec.prefill_row(l);
      for (int64_t p = 0; p < n_ctx; ++p) pos_score[p] = pre[p] + cum[l][p];
      window_sums(pos_score.data(), n_ctx, S, W, n_cand, &wm);
      rows_cum[l].push_back(top_k_membership(wm, n_cand, K));
      if (has_future) {
        for (int64_t p = 0; p < n_ctx; ++p) pos_score[p] = decode_total[l][p] - cum[l][p];
        window_sums(pos_score.data(), n_ctx, S, W, n_cand, &wm);
        rows_fut[l].push_back(top_k_membership(wm, n_cand, K));
      }
    }
  }
  for (int l = 0; l < NL; ++l) {
    lir_cum += lir_counts(rows_cum[l]);
    lir_fut += lir_counts(rows_fut[l]);
  }
  return {{"geometry", "R3"},
          {"capacity_full", K},
          {"cumulative", lir_json(lir_cum)},
          {"future", lir_json(lir_fut)}};
}

}  // namespace

Expected<json> run_diagnose(Model& model, ThreadPool& pool, const std::vector<int32_t>& prompt,
                            const DiagnoseOptions& o,
                            const std::function<void(int64_t, int64_t)>& progress,
                            std::vector<float>* fullkv_attention) {
  QEVICT_RETURN_IF_ERROR(o.validate());
  if (int64_t(prompt.size()) < o.prefill)
    return Status::error(
        fmt::format("the text has {} tokens, fewer than --prefill {}", prompt.size(), o.prefill));
  const auto t_start = Clock::now();
  const KvShape shape = model.kv_shape();
  const int NL = shape.n_layers, H = shape.n_kv_heads;
  const int32_t V = model.config().n_vocab;
  const int64_t n_ctx = o.prefill + o.gen;

  FullKvCache full(shape, n_ctx, o.base.dtype);
  Recorder rec(NL, H, n_ctx);
  QEVICT_RETURN_IF_ERROR(full.set_attention_observer(&rec));
  std::vector<Variant> vs;
  for (const auto& name : o.variants) {
    auto p = variant_params(name, o);
    if (!p) return p.status();
    auto c = make_kv_cache(shape, n_ctx, *p);
    if (!c) return Status::error(fmt::format("variant {}: {}", name, c.status().message()));
    Variant v;
    v.name = name;
    v.params = *p;
    v.cache = std::move(*c);
    v.tiered = dynamic_cast<TieredKvCache*>(v.cache.get());
    v.heads = dynamic_cast<HeadKvCache*>(v.cache.get());
    v.per_head = v.cache->per_head_tiers();
    v.sink = p->sink;
    v.unit = v.heads ? 1 : p->window;
    v.units = v.per_head ? NL * H : NL;
    v.tiers.resize(size_t(v.units));
    v.logits.resize(size_t(V));
    vs.push_back(std::move(v));
  }

  // Prefill: every cache gets the same prompt chunks in one batch.
  const int64_t n_chunks = (o.prefill + o.chunk - 1) / o.chunk;
  const int64_t total_calls = n_chunks + o.gen;
  std::vector<float> full_logits(static_cast<size_t>(V));
  for (int64_t c0 = 0, call = 0; c0 < o.prefill; c0 += o.chunk, ++call) {
    const int64_t n = std::min<int64_t>(o.chunk, o.prefill - c0);
    const bool last = c0 + n >= o.prefill;
    std::vector<BatchSegment> segs;
    segs.push_back({&full, prompt.data() + c0, n, false, full_logits.data()});
    for (auto& v : vs)
      segs.push_back(
          {v.cache.get(), prompt.data() + c0, n, false, last ? v.logits.data() : nullptr});
    QEVICT_RETURN_IF_ERROR(model.forward(segs, pool));
    if (progress) progress(call + 1, total_calls);
  }
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  for (auto& v : vs) {
    v.last_events = v.cache->routing_events();
    snapshot(v, NL, H);
  }
  auto compare = [&](Variant& v) {
    v.kl_sum += kl_divergence_logits(full_logits.data(), v.logits.data(), V);
    v.top1 += argmax(full_logits.data(), V) == argmax(v.logits.data(), V);
    ++v.compared;
  };
  for (auto& v : vs) compare(v);

  // Decode in lockstep: FullKV's greedy token goes to every cache.
  rec.set_decode();
  std::vector<float> hist(size_t(o.gen) * NL * n_ctx, 0.0f);  // [step][layer][pos] head-avg
  std::vector<int32_t> generated;
  std::vector<float> avg(static_cast<size_t>(n_ctx));
  int32_t tok = argmax(full_logits.data(), V);
  for (int64_t t = 0; t < o.gen; ++t) {
    generated.push_back(tok);
    for (auto& v : vs)
      for (int u = 0; u < v.units; ++u)
        v.cache->position_tiers(v.per_head ? u / H : u, v.per_head ? u % H : 0, &v.tiers[u]);
    std::vector<BatchSegment> segs;
    segs.push_back({&full, &tok, 1, false, full_logits.data()});
    for (auto& v : vs) segs.push_back({v.cache.get(), &tok, 1, false, v.logits.data()});
    QEVICT_RETURN_IF_ERROR(model.forward(segs, pool));
    const int64_t nk = rec.n_keys();
    std::vector<TierMass> step_mass(vs.size());
    for (int l = 0; l < NL; ++l) {
      rec.avg_row(l, avg.data());
      std::copy_n(avg.data(), nk, hist.data() + (size_t(t) * NL + l) * n_ctx);
      for (size_t i = 0; i < vs.size(); ++i) {
        Variant& v = vs[i];
        if (v.per_head) {
          for (int h = 0; h < H; ++h)
            step_mass[i] += mass_by_tier(rec.head_row(l, h), nk, v.tiers[size_t(l) * H + h])
                                .scaled(1.0 / (double(NL) * H));
        } else {
          step_mass[i] += mass_by_tier(avg.data(), nk, v.tiers[size_t(l)]).scaled(1.0 / NL);
        }
      }
    }
    for (size_t i = 0; i < vs.size(); ++i) {
      Variant& v = vs[i];
      v.fmm.push_back(step_mass[i].evicted);
      v.fmm_q.push_back(step_mass[i].evicted + step_mass[i].quant);
      v.mass += step_mass[i].scaled(1.0 / double(o.gen));
      compare(v);
      if (v.cache->routing_events() != v.last_events) {
        v.last_events = v.cache->routing_events();
        snapshot(v, NL, H);
      }
    }
    tok = argmax(full_logits.data(), V);
    if (progress) progress(n_chunks + t + 1, total_calls);
  }
  const double run_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (fullkv_attention) {
    fullkv_attention->assign(size_t(o.gen) * n_ctx, 0.0f);
    for (int64_t t = 0; t < o.gen; ++t)
      for (int l = 0; l < NL; ++l)
        for (int64_t p = 0; p < n_ctx; ++p)
          (*fullkv_attention)[size_t(t) * n_ctx + p] +=
              hist[(size_t(t) * NL + l) * n_ctx + p] / float(NL);
  }

  // ---- Metrics over the recorded traces ----
  json out;
  out["config"] = {{"prefill", o.prefill},
                   {"gen", o.gen},
                   {"chunk", o.chunk},
                   {"budget_fraction", o.budget_bytes > 0 ? 0.0 : o.budget},
                   {"budget_bytes", o.budget_bytes},
                   {"n_layers", NL},
                   {"n_kv_heads", H},
                   {"n_q_heads", shape.n_q_heads},
                   {"head_dim", shape.head_dim},
                   {"variants", o.variants},
                   {"threads", pool.size()}};
  out["full"] = {{"describe", full.describe()},
                 {"bytes_held", full.bytes_held()},
                 {"generated_tokens", generated}};
  out["seconds"] = {{"prefill", prefill_s}, {"total_lockstep", run_s}};

  // Tier-map layer: where R3 moved windows the most.
  int map_layer = o.map_layer;
  const Variant* r3 = nullptr;
  for (const auto& v : vs)
    if (v.name == "R3") r3 = &v;
  if (map_layer < 0 || map_layer >= NL) {
    map_layer = NL / 2;
    if (r3 && r3->tiered) {
      const TierStats st = r3->tiered->stats();
      int64_t best = -1;
      for (int l = 0; l < NL; ++l) {
        const int64_t moves = st.layers[l].promotions + st.layers[l].demotions;
        if (moves > best) best = moves, map_layer = l;
      }
    }
  }
  out["config"]["map_layer"] = map_layer;

  json jv = json::object();
  for (const auto& v : vs) jv[v.name] = variant_json(v, hist, o, NL, H, n_ctx, map_layer);
  out["variants"] = jv;

  if (r3 && r3->tiered) out["oracle"] = oracle_json(*r3, rec, hist, o, NL, n_ctx);

  // Ledger overhead under a workload built to oscillate (synthetic, no model).
  out["oscillation"] = {{"non_strict", oscillation_json(run_oscillation(false))},
                        {"strict", oscillation_json(run_oscillation(true))}};
  out["seconds"]["total"] = std::chrono::duration<double>(Clock::now() - t_start).count();
  return out;
}

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
