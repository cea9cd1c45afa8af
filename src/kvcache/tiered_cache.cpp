// TieredKvCache (see tiered_cache.h).
#include "kvcache/tiered_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>

namespace qevict {

TieredKvCache::TieredKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                             const KvBudget& budget, std::unique_ptr<RoutingPolicy> policy,
                             std::unique_ptr<RoutingObserver> trace)
    : shape_(shape),
      n_ctx_(n_ctx),
      p_(params),
      budget_(budget),
      base_p_(params),
      base_budget_(budget),
      policy_(std::move(policy)),
      qlayout_(quant_layout(p_, shape)),
      // Only low-bit windows need the table (their keys are stored before RoPE), and a staged
      // prompt's: a cache without a Q tier (StreamingLLM, two-tier) holds none until
      // --kv-adapt gives it the coverage tier (adapt_tier).
      rope_(budget.capacity_quant > 0 || params.prefill_route == PrefillRoute::kStaged
                ? RopeTable(shape.rope, shape.head_dim, n_ctx)
                : RopeTable()),
      store_(shape, budget, qlayout_, p_.dtype, &rope_),
      trace_(std::move(trace)),
      sched_(p_.prefill_route, p_.route_every),
      obs_q_(shape.n_layers, p_.prefill_window, shape.q_width()) {}

Status TieredKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  n_new_ = n_new;
  return Status::ok();
}

void TieredKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                           ThreadPool& pool) {
  const int H = shape_.n_kv_heads, kvw = shape_.kv_width();
  for (int64_t t = 0; t < n_new_; ++t)
    store_.store_token(layer, n_past_ + t, k + t * kvw, v + t * kvw);
  store_.attention_blocks(layer, n_past_ + n_new_, &blocks_, &block_window_);
  const int64_t nb = int64_t(block_window_.size());
  const FusedAttnParams fp = fused_params();
  mass_.assign(size_t(nb), 0.0);
  attend_shared_blocks(fp, H, q, shape_.q_width(), n_new_, n_past_, blocks_.data(), nb, out,
                       mass_.data(), MassLayout::kSumOverHeads, attn_, pool);
  if (tier_mass_) report_tier_mass(layer);
  if (observing()) {
    if (p_.adapt > 0.0 && focus_.empty())  // the first prompt's every query (PromptFocus::kl)
      for (int64_t b = 0; b < nb; ++b)
        add_generic(layer, block_window_[size_t(b)], mass_[size_t(b)]);
    return observe(layer, q, pool);
  }
  // S̄(w) += (1/H_q) Σ_h Σ_τ Σ_{i∈w} a_τ^h(i): masses were summed over heads and tokens.
  const double inv_hq = 1.0 / shape_.n_q_heads;
  store_.add_scores(layer, block_window_.data(), mass_.data(), nb, inv_hq);
}

void TieredKvCache::report_tier_mass(int layer) const {
  double by_tier[4] = {0.0, 0.0, 0.0, 0.0};
  for (size_t b = 0; b < block_window_.size(); ++b) {
    const int32_t id = block_window_[b];
    const Tier t = id < 0 ? Tier::kLocal : store_.window(layer, id).tier;
    by_tier[int(t)] += mass_[b] / shape_.n_q_heads;
  }
  tier_mass_->on_tier_mass(layer, n_past_ + n_new_, by_tier);
}

void TieredKvCache::append_prompt(int layer, const float* q, const float* k, const float* v,
                                  const PromptExtras& x) {
  (void)q;
  const double* mass = x.mass;
  const int H = shape_.n_kv_heads, kvw = shape_.kv_width();
  for (int64_t t = 0; t < n_new_; ++t)
    store_.store_token(layer, n_past_ + t, k + t * kvw, v + t * kvw);
  const bool generic = x.all_mass && focus_.empty();
  if (!mass && !generic) return;
  // The masses attend() would have summed per block (kSumOverHeads), position by position;
  // an observation window's replace the scores, as observe() does.
  store_.attention_blocks(layer, n_past_ + n_new_, &blocks_, &block_window_);
  const int64_t n = n_past_ + n_new_;
  auto block_sum = [&](const double* m, size_t b) {
    double s = 0.0;
    for (int h = 0; h < H; ++h)
      for (int64_t i = blocks_[b].pos0; i < blocks_[b].pos0 + blocks_[b].n; ++i) s += m[h * n + i];
    return s;
  };
  if (generic)  // as attend() gathers them (PromptFocus::kl)
    for (size_t b = 0; b < block_window_.size(); ++b)
      add_generic(layer, block_window_[b], block_sum(x.all_mass, b));
  if (!mass) return;
  if (p_.prefill_window > 0) store_.reset_scores(layer);
  const double inv_hq = 1.0 / shape_.n_q_heads;
  for (size_t b = 0; b < block_window_.size(); ++b)
    store_.add_score(layer, block_window_[b], block_sum(mass, b) * inv_hq);
}

void TieredKvCache::add_generic(int layer, int32_t id, double mass) {
  if (id < 0) return;  // the sink
  if (generic_.empty()) generic_.resize(size_t(shape_.n_layers));
  std::vector<double>& g = generic_[size_t(layer)];
  if (size_t(id) >= g.size()) g.resize(size_t(id) + 1, 0.0);
  g[size_t(id)] += mass;
}

FusedAttnParams TieredKvCache::fused_params() const {
  FusedAttnParams fp = FusedAttnParams::make(p_.dtype, shape_.group(), shape_.head_dim);
  fp.qlayout = &qlayout_;
  fp.rope = &rope_;
  return fp;
}

void TieredKvCache::observe(int layer, const float* q, ThreadPool& pool) {
  // SnapKV's observation window (tiered_cache.h): the last N queries of the prompt so far,
  // which may span this call and earlier ones.
  const int64_t qw = shape_.q_width();
  obs_q_.allocate();
  obs_q_.keep(layer, q, n_new_);
  const float* ring = obs_q_.rows(layer);
  const int64_t n_obs = obs_q_.held_after(n_new_);
  // The window's queries sit at positions [n_past + n_new − n_obs, n_past + n_new): causal
  // attention over the blocks of the whole cache (attention_blocks already covers them).
  const int64_t nb = int64_t(block_window_.size());
  const FusedAttnParams fp = fused_params();
  obs_out_.resize(size_t(n_obs) * qw);
  mass_.assign(size_t(nb), 0.0);
  attend_shared_blocks(fp, shape_.n_kv_heads, ring, qw, n_obs, n_past_ + n_new_ - n_obs,
                       blocks_.data(), nb, obs_out_.data(), mass_.data(), MassLayout::kSumOverHeads,
                       attn_, pool);
  store_.reset_scores(layer);
  const double inv_hq = 1.0 / shape_.n_q_heads;
  store_.add_scores(layer, block_window_.data(), mass_.data(), nb, inv_hq);
}

bool TieredKvCache::route_layers_parallel(std::vector<Status>* st) {
  ThreadPool* pool = route_threads_.pool();
  if (pool == nullptr || trace_ || shape_.n_layers < 2) return false;
  if (!route_threads_.prepare(*policy_, pool->size())) return false;
  st->assign(size_t(shape_.n_layers), Status::ok());
  std::atomic<int> next{0};
  pool->run([&](int t) {
    const RoutingThreads::Slot s = route_threads_.slot(t, *policy_, request_, plan_);
    for (int l; (l = next.fetch_add(1)) < shape_.n_layers;)  // layers differ in work
      (*st)[size_t(l)] = route_layer(l, s.policy, s.request, s.plan);
  });
  return true;
}

Status TieredKvCache::route_layer(int l, RoutingPolicy& pol, RoutingRequest& req,
                                  RoutingPlan& plan) {
  store_.candidates(l, n_past_, &req);
  req.scores_from = scores_from_;
  pol.plan(req, &plan);
  const Status s = store_.apply(l, req, plan);
  if (!s) return Status::error(fmt::format("{} policy, layer {}: {}", pol.name(), l, s.message()));
  return s;
}

Status TieredKvCache::route_event(bool decode) {
  sched_.event_begin(n_past_, decode, trace_.get());
  std::vector<Status> st;
  if (route_layers_parallel(&st)) {
    for (const Status& s : st) QEVICT_RETURN_IF_ERROR(s);
  } else {
    for (int l = 0; l < shape_.n_layers; ++l) {
      QEVICT_RETURN_IF_ERROR(route_layer(l, *policy_, request_, plan_));
      if (trace_) trace_->on_layer_routed(sched_.events(), n_past_, l, store_);
    }
  }
  sched_.event_end(trace_.get());
  return Status::ok();
}

Status TieredKvCache::route() {
  if (sched_.prompt_pending()) return route_prompt();
  return route_event(false);
}

Status TieredKvCache::route_prompt() {
  sched_.prompt_routed();
  if (p_.prefill_window > 0) {
    // Scores now hold the observation window's mass only (observe()); the age ranking
    // divides by the queries that made them.
    scores_from_ = n_past_ - obs_q_.held();
    obs_q_.release();  // held only while the prompt is read
    std::vector<float>().swap(obs_out_);
    if (focus_.empty()) {
      measure_focus();
      if (p_.adapt > 0.0 && adapted_ < 0) adapt_tier();
    }
  }
  const Status st = route_event(false);
  trim_scratch();  // sized by the whole prompt's windows
  return st;
}

void TieredKvCache::measure_focus() {
  // The scores are the observation window's masses (observe(), or a replay's
  // append_prompt): per window, the probability its queries gave it, summed over the queries
  // and averaged over query heads. The window is the prompt's last prefill_window queries.
  const double n_obs = double(std::min<int64_t>(p_.prefill_window, n_past_));
  if (!(n_obs > 0)) return;
  focus_.assign(size_t(shape_.n_layers), PromptFocus{});
  std::vector<double> m, far;
  for (int l = 0; l < shape_.n_layers; ++l) {
    store_.candidates(l, n_past_, &request_);  // the aged windows: neither sink nor local
    m.clear();
    far.clear();
    for (const RoutingCandidate& c : request_.candidates) {
      m.push_back(c.score);
      if (c.pos0 + p_.window <= n_past_ - kFocusFarTokens) far.push_back(c.score);
    }
    std::sort(m.begin(), m.end(), std::greater<double>());
    std::sort(far.begin(), far.end(), std::greater<double>());
    PromptFocus& f = focus_[size_t(l)];
    for (size_t i = 0; i < m.size(); ++i) {
      f.history += m[i];
      if (i < 1) f.top1 += m[i];
      if (i < 4) f.top4 += m[i];
      if (i < 16) f.top16 += m[i];
    }
    for (size_t i = 0; i < far.size() && i < 4; ++i) f.far4 += far[i];
    if (size_t(l) < generic_.size() && !generic_[size_t(l)].empty() && f.history > 0) {
      const std::vector<double>& g = generic_[size_t(l)];
      double gsum = 0.0;
      auto per_query = [&](const RoutingCandidate& c) {
        const double seen = double(std::max<int64_t>(1, n_past_ - c.pos0));
        return size_t(c.id) < g.size() ? g[size_t(c.id)] / seen : 0.0;
      };
      for (const RoutingCandidate& c : request_.candidates) gsum += per_query(c);
      if (gsum > 0)
        for (const RoutingCandidate& c : request_.candidates) {
          const double pw = c.score / f.history, gw = per_query(c) / gsum;
          if (pw > 0) f.kl += pw * std::log(pw / std::max(gw, 1e-12));
        }
    }
    f.history /= n_obs, f.top1 /= n_obs, f.top4 /= n_obs, f.top16 /= n_obs, f.far4 /= n_obs;
  }
  std::vector<std::vector<double>>().swap(generic_);
}

void TieredKvCache::adapt_tier() {
  adapted_ = 0;
  if (focus_score(focus_) >= p_.adapt) return;  // a question about the text is in view
  auto t = tier_setup(true);
  if (!t || t->budget.total != budget_.total) return;  // e.g. a floored budget: keep the configured
  if (!store_.relayout(t->budget, t->layout)) return;
  if (rope_.bytes() == 0) rope_ = RopeTable(shape_.rope, shape_.head_dim, n_ctx_);  // the store's
  p_ = t->p;
  budget_ = t->budget;
  qlayout_ = t->layout;
  adapted_ = 1;
}

Expected<TieredKvCache::TierSetup> TieredKvCache::tier_setup(bool coverage) const {
  if (!coverage) return TierSetup{base_p_, base_budget_, quant_layout(base_p_, shape_)};
  KvCacheParams c = coverage_params(base_p_);
  c.adapt = base_p_.adapt;
  auto b = compute_budget(CacheKind::kWindowed, shape_, n_ctx_, c);
  if (!b) return b.status();
  return TierSetup{c, *b, quant_layout(c, shape_)};
}

Status TieredKvCache::end_prompt() {
  if (!sched_.prompt_pending()) return Status::ok();
  return route_prompt();
}

Status TieredKvCache::commit_alone(ThreadPool& pool) {
  return route_threads_.with_pool(pool, [&] { return commit(); });
}

Status TieredKvCache::end_prompt_alone(ThreadPool& pool) {
  return route_threads_.with_pool(pool, [&] { return end_prompt(); });
}

Status TieredKvCache::commit() {
  if (observing()) obs_q_.commit(n_new_);
  const int64_t n = n_new_;
  n_past_ += n_new_;
  n_new_ = 0;
  // Routing events (SPEC §1): after every prefill chunk and every Ω decode steps; with
  // --prefill-route end the prompt is held and routed at end_prompt() or, for callers that do
  // not say, at the first decode step (the paper's code compresses there); with staged the
  // same, its chunks' aged windows quantized meanwhile.
  switch (sched_.on_commit(n, bytes_held())) {
    case RoutingSchedule::Due::kHoldPrompt:
      trim_scratch();
      return Status::ok();
    case RoutingSchedule::Due::kStagePrompt:
      stage_prompt();
      trim_scratch();
      return Status::ok();
    case RoutingSchedule::Due::kPrompt:
      return route_prompt();
    case RoutingSchedule::Due::kChunk: {
      const Status st = route_event(false);
      trim_scratch();  // a chunk's scratch is far larger than decode's
      return st;
    }
    case RoutingSchedule::Due::kDecode:
      return route_event(true);
    case RoutingSchedule::Due::kNothing:
      break;
  }
  return Status::ok();
}

void TieredKvCache::stage_prompt() {
  // Aged windows stay in 16 bits while all of them would fit in F (the policy keeps them
  // all there then: QEvictPolicy's "every candidate fits" rule), so a prompt within the
  // budget is routed from exact copies, as with end.
  const RoutingBudget b = budget_.routing();
  const int64_t hold = int64_t((b.full_bytes + b.quant_bytes) / b.window_full);
  for (int l = 0; l < shape_.n_layers; ++l) store_.stage(l, n_past_, hold);
}

void TieredKvCache::trim_scratch() {
  attn_.trim();
  std::vector<double>().swap(mass_);
  std::vector<KvBlockRef>().swap(blocks_);
  std::vector<int32_t>().swap(block_window_);
  std::vector<RoutingCandidate>().swap(request_.candidates);
  std::vector<PlanEntry>().swap(plan_.entries);
  route_threads_.free_scratch();
}

void TieredKvCache::clear() {
  if (adapted_ == 1) {  // back to the configured tier (nothing has a low-bit copy after clear)
    TierSetup t = *tier_setup(false);
    p_ = t.p;
    budget_ = t.budget;
    qlayout_ = t.layout;
    store_ = WindowStore(shape_, budget_, qlayout_, p_.dtype, &rope_);
    if (budget_.capacity_quant == 0 && p_.prefill_route != PrefillRoute::kStaged)
      rope_ = RopeTable();  // as the constructor: no Q tier, no table
  }
  adapted_ = -1;
  focus_.clear();
  generic_.clear();
  store_.clear();
  sched_.reset();
  n_past_ = n_new_ = 0;
  scores_from_ = 0;
  obs_q_.release();
  std::vector<float>().swap(obs_out_);
}

size_t TieredKvCache::bytes_held() const {
  // Everything the object holds: the fixed-size RoPE table, the store (pools, sinks, window
  // entries), attention and routing scratch (bounded by the kept windows and the batch).
  size_t generic = generic_.capacity() * sizeof(std::vector<double>);
  for (const auto& g : generic_) generic += g.capacity() * sizeof(double);
  const size_t routing = request_.candidates.capacity() * sizeof(RoutingCandidate) +
                         plan_.entries.capacity() * sizeof(PlanEntry) + route_threads_.bytes();
  return sizeof(*this) + rope_.bytes() + store_.bytes_allocated() + attn_.bytes() +
         mass_.capacity() * sizeof(double) + blocks_.capacity() * sizeof(KvBlockRef) +
         block_window_.capacity() * sizeof(int32_t) + routing + obs_q_.bytes() +
         obs_out_.capacity() * sizeof(float) + generic;
}

std::string TieredKvCache::describe() const {
  // How windows are ranked, when it is not the paper's Eq. 1 sum: the prompt-end
  // observation window (--prefill-window) and its pooling, or age-normalised scores.
  std::string scoring;
  if (p_.prefill_window > 0 && p_.defers_prompt())
    scoring = fmt::format("prompt-end window of {} queries", p_.prefill_window);
  if (p_.prefill_route == PrefillRoute::kStaged)
    scoring += fmt::format("{}prompt staged in Q", scoring.empty() ? "" : ", ");
  if (p_.pool > 0)
    scoring += fmt::format("{}max-pooled with {} windows {}", scoring.empty() ? "" : ", ", p_.pool,
                           p_.pool_side == PoolSide::kAfter ? "before" : "either side");
  if (p_.score == ScoreMode::kAge)
    scoring += fmt::format("{}age-normalised scores", scoring.empty() ? "" : ", ");
  if (p_.adapt > 0.0) {
    const double f = focus_score(focus_);
    scoring += scoring.empty() ? "" : ", ";
    scoring += adapted_ < 0 ? fmt::format("coverage tier if focus < {:g} nats", p_.adapt)
               : adapted_ == 1
                   ? fmt::format("coverage tier: focus {:.3f} < {:g} nats", f, p_.adapt)
                   : fmt::format("configured tier: focus {:.3f} >= {:g} nats", f, p_.adapt);
  }
  if (!scoring.empty()) scoring = " (" + scoring + ")";
  return fmt::format(
      "{}{} (budget {:.1f} KiB/layer{}, K_f {} K_q {}, ω {}, Ω {}, S {}, L {}, INT{}, M_f {} B, "
      "M_q {} B)",
      policy_->name(), scoring, budget_.total / 1024.0, budget_.floor_tag(), budget_.capacity_full,
      budget_.capacity_quant, p_.window, p_.route_every, p_.sink, p_.local,
      qlayout_.vb() == qlayout_.kb()
          ? fmt::format("{}", qlayout_.kb())
          : fmt::format("{} keys, INT{} values", qlayout_.kb(), qlayout_.vb()),
      budget_.window_full, budget_.window_quant);
}

void TieredKvCache::report(KvReport* out, ReportDetail detail) const {
  *out = routed_report(p_.policy, describe(), budget_, bytes_held(), sched_.peak_bytes(),
                       sched_.events(), sched_.clock().seconds, sched_.clock().seconds_decode);
  out->quantize_seconds = store_.quantize_seconds();
  out->promote_seconds = store_.promote_seconds();
  out->unit_tokens = p_.window;
  out->prompt_focus = focus_;
  if (p_.adapt > 0.0 && adapted_ >= 0) out->adapted = adapted_ == 1 ? "coverage" : "configured";
  for (int l = 0; l < shape_.n_layers; ++l) out->layers.push_back(store_.layer_report(l));
  if (detail != ReportDetail::kTiers) return;
  out->position_tiers.resize(size_t(shape_.n_layers));
  out->window_scores.resize(size_t(shape_.n_layers));
  for (int l = 0; l < shape_.n_layers; ++l) {
    store_.position_tiers(l, n_past_, &out->position_tiers[size_t(l)]);
    auto& sc = out->window_scores[size_t(l)];
    for (int32_t w = 0; w < store_.n_windows(l); ++w) sc.push_back(store_.window(l, w).score);
  }
}

}  // namespace qevict
