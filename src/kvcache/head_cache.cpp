// HeadKvCache (see head_cache.h): per-KV-head token storage, attention over one block per
// kept token (the masses accumulate H2O scores), and routing that compacts each head in place.
#include "kvcache/head_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/ref/dequant.h"
#include "kernels/softmax_state.h"
#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

namespace {

// Grows v's capacity to `need` elements: geometrically, but not past `steady` (the most a
// decode step needs) unless `need` itself is larger, so decode stops allocating at `steady`.
template <typename T>
void reserve_capped(std::vector<T>& v, size_t need, size_t steady) {
  if (v.capacity() >= need) return;
  v.reserve(std::max(need, std::min(steady, 2 * v.capacity())));
}

// Gives back capacity above max(cap, size) elements (a prefill chunk's peak after routing).
template <typename T>
void trim(std::vector<T>& v, size_t cap) {
  cap = std::max(cap, v.size());
  if (v.capacity() <= cap) return;
  std::vector<T> w;
  w.reserve(cap);
  w.assign(v.begin(), v.end());
  v.swap(w);
}

// Appends one attention block per run of consecutive positions of a head's kept rows
// (pos ascending; k and v half [rows][d]).
void append_runs(const std::vector<int32_t>& pos, const uint16_t* k, const uint16_t* v, int d,
                 std::vector<KvBlockRef>* out) {
  const int64_t n = int64_t(pos.size());
  for (int64_t i = 0; i < n;) {
    int64_t e = i + 1;
    while (e < n && pos[size_t(e)] == pos[size_t(e - 1)] + 1) ++e;
    KvBlockRef r;
    r.pos0 = pos[size_t(i)];
    r.n = int32_t(e - i);
    r.k = k + i * d;
    r.v = v + i * d;
    r.ld = d;
    out->push_back(r);
    i = e;
  }
}

}  // namespace

void value_norm_rows(const float* wo, int64_t E, int64_t qw, int h, int g, int d, const float* v,
                     int64_t m, float* nu, std::vector<float>* y) {
  y->resize(size_t(m) * E);
  std::vector<double> acc(size_t(m), 0.0);
  for (int j = 0; j < g; ++j) {
    WeightView wh;
    wh.type = GgmlType::kF32;
    wh.data = reinterpret_cast<const uint8_t*>(wo + size_t(h * g + j) * d);
    wh.n_cols = d;
    wh.n_rows = E;
    wh.row_bytes = size_t(qw) * sizeof(float);
    matmul(wh, v, d, m, y->data(), E, 0, E);
    for (int64_t t = 0; t < m; ++t) {
      double l1 = 0.0;
      for (int64_t e = 0; e < E; ++e) l1 += std::fabs((*y)[size_t(t * E + e)]);
      acc[size_t(t)] += l1;
    }
  }
  for (int64_t t = 0; t < m; ++t) nu[t] = float(acc[size_t(t)] / g);
}

Status fit_head_budget(KvBudget* b, const KvShape& shape, int64_t n_ctx, const KvCacheParams& p,
                       const PolicyNeeds& needs) {
  const bool by_tokens = p.budget_tokens > 0 && !(p.budget_fraction > 0.0) && p.budget_bytes <= 0;
  if (by_tokens) return Status::ok();
  const int H = shape.n_kv_heads;
  const size_t token = size_t(2) * shape.head_dim * sizeof(uint16_t) + sizeof(int32_t) +
                       (needs.cumulative_scores ? sizeof(double) : 0) +
                       (needs.value_norms ? sizeof(float) : 0) +
                       (needs.obs_window > 0 ? size_t(shape.group()) * sizeof(float) : 0) +
                       (needs.obs_max_kernel > 0 ? sizeof(float) : 0);
  const int64_t slack = std::max(p.route_every, 1);
  const int64_t held = int64_t(b->total / H / token);
  const int64_t cap = std::min<int64_t>(held - slack, n_ctx);
  const int64_t local = p.local >= 0 ? p.local : std::max<int64_t>(0, cap - p.sink) / 2;
  if (cap - p.sink - local < 1)
    return Status::error(fmt::format(
        "budget too small for {}: {} bytes per layer hold {} tokens of {} B (K, V, position "
        "and the policy's per-token state) per KV head; it needs {} for the decode tokens "
        "between routings (--kv-route-every) + {} sink + {} recent + at least 1 heavy; raise "
        "--kv-budget",
        p.policy, b->total, held, token, slack, p.sink, local));
  b->head_token_bytes = token;
  b->head_capacity = cap;
  b->local = int(local);
  b->head_heavy = cap - p.sink - local;
  b->sink_bytes = size_t(b->sink) * token * H;
  b->local_bytes = size_t(b->local) * token * H;
  b->hist_bytes = size_t(b->head_heavy) * token * H;
  return Status::ok();
}

HeadKvCache::HeadKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                         const KvBudget& budget, std::unique_ptr<RoutingPolicy> policy)
    : shape_(shape),
      n_ctx_(n_ctx),
      p_(params),
      policy_(std::move(policy)),
      needs_(policy_->needs()),
      budget_(budget) {
  steady_tokens_ = std::min<int64_t>(budget_.head_capacity + std::max(p_.route_every, 1), n_ctx_);
  heads_.resize(size_t(shape_.n_layers) * shape_.n_kv_heads);
  for (HeadStore& s : heads_) s.cap = steady_tokens_;
  if (needs_.obs_window > 0)
    obs_q_.resize(size_t(shape_.n_layers) * needs_.obs_window * shape_.q_width());
}

void HeadKvCache::keep_queries(int layer, const float* q) {
  // The last w queries of the sequence so far, which may span this call and earlier ones.
  const int64_t w = needs_.obs_window, qw = shape_.q_width();
  float* ring = obs_q_.data() + size_t(layer) * w * qw;
  const int64_t kept = std::min(obs_n_, w - std::min(n_new_, w));  // older rows that stay
  const int64_t fresh = std::min(n_new_, w);
  std::copy(ring + (obs_n_ - kept) * qw, ring + obs_n_ * qw, ring);
  std::copy(q + (n_new_ - fresh) * qw, q + n_new_ * qw, ring + kept * qw);
}

Status HeadKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  n_new_ = n_new;
  // A decode step after a prompt that is routed (chunks) or has none: the decode window.
  if (n_new == 1 && !prompt_pending_) start_decode_window();
  return Status::ok();
}

SequenceKvCache::PromptReplay HeadKvCache::prompt_replay() const {
  if (!prefill_keeps_everything() || obs_decode_) return PromptReplay::kAttend;
  if (!needs_.cumulative_scores) return PromptReplay::kStore;
  return p_.dtype == HalfType::kF16 ? PromptReplay::kMasses : PromptReplay::kAttend;
}

void HeadKvCache::append_prompt(int layer, const float* q, const float* k, const float* v,
                                const PromptExtras& x) {
  append_tokens(layer, q, k, v);
  if (x.value_norm && needs_.value_norms)
    for (int h = 0; h < shape_.n_kv_heads; ++h) {
      HeadStore& s = head(layer, h);
      std::copy_n(x.value_norm + h * n_new_, n_new_, s.nu.end() - n_new_);
    }
  const double* mass = x.mass;
  if (!mass || !needs_.cumulative_scores) return;
  const int64_t n = n_past_ + n_new_;  // every position is kept while the prompt is read
  const double inv_g = 1.0 / shape_.group();
  for (int h = 0; h < shape_.n_kv_heads; ++h) {
    HeadStore& s = head(layer, h);
    for (int64_t i = 0; i < s.n(); ++i)
      s.score[size_t(i)] += mass[h * n + s.pos[size_t(i)]] * inv_g;
  }
}

void HeadKvCache::append_tokens(int layer, const float* q, const float* k, const float* v) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int kvw = shape_.kv_width();
  if (needs_.obs_window > 0 && !obs_decode_) keep_queries(layer, q);
  const bool omax = obs_decode_ && needs_.obs_max_kernel > 0;
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const size_t n0 = size_t(s.n()), n1 = n0 + size_t(n_new_), cap = size_t(s.cap);
    reserve_capped(s.k, n1 * d, cap * d);
    reserve_capped(s.v, n1 * d, cap * d);
    reserve_capped(s.pos, n1, cap);
    if (needs_.cumulative_scores) reserve_capped(s.score, n1, cap);
    if (needs_.value_norms) reserve_capped(s.nu, n1, cap);
    if (obs_decode_) reserve_capped(s.osum, n1 * g, cap * g);
    if (omax) reserve_capped(s.omax, n1, cap);
    s.k.resize(n1 * d);
    s.v.resize(n1 * d);
    for (int64_t t = 0; t < n_new_; ++t) {
      f32_to_half(p_.dtype, k + t * kvw + h * d, s.k.data() + (n0 + t) * d, d);
      f32_to_half(p_.dtype, v + t * kvw + h * d, s.v.data() + (n0 + t) * d, d);
      s.pos.push_back(static_cast<int32_t>(n_past_ + t));
      if (needs_.cumulative_scores) s.score.push_back(0.0);
      if (needs_.value_norms) s.nu.push_back(std::numeric_limits<float>::quiet_NaN());
    }
    if (obs_decode_) s.osum.resize(n1 * g, 0.0f);
    if (omax) s.omax.resize(n1, 0.0f);
  }
}

void HeadKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                         ThreadPool& pool) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int qw = shape_.q_width();
  const size_t steady = size_t(steady_tokens_);
  append_tokens(layer, q, k, v);
  // Blocks: runs of consecutive kept positions (rows are in position order and the new
  // tokens are the last rows), with masses per token: each token's probability mass is its
  // H2O score increment.
  head_off_.resize(size_t(H) + 1);
  blocks_.clear();
  for (int h = 0; h < H; ++h) {
    head_off_[h] = int64_t(blocks_.size());
    const HeadStore& s = head(layer, h);
    append_runs(s.pos, s.k.data(), s.v.data(), d, &blocks_);
  }
  head_off_[H] = int64_t(blocks_.size());
  int64_t n_rows = 0;
  for (int h = 0; h < H; ++h) n_rows += head(layer, h).n();
  FusedAttnParams fp = FusedAttnParams::make(p_.dtype, g, d);
  if (!needs_.cumulative_scores) {  // the policy does not read them: no masses to compute
    attend_blocks(fp, H, q, qw, n_new_, n_past_, blocks_.data(), head_off_.data(), out, nullptr,
                  MassLayout::kPerHeadBlock, attn_, pool);
    if (obs_decode_) observe_step(layer, q);
    return;
  }
  fp.token_ml = true;
  reserve_capped(mass_, size_t(n_rows), size_t(H) * steady);
  mass_.assign(size_t(n_rows), 0.0);
  attend_blocks(fp, H, q, qw, n_new_, n_past_, blocks_.data(), head_off_.data(), out, mass_.data(),
                MassLayout::kPerHeadBlock, attn_, pool);
  // H2O score: each kept token gains the probability it received, summed over the call's
  // queries and the group's query heads, divided by g.
  const double inv_g = 1.0 / g;
  for (int h = 0, row = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    for (int64_t i = 0; i < s.n(); ++i, ++row) s.score[size_t(i)] += mass_[size_t(row)] * inv_g;
  }
  if (obs_decode_) observe_step(layer, q);
}

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

int64_t HeadKvCache::compact(HeadStore& s, int64_t first, const PlanEntry* entries,
                             int64_t n_cand) {
  // In place, keeping position order. Only kEvicted removes a token (the policies of this
  // cache never return kQuant: it has no low-bit tier).
  const int d = shape_.head_dim;
  const int64_t n = s.n();
  const int g = shape_.group();
  const bool nu = !s.nu.empty(), score = !s.score.empty();
  const bool osum = !s.osum.empty(), omax = !s.omax.empty();
  int64_t w = first;
  for (int64_t r = first; r < n; ++r) {
    if (r - first < n_cand && entries[r - first].to == Tier::kEvicted) continue;
    if (w != r) {
      std::copy_n(s.k.data() + r * d, d, s.k.data() + w * d);
      std::copy_n(s.v.data() + r * d, d, s.v.data() + w * d);
      s.pos[w] = s.pos[r];
      if (score) s.score[w] = s.score[r];
      if (nu) s.nu[w] = s.nu[r];
      if (osum) std::copy_n(s.osum.data() + r * g, g, s.osum.data() + w * g);
      if (omax) s.omax[w] = s.omax[r];
    }
    ++w;
  }
  s.k.resize(size_t(w) * d);
  s.v.resize(size_t(w) * d);
  s.pos.resize(size_t(w));
  if (score) s.score.resize(size_t(w));
  if (nu) s.nu.resize(size_t(w));
  if (osum) s.osum.resize(size_t(w) * g);
  if (omax) s.omax.resize(size_t(w));
  return n - w;
}

void HeadKvCache::query_probs(const HeadStore& s, const float* q, int64_t qpos) {
  const int g = shape_.group(), d = shape_.head_dim, st = d + 2;
  const int64_t n = s.n();
  FusedAttnParams fp = FusedAttnParams::make(p_.dtype, g, d);
  fp.token_ml = true;
  // Every kept token of the head, one block per run of consecutive positions.
  blocks_.clear();
  append_runs(s.pos, s.k.data(), s.v.data(), d, &blocks_);
  obs_st_.resize(size_t(g) * st);
  obs_ml_.resize(size_t(n) * g * 2);
  attn_state_init(obs_st_.data(), g, d);
  for (size_t u = 0; u < obs_ml_.size(); u += 2) obs_ml_[u] = -INFINITY, obs_ml_[u + 1] = 0.0f;
  fused_attention_partial(fp, q, d, 1, qpos, blocks_.data(), int(blocks_.size()), obs_st_.data(),
                          obs_ml_.data(), 0, attn_.slot(0));
  probs_.resize(size_t(g) * n);
  for (int j = 0; j < g; ++j) {
    const float* gml = obs_st_.data() + size_t(j) * st;  // (M, L) of query head j
    for (int64_t i = 0; i < n; ++i)
      probs_[size_t(j) * n + i] = attn_block_mass(obs_ml_.data() + (size_t(i) * g + j) * 2, gml);
  }
}

void HeadKvCache::observe_step(int layer, const float* q) {
  const int H = shape_.n_kv_heads, g = shape_.group(), d = shape_.head_dim;
  const int64_t qw = shape_.q_width();
  const int k = needs_.obs_max_kernel;
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const int64_t n = s.n();
    for (int64_t t = 0; t < n_new_; ++t) {
      query_probs(s, q + t * qw + size_t(h) * g * d, n_past_ + t);
      for (int j = 0; j < g; ++j) {
        const float* p = probs_.data() + size_t(j) * n;
        for (int64_t i = 0; i < n; ++i) s.osum[size_t(i) * g + j] += p[i];
        if (k <= 0) continue;
        // DefensiveKV's row: pooled along the head's tokens, rescaled to its pre-pool sum.
        pool_in_.resize(size_t(n));
        pool_out_.resize(size_t(n));
        double base = 0.0, psum = 0.0;
        for (int64_t i = 0; i < n; ++i) base += pool_in_[size_t(i)] = p[i];
        snapkv::pool1d(pool_in_.data(), n, k, ObsPool::kAvg, pool_out_.data());
        for (int64_t i = 0; i < n; ++i) psum += pool_out_[size_t(i)];
        const double scale = psum > 0.0 ? base / psum : 0.0;
        for (int64_t i = 0; i < n; ++i)
          s.omax[size_t(i)] = std::max(s.omax[size_t(i)], float(pool_out_[size_t(i)] * scale));
      }
    }
  }
}

void HeadKvCache::start_decode_window() {
  if (needs_.obs_window <= 0 || obs_decode_) return;
  const int g = shape_.group();
  obs_decode_ = true;
  obs_acc_ = obs_n_ = 0;
  std::vector<float>().swap(obs_q_);
  for (HeadStore& s : heads_) {
    s.osum.reserve(size_t(s.cap) * g);
    s.osum.assign(size_t(s.n()) * g, 0.0f);
    if (needs_.obs_max_kernel > 0) {
      s.omax.reserve(size_t(s.cap));
      s.omax.assign(size_t(s.n()), 0.0f);
    }
  }
}

void HeadKvCache::observe(int layer) {
  const int H = shape_.n_kv_heads, g = shape_.group(), d = shape_.head_dim;
  const int64_t w = needs_.obs_window, qw = shape_.q_width();
  const int64_t n_obs = obs_decode_ ? 1 : obs_n_;
  request_.group = g;
  request_.n_obs = int(n_obs);
  request_.obs.resize(size_t(g) * n_obs * request_.candidates.size());
  request_.obs_max.clear();
  if (obs_decode_ && needs_.obs_max_kernel > 0) request_.obs_max.resize(request_.candidates.size());
  // Decode: the mean over the queries since the last routing event.
  const float inv_acc = obs_acc_ > 0 ? 1.0f / float(obs_acc_) : 0.0f;
  for (int h = 0; h < H; ++h) {
    const HeadStore& s = head(layer, h);
    const int64_t n_h = request_.n_cand(h);
    if (n_h == 0) continue;
    // The candidates are rows [first, first + n_h) of the head (route_layer).
    const int64_t first =
        std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
    if (obs_decode_) {
      for (int j = 0; j < g; ++j) {
        float* row = const_cast<float*>(request_.obs_row(h, j, 0));
        for (int64_t i = 0; i < n_h; ++i) row[i] = s.osum[size_t(first + i) * g + j] * inv_acc;
      }
      if (!request_.obs_max.empty())
        std::copy_n(s.omax.data() + first, n_h, request_.obs_max.data() + request_.cand_begin(h));
      continue;
    }
    for (int64_t r = 0; r < n_obs; ++r) {
      const float* qr = obs_q_.data() + (size_t(layer) * w + r) * qw + size_t(h) * g * d;
      query_probs(s, qr, n_past_ - n_obs + r);
      for (int j = 0; j < g; ++j) {
        float* row = const_cast<float*>(request_.obs_row(h, j, int(r)));
        std::copy_n(probs_.data() + size_t(j) * s.n() + first, n_h, row);
      }
    }
  }
}

Status HeadKvCache::value_norms(int layer) {
  const int H = shape_.n_kv_heads, g = shape_.group(), d = shape_.head_dim;
  const int64_t qw = shape_.q_width();
  if (!wo_ || layer >= int(wo_->wo.size()) || wo_->wo[size_t(layer)].n_cols != qw)
    return Status::error(fmt::format(
        "{} scores by value norms through the attention output projection, which the model "
        "did not bind (set_output_projection) for layer {}",
        policy_->name(), layer));
  const WeightView& W = wo_->wo[size_t(layer)];
  const int64_t E = W.n_rows;
  request_.value_norm.resize(request_.candidates.size());
  bool dequantized = false;
  constexpr int64_t kTile = 64;  // value rows per matmul
  std::vector<float> vf(size_t(kTile) * d), y(size_t(kTile) * E);
  std::vector<int64_t> rows;
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const int64_t b = request_.cand_begin(h), n_h = request_.n_cand(h);
    if (n_h == 0) continue;
    const int64_t first =
        std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
    rows.clear();
    for (int64_t i = 0; i < n_h; ++i)
      if (std::isnan(s.nu[size_t(first + i)])) rows.push_back(first + i);
    if (!rows.empty() && !dequantized) {
      // W_O in f32 [n_embd][q_width] for this routing event (a quantized GGUF weight).
      wo_f32_.resize(size_t(E) * qw);
      for (int64_t r = 0; r < E; ++r)
        ref::dequantize_row(W.type, W.data + size_t(r) * W.row_bytes, wo_f32_.data() + r * qw, qw);
      dequantized = true;
    }
    std::vector<float> nu(static_cast<size_t>(kTile));
    for (size_t t0 = 0; t0 < rows.size(); t0 += kTile) {
      const int64_t m = std::min<int64_t>(kTile, int64_t(rows.size() - t0));
      for (int64_t t = 0; t < m; ++t)
        half_to_f32(p_.dtype, s.v.data() + rows[t0 + t] * d, vf.data() + t * d, d);
      value_norm_rows(wo_f32_.data(), E, qw, h, g, d, vf.data(), m, nu.data(), &y);
      for (int64_t t = 0; t < m; ++t) s.nu[size_t(rows[t0 + t])] = nu[size_t(t)];
    }
    for (int64_t i = 0; i < n_h; ++i) request_.value_norm[size_t(b + i)] = s.nu[size_t(first + i)];
  }
  return Status::ok();
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
  clock_.on_event_begin(routing_events_, n_past_, decode);
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
  clock_.on_event_end(routing_events_);
  ++routing_events_;
  steps_since_route_ = 0;
  prompt_pending_ = false;
  routed_below_ = std::max<int64_t>(n_past_ - budget_.local, 0);
  return Status::ok();
}

Status HeadKvCache::commit() {
  const bool chunk = n_new_ > 1;
  n_past_ += n_new_;
  if (needs_.obs_window > 0 && !obs_decode_)
    obs_n_ = std::min<int64_t>(needs_.obs_window, obs_n_ + n_new_);
  if (obs_decode_) obs_acc_ += n_new_;
  n_new_ = 0;
  ++steps_since_route_;
  peak_bytes_ = std::max(peak_bytes_, bytes_held());
  // Routing events: after every prefill chunk and every Ω decode steps (as TieredKvCache);
  // with --prefill-route end, once when the prompt is complete (at end_prompt(), or at the
  // first decode step for callers that do not say).
  if (chunk) attn_.trim();  // a chunk's attention scratch is far larger than decode's
  if (p_.prefill_route == "end") {
    if (chunk) {
      prompt_pending_ = true;
      return Status::ok();
    }
    if (prompt_pending_) {
      QEVICT_RETURN_IF_ERROR(route_event(false));  // the prompt's event
      start_decode_window();
      return Status::ok();
    }
  }
  if (chunk || steps_since_route_ >= p_.route_every) return route_event(!chunk);
  return Status::ok();
}

Status HeadKvCache::end_prompt() {
  if (prompt_pending_) QEVICT_RETURN_IF_ERROR(route_event(false));
  start_decode_window();
  return Status::ok();
}

void HeadKvCache::clear() {
  for (HeadStore& s : heads_) {
    s.k.clear();
    s.v.clear();
    s.pos.clear();
    s.score.clear();
  }
  for (HeadStore& s : heads_) {
    s.nu.clear();
    s.osum.clear();
    s.omax.clear();
    s.cap = steady_tokens_;
  }
  n_past_ = n_new_ = 0;
  obs_n_ = obs_acc_ = 0;
  if (obs_decode_) {
    obs_decode_ = false;
    obs_q_.resize(size_t(shape_.n_layers) * needs_.obs_window * shape_.q_width());
  }
  steps_since_route_ = 0;
  routed_below_ = 0;
  routing_events_ = evictions_ = 0;
  clock_.reset();
  peak_bytes_ = 0;
  prompt_pending_ = false;
}

size_t HeadKvCache::bytes_held() const {
  size_t b = heads_.capacity() * sizeof(HeadStore);
  for (const HeadStore& s : heads_)
    b += (s.k.capacity() + s.v.capacity()) * sizeof(uint16_t) + s.pos.capacity() * sizeof(int32_t) +
         s.score.capacity() * sizeof(double) +
         (s.nu.capacity() + s.osum.capacity() + s.omax.capacity()) * sizeof(float);
  b += attn_.bytes() + blocks_.capacity() * sizeof(KvBlockRef) +
       head_off_.capacity() * sizeof(int64_t) + mass_.capacity() * sizeof(double) +
       request_.candidates.capacity() * sizeof(RoutingCandidate) +
       plan_.entries.capacity() * sizeof(PlanEntry) +
       request_.head_begin.capacity() * sizeof(int64_t) +
       (request_.obs.capacity() + request_.obs_max.capacity() + request_.value_norm.capacity() +
        obs_q_.capacity() + obs_st_.capacity() + obs_ml_.capacity() + probs_.capacity() +
        wo_f32_.capacity()) *
           sizeof(float) +
       (pool_in_.capacity() + pool_out_.capacity()) * sizeof(double);
  return b + route_threads_.bytes();
}

std::string HeadKvCache::describe() const {
  return fmt::format(
      "{} (budget {:.1f} KiB/layer, per head: {} sink + {} recent + {} heavy tokens of {} B, "
      "Ω {}, {})",
      policy_->name(), budget_.total / 1024.0, budget_.sink, budget_.local, budget_.head_heavy,
      budget_.head_token_bytes, p_.route_every, p_.dtype == HalfType::kF16 ? "f16" : "bf16");
}

void HeadKvCache::position_tiers(int layer, int kv_head, std::vector<Tier>* out) const {
  out->assign(size_t(n_past_), Tier::kEvicted);
  for (int32_t p : head(layer, kv_head).pos)
    if (p < n_past_) (*out)[size_t(p)] = Tier::kFull;
  for (int64_t p = 0; p < std::min<int64_t>(budget_.sink, n_past_); ++p)
    (*out)[size_t(p)] = Tier::kLocal;
  for (int64_t p = std::max<int64_t>(n_past_ - budget_.local, 0); p < n_past_; ++p)
    (*out)[size_t(p)] = Tier::kLocal;
}

void HeadKvCache::report(KvReport* out, ReportDetail detail) const {
  *out = routed_report(p_.policy, describe(), budget_, bytes_held(), peak_bytes_, routing_events_,
                       clock_.seconds, clock_.seconds_decode);
  out->per_head = true;
  out->unit_tokens = 1;
  // Counts from the kept positions alone (as position_tiers classifies them: the sink and
  // local ranges are local, other kept positions full, the rest evicted), so a summary costs
  // O(kept), not O(n_past), per head.
  const int64_t n = n_past_;
  const int64_t sink_end = std::min<int64_t>(budget_.sink, n);
  const int64_t local_begin = std::max<int64_t>(n - budget_.local, sink_end);
  const int64_t n_local = sink_end + (n - local_begin);
  std::vector<Tier> tiers;
  for (int l = 0; l < shape_.n_layers; ++l) {
    KvLayerReport r;
    for (int h = 0; h < shape_.n_kv_heads; ++h) {
      const HeadStore& s = head(l, h);
      int64_t n_full = 0;
      for (int32_t p : s.pos) n_full += p < n && p >= sink_end && p < local_begin;
      r.windows_local += n_local;
      r.windows_full += n_full;
      r.windows_evicted += n - n_local - n_full;
      if (detail == ReportDetail::kTiers) position_tiers(l, h, &tiers);
      r.bytes_full += size_t(s.n()) * budget_.head_token_bytes;
      r.bytes_allocated +=
          (s.k.capacity() + s.v.capacity()) * sizeof(uint16_t) +
          s.pos.capacity() * sizeof(int32_t) + s.score.capacity() * sizeof(double) +
          (s.nu.capacity() + s.osum.capacity() + s.omax.capacity()) * sizeof(float);
      if (detail == ReportDetail::kTiers) out->position_tiers.push_back(tiers);
    }
    r.bytes_budgeted = r.bytes_full;
    out->layers.push_back(r);
  }
  if (!out->layers.empty()) out->layers[0].evictions = evictions_;  // all layers and heads
}

}  // namespace qevict
