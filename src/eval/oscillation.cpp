// Oscillating workload for the ledger (see oscillation.h).
#include "eval/oscillation.h"

#include <cmath>
#include <random>

#include "eval/metrics.h"
#include "kvcache/budget.h"
#include "kvcache/factory.h"

namespace qevict::eval {

OscillationResult run_oscillation(bool strict, int decode_steps) {
  KvShape shape;
  shape.n_layers = 1;
  shape.n_q_heads = 1;
  shape.n_kv_heads = 1;
  shape.head_dim = 64;
  shape.rope.n_rot = 0;  // keys need no rotation: dot products depend on content only
  const int d = shape.head_dim, W = 8, n_prompt_windows = 16, S = 1;
  KvCacheParams p;
  p.policy = "qevict";
  p.window = W;
  p.route_every = 8;
  p.sink = S;
  p.local = 8;
  p.q = 0.7;
  p.strict_ledger = strict;
  const size_t token_bytes = shape.token_bytes(),
               m_f = size_t(W) * token_bytes + kWindowEntryBytes;  // M_f
  // B_hist such that K_f = floor(0.3 B_hist / M_f) = 4; the rest goes to Q.
  const size_t b_hist = size_t(std::ceil(4.5 * double(m_f) / (1.0 - p.q)));
  p.budget_bytes = int64_t(S * token_bytes + 2 * m_f + b_hist);
  const int64_t n_ctx = S + int64_t(n_prompt_windows) * W + decode_steps;
  auto made = make_kv_cache(shape, n_ctx, p);
  if (!made) return OscillationResult();  // cannot happen: the parameters above are valid
  SequenceKvCache& cache = **made;
  ThreadPool pool(1);
  KvReport rep;
  auto tiers_now = [&](std::vector<Tier>* pos) {
    cache.report(&rep, ReportDetail::kTiers);
    *pos = rep.position_tiers[0];
  };

  // Keys: the sink points along e_31; window w along e_w (constant within the window, so the
  // INT2 copy reconstructs it exactly and Q windows attend as strongly as F ones).
  // Decode tokens have zero keys. Values are random.
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(d)), k(static_cast<size_t>(d)),
      v(static_cast<size_t>(d)), out(static_cast<size_t>(d));
  auto step = [&](const std::vector<float>& key, const std::vector<float>& query) {
    for (auto& x : v) x = nd(rng);
    (void)cache.begin(1);
    cache.attend(0, query.data(), key.data(), v.data(), out.data(), pool);
    (void)cache.commit();  // QEvictPolicy's plans always fit
  };
  // The prompt, as one prefill chunk (routes at commit): its queries look at the sink.
  const int n_prompt = S + n_prompt_windows * W;
  std::vector<float> pq(size_t(n_prompt) * d, 0.0f), pk(size_t(n_prompt) * d, 0.0f),
      pv(size_t(n_prompt) * d), pout(size_t(n_prompt) * d);
  for (int t = 0; t < n_prompt; ++t) {
    pq[size_t(t) * d + d - 1] = 40.0f;
    pk[size_t(t) * d + (t < S ? d - 1 : ((t - S) / W) % (d - 1))] = 3.0f;
  }
  for (auto& x : pv) x = nd(rng);
  (void)cache.begin(n_prompt);
  cache.attend(0, pq.data(), pk.data(), pv.data(), pout.data(), pool);
  (void)cache.commit();

  OscillationResult r;
  r.strict = strict;
  cache.report(&rep);
  r.budget_bytes = rep.budget.total;
  r.window_full = rep.budget.window_full;
  r.window_quant = rep.budget.window_quant;
  r.capacity_full = rep.budget.capacity_full;
  r.capacity_quant = rep.budget.capacity_quant;
  std::vector<Tier> pos, prev_w;
  std::vector<double> churn;
  int64_t promos = rep.layers[0].promotions, demos = rep.layers[0].demotions;
  int64_t events = rep.routing_events;
  tiers_now(&pos);
  prev_w = window_tiers(pos, S, W);
  std::fill(k.begin(), k.end(), 0.0f);
  for (int t = 0; t < decode_steps; ++t) {
    // Query: every window now in Q, equally.
    tiers_now(&pos);
    const auto wt = window_tiers(pos, S, W);
    std::fill(q.begin(), q.end(), 0.0f);
    for (size_t w = 0; w < wt.size(); ++w)
      if (wt[w] == Tier::kQuant) q[w % size_t(d - 1)] = 20.0f;
    step(k, q);
    cache.report(&rep, ReportDetail::kTiers);
    if (rep.routing_events == events) continue;
    events = rep.routing_events;
    const KvLayerReport& ls = rep.layers[0];
    OscillationEvent e;
    e.n_past = cache.n_past();
    e.promotions = ls.promotions - promos;
    e.demotions = ls.demotions - demos;
    promos = ls.promotions;
    demos = ls.demotions;
    e.ledger_bytes_of_full = ls.bytes_ledger_of_full;
    e.budgeted_bytes = ls.bytes_budgeted;
    e.allocated_bytes = ls.bytes_allocated;
    r.events.push_back(e);
    r.promotions += e.promotions;
    r.demotions += e.demotions;
    r.max_ledger_bytes_of_full = std::max(r.max_ledger_bytes_of_full, e.ledger_bytes_of_full);
    r.max_budgeted_bytes = std::max(r.max_budgeted_bytes, e.budgeted_bytes);
    r.max_allocated_bytes = std::max(r.max_allocated_bytes, e.allocated_bytes);
    const auto now_w = window_tiers(rep.position_tiers[0], S, W);
    const double dj = jaccard_distance(prev_w, now_w, KeepSet::kFull, true);
    if (dj >= 0.0) churn.push_back(dj);
    prev_w = now_w;
  }
  cache.report(&rep);
  r.quantizations = rep.layers[0].quantizations;
  double s = 0.0;
  for (double x : churn) s += x;
  r.churn_full = churn.empty() ? 0.0 : s / double(churn.size());
  return r;
}

nlohmann::json oscillation_json(const OscillationResult& r) {
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : r.events)
    ev.push_back({{"n_past", e.n_past},
                  {"promotions", e.promotions},
                  {"demotions", e.demotions},
                  {"ledger_bytes_of_full", e.ledger_bytes_of_full},
                  {"budgeted_bytes", e.budgeted_bytes},
                  {"allocated_bytes", e.allocated_bytes}});
  return {{"strict", r.strict},
          {"budget_bytes", r.budget_bytes},
          {"window_full_bytes", r.window_full},
          {"window_quant_bytes", r.window_quant},
          {"capacity_full", r.capacity_full},
          {"capacity_quant", r.capacity_quant},
          {"promotions", r.promotions},
          {"demotions", r.demotions},
          {"quantizations", r.quantizations},
          {"max_ledger_bytes_of_full", r.max_ledger_bytes_of_full},
          {"max_ledger_share_of_budget", double(r.max_ledger_bytes_of_full) / r.budget_bytes},
          {"max_budgeted_bytes", r.max_budgeted_bytes},
          {"max_allocated_bytes", r.max_allocated_bytes},
          {"churn_full", r.churn_full},
          {"events", ev}};
}

}  // namespace qevict::eval
