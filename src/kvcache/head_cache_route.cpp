// HeadKvCache's routing (see head_cache.h): when (the RoutingSchedule), the request each
// layer or head gives its policy, the plan's check, and the compaction that applies it.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/ref/dequant.h"
#include "kernels/softmax_state.h"
#include "kvcache/head_cache.h"
#include "kvcache/head_cache_util.h"
#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

using namespace head_cache_detail;  // NOLINT: this class's own helpers

Status HeadKvCache::route_head(HeadStore& s, RoutingPolicy& pol, RoutingRequest& req,
                               RoutingPlan& plan, int64_t* evicted) {
  // Candidates: kept tokens that are neither sink (pos < S) nor recent (pos >= n_past - L).
  const int64_t hi = n_past_ - budget_.local;
  const int64_t first = std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
  const int64_t n = s.n();
  req.n_past = n_past_;
  req.budget = budget_.routing();
  req.candidates.clear();
  for (int64_t i = first; i < n && s.pos[i] < hi; ++i)
    req.candidates.push_back({s.pos[i], s.pos[i], s.score[i],
                              s.pos[i] < routed_below_ ? Tier::kFull : Tier::kLocal, false});
  if (req.candidates.empty()) return Status::ok();
  pol.plan(req, &plan);
  QEVICT_RETURN_IF_ERROR(check_plan(req, plan));
  for (const PlanEntry& e : plan.entries)
    if (e.to == Tier::kQuant)
      return Status::error(
          fmt::format("{} sends token {} to a low-bit tier this cache lacks", pol.name(), e.id));
  *evicted += compact(s, first, plan.entries.data(), int64_t(req.candidates.size()));
  return Status::ok();
}

bool HeadKvCache::route_heads_parallel(Status* st) {
  ThreadPool* pool = route_threads_.pool();
  if (pool == nullptr || heads_.size() < 2) return false;
  const int T = pool->size();
  if (!route_threads_.prepare(*policy_, T)) return false;
  std::vector<Status> status(size_t(T), Status::ok());
  std::vector<int64_t> evicted(size_t(T), 0);
  std::atomic<size_t> next{0};
  pool->run([&](int t) {
    const RoutingThreads::Slot s = route_threads_.slot(t, *policy_, request_, plan_);
    for (size_t i; (i = next.fetch_add(1)) < heads_.size();) {
      status[size_t(t)] = route_head(heads_[i], s.policy, s.request, s.plan, &evicted[size_t(t)]);
      if (!status[size_t(t)]) return;
    }
  });
  *st = Status::ok();
  for (int t = 0; t < T; ++t) {
    evictions_ += evicted[size_t(t)];
    if (!status[size_t(t)] && *st) *st = status[size_t(t)];
  }
  route_threads_.free_scratch();  // between events, as request_'s
  return true;
}

Status HeadKvCache::commit_alone(ThreadPool& pool) {
  return route_threads_.with_pool(pool, [&] { return commit(); });
}

Status HeadKvCache::end_prompt_alone(ThreadPool& pool) {
  return route_threads_.with_pool(pool, [&] { return end_prompt(); });
}

Status HeadKvCache::layer_request(int layer, bool inputs) {
  const int H = shape_.n_kv_heads;
  const int64_t hi = n_past_ - budget_.local;
  request_.n_past = n_past_;
  request_.layer = layer;
  request_.n_layers = shape_.n_layers;
  request_.n_heads = H;
  request_.group = shape_.group();
  request_.n_obs = 0;
  request_.head_begin.resize(size_t(H) + 1);
  request_.candidates.clear();
  request_.head_begin[0] = 0;
  for (int h = 0; h < H; ++h) {
    const HeadStore& s = head(layer, h);
    const int64_t first =
        std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
    for (int64_t i = first; i < s.n() && s.pos[i] < hi; ++i)
      request_.candidates.push_back({s.pos[i], s.pos[i], s.score.empty() ? 0.0 : s.score[i],
                                     s.pos[i] < routed_below_ ? Tier::kFull : Tier::kLocal, false,
                                     h});
    request_.head_begin[size_t(h) + 1] = int64_t(request_.candidates.size());
  }
  // The layer's budget: the policy's share of the history tokens (uniform: H × K).
  const int64_t n_hist = std::max<int64_t>(0, n_past_ - budget_.sink - budget_.local);
  const int64_t tokens = std::max<int64_t>(
      0, policy_->layer_budget(layer, shape_.n_layers, H, budget_.head_heavy, n_hist));
  request_.budget = budget_.routing();
  request_.budget.full_bytes = size_t(tokens) * budget_.head_token_bytes;
  request_.obs.clear();
  request_.value_norm.clear();
  if (!inputs || request_.candidates.empty()) return Status::ok();
  if (needs_.obs_window > 0) observe(layer);
  if (needs_.value_norms) QEVICT_RETURN_IF_ERROR(value_norms(layer));
  return Status::ok();
}

Status HeadKvCache::route_layer(int layer) {
  const int H = shape_.n_kv_heads;
  QEVICT_RETURN_IF_ERROR(layer_request(layer, !needs_.cross_layer));
  if (request_.candidates.empty()) return Status::ok();
  policy_->plan(request_, &plan_);
  QEVICT_RETURN_IF_ERROR(check_plan(request_, plan_));
  for (const PlanEntry& e : plan_.entries)
    if (e.to == Tier::kQuant)
      return Status::error(fmt::format("{} sends token {} to a low-bit tier this cache lacks",
                                       policy_->name(), e.id));
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const int64_t first =
        std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
    evictions_ += compact(s, first, plan_.entries.data() + request_.head_begin[size_t(h)],
                          request_.n_cand(h));
  }
  return Status::ok();
}

Status HeadKvCache::route() { return route_event(false); }

Status HeadKvCache::route_event(bool decode) {
  sched_.event_begin(n_past_, decode);
  const size_t steady = size_t(steady_tokens_), d = size_t(shape_.head_dim);
  if (needs_.per_layer) {
    const int L = shape_.n_layers, H = shape_.n_kv_heads;
    const int64_t total = int64_t(L) * H * budget_.head_heavy;  // history tokens, all layers
    if (needs_.cross_layer) {
      // Every layer's scores first: the policy shares the whole cache's budget among them.
      for (int l = 0; l < L; ++l) {
        QEVICT_RETURN_IF_ERROR(layer_request(l, true));
        request_.budget.full_bytes = size_t(H) * budget_.head_heavy * budget_.head_token_bytes;
        policy_->prepare(request_);
      }
      policy_->prepare_done(total);
    }
    // The layers' budgets (a policy may shift tokens between layers, never add any).
    const int64_t n_hist = std::max<int64_t>(0, n_past_ - budget_.sink - budget_.local);
    int64_t sum = 0;
    for (int l = 0; l < L; ++l)
      sum += std::max<int64_t>(0, policy_->layer_budget(l, L, H, budget_.head_heavy, n_hist));
    if (sum > total)
      return Status::error(
          fmt::format("{} gives the layers {} history tokens, more than {} layers x {} heads x {}",
                      policy_->name(), sum, L, H, budget_.head_heavy));
    for (int l = 0; l < shape_.n_layers; ++l) QEVICT_RETURN_IF_ERROR(route_layer(l));
    std::vector<float>().swap(wo_f32_);
  } else {
    Status st;
    if (route_heads_parallel(&st)) {
      QEVICT_RETURN_IF_ERROR(st);
    } else {
      for (HeadStore& s : heads_)
        QEVICT_RETURN_IF_ERROR(route_head(s, *policy_, request_, plan_, &evictions_));
    }
  }
  const int64_t omega = std::max(p_.route_every, 1);
  for (HeadStore& s : heads_) {
    // After a prefill chunk the vectors hold its peak; give back what decode will not use.
    // Head-adaptive budgets: each head keeps room for what it holds plus Ω decode tokens.
    if (needs_.per_layer) s.cap = std::min<int64_t>(s.n() + omega, n_ctx_);
    const size_t cap = size_t(s.cap);
    trim(s.k, cap * d);
    trim(s.v, cap * d);
    trim(s.pos, cap);
    trim(s.score, cap);
    trim(s.nu, cap);
    // The decode observation window restarts: the next event sees the queries after this one.
    std::fill(s.osum.begin(), s.osum.end(), 0.0f);
    std::fill(s.omax.begin(), s.omax.end(), 0.0f);
    trim(s.osum, cap * size_t(shape_.group()));
    trim(s.omax, cap);
  }
  obs_acc_ = 0;
  // Scratch is rebuilt before every use. The routing request (candidates, the observation
  // window's attention, value norms) and the plan are used only here: freed until the next
  // routing event (the largest, obs, is w × group floats per kept token). The attention
  // scratch every decode step uses keeps room for decode and gives back a prompt's peak.
  auto free_scratch = [](auto& v) { std::remove_reference_t<decltype(v)>().swap(v); };
  auto trim_scratch = [](auto& v, size_t cap) {
    v.clear();
    trim(v, cap);
  };
  free_scratch(obs_ml_);
  free_scratch(probs_);  // a prompt-end event's rows cover the prompt
  free_scratch(pool_in_);
  free_scratch(pool_out_);
  free_scratch(request_.obs);
  free_scratch(request_.obs_max);
  free_scratch(request_.value_norm);
  free_scratch(request_.candidates);
  free_scratch(plan_.entries);
  trim_scratch(mass_, size_t(shape_.n_kv_heads) * steady);
  trim_scratch(blocks_, size_t(shape_.n_kv_heads) * steady);
  sched_.event_end();
  sched_.prompt_routed();
  routed_below_ = std::max<int64_t>(n_past_ - budget_.local, 0);
  return Status::ok();
}

Status HeadKvCache::commit() {
  const int64_t n = n_new_;
  n_past_ += n_new_;
  if (needs_.obs_window > 0 && !obs_decode_) obs_q_.commit(n_new_);
  if (obs_decode_) obs_acc_ += n_new_;
  n_new_ = 0;
  // Routing events: after every prefill chunk and every Ω decode steps (as TieredKvCache);
  // with --prefill-route end, once when the prompt is complete (at end_prompt(), or at the
  // first decode step for callers that do not say).
  const RoutingSchedule::Due due = sched_.on_commit(n, bytes_held());
  if (n > 1) attn_.trim();  // a chunk's attention scratch is far larger than decode's
  switch (due) {
    case RoutingSchedule::Due::kHoldPrompt:
    case RoutingSchedule::Due::kStagePrompt:  // staged is the tiered cache's (validate())
    case RoutingSchedule::Due::kNothing:
      return Status::ok();
    case RoutingSchedule::Due::kPrompt:
      QEVICT_RETURN_IF_ERROR(route_event(false));  // the prompt's event
      start_decode_window();
      return Status::ok();
    case RoutingSchedule::Due::kChunk:
      return route_event(false);
    case RoutingSchedule::Due::kDecode:
      return route_event(true);
  }
  return Status::ok();
}

Status HeadKvCache::end_prompt() {
  if (sched_.prompt_pending()) QEVICT_RETURN_IF_ERROR(route_event(false));
  start_decode_window();
  return Status::ok();
}

}  // namespace qevict
