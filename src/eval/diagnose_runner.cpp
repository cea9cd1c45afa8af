// The lockstep diagnostics runner (see diagnose.h): options, variants, and the run that
// records FullKV's attention and each variant's tiers; metrics live in diagnose_metrics.cpp,
// the oracle in diagnose_oracle.cpp, the markdown in diagnose_report.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "engine/perplexity.h"
#include "engine/prompt_drive.h"
#include "engine/sampling.h"
#include "eval/diagnose.h"
#include "eval/diagnose_internal.h"
#include "eval/metrics.h"
#include "eval/oscillation.h"
#include "kvcache/factory.h"
#include "kvcache/full_cache.h"
#include "kvcache/registry.h"

namespace qevict::eval {

using json = nlohmann::json;
using namespace detail;

Status DiagnoseOptions::validate() const {
  if (prefill < 1) return Status::error("--prefill must be at least 1 token");
  if (gen < 1) return Status::error("--gen must be at least 1 step");
  if (chunk < 1) return Status::error("the prefill chunk must be at least 1 token");
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
  } else if (const PolicyInfo* row = find_policy(name); row && row->kind != CacheKind::kFull) {
    // A registered policy with its authors' defaults: --kv-score etc. shape R1–R4 only.
    p.policy = name;
    const KvCacheParams defaults;
    p.sink = defaults.sink;
    p.local = defaults.local;
    p.window = defaults.window;
    p.route_every = defaults.route_every;
    p.q = defaults.q;
    p.score = defaults.score;
    // --prefill-route applies to every variant; the observation window only to windowed ones.
    if (row->kind != CacheKind::kWindowed) p.prefill_window = 0;
    if (row->kind == CacheKind::kQuantized) {  // a quantizer runs at its byte point
      p.budget_fraction = 0.0;
      p.budget_bytes = 0;
    }
    KvParamsGiven given;
    given.prefill_route = true;  // the run's --prefill-route, for every variant alike
    QEVICT_RETURN_IF_ERROR(apply_policy_defaults(&p, given));
  } else {
    std::string known = "R1, R2, R3, R4";
    for (const auto& r : policy_registry())
      if (r.kind != CacheKind::kFull) known += ", " + r.name;
    return Status::error(fmt::format("unknown variant '{}' (known: {})", name, known));
  }
  QEVICT_RETURN_IF_ERROR(p.validate());
  return p;
}

namespace {
using Clock = std::chrono::steady_clock;
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
  full.set_attention_observer(&rec);
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
    v.cache->report(&v.report, ReportDetail::kTiers);
    v.windowed = v.report.budget.kind == CacheKind::kWindowed;
    v.per_head = v.report.per_head;
    v.sink = v.report.budget.sink;
    v.unit = v.report.unit_tokens;
    v.units = v.per_head ? NL * H : NL;
    v.tiers.resize(size_t(v.units));
    v.logits.resize(size_t(V));
    vs.push_back(std::move(v));
  }

  // Prefill: every cache gets the same prompt chunks in one batch.
  const int64_t n_chunks = (o.prefill + o.chunk - 1) / o.chunk;
  const int64_t total_calls = n_chunks + o.gen;
  std::vector<float> full_logits(static_cast<size_t>(V));
  std::vector<PromptFeed> feeds;
  feeds.push_back({&full, prompt.data(), o.prefill, full_logits.data(), false, true});
  for (auto& v : vs) feeds.push_back({v.cache.get(), prompt.data(), o.prefill, v.logits.data()});
  // The prompt is in: variants with --prefill-route end compress at its end (SPEC §4).
  QEVICT_RETURN_IF_ERROR(
      prefill_prompts(model, feeds, o.chunk, pool, true, [&](int64_t call, int64_t, int64_t) {
        if (progress) progress(call + 1, total_calls);
        return Status::ok();
      }));
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  for (auto& v : vs) {
    snapshot(v, NL);
    v.last_events = v.report.routing_events;
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
    for (auto& v : vs) {
      v.cache->report(&v.report, ReportDetail::kTiers);
      v.tiers = std::move(v.report.position_tiers);  // the report is refreshed before its next use
    }
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
      KvReport now;
      v.cache->report(&now);
      if (now.routing_events != v.last_events) {
        snapshot(v, NL);
        v.last_events = v.report.routing_events;
      }
    }
    tok = argmax(full_logits.data(), V);
    if (progress) progress(n_chunks + t + 1, total_calls);
  }
  const double run_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  for (auto& v : vs) v.cache->report(&v.report, ReportDetail::kTiers);  // end-of-run figures
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
    if (r3 && r3->windowed) {
      const auto& layers = r3->report.layers;
      int64_t best = -1;
      for (int l = 0; l < NL; ++l) {
        const int64_t moves = layers[l].promotions + layers[l].demotions;
        if (moves > best) best = moves, map_layer = l;
      }
    }
  }
  out["config"]["map_layer"] = map_layer;

  json jv = json::object();
  for (const auto& v : vs) jv[v.name] = variant_json(v, hist, o, NL, H, n_ctx, map_layer);
  out["variants"] = jv;

  if (r3 && r3->windowed) out["oracle"] = oracle_json(*r3, rec, hist, o, NL, n_ctx);

  // Ledger overhead under a workload built to oscillate (synthetic, no model).
  out["oscillation"] = {{"non_strict", oscillation_json(run_oscillation(false))},
                        {"strict", oscillation_json(run_oscillation(true))}};
  out["seconds"]["total"] = std::chrono::duration<double>(Clock::now() - t_start).count();
  return out;
}

}  // namespace qevict::eval
