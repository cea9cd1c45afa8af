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
#include "kvcache/head_cache_util.h"
#include "kvcache/policies/snapkv_policy.h"

namespace qevict {

using namespace head_cache_detail;  // NOLINT: this class's own helpers

HeadKvCache::HeadKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                         const KvBudget& budget, std::unique_ptr<RoutingPolicy> policy)
    : shape_(shape),
      n_ctx_(n_ctx),
      p_(params),
      policy_(std::move(policy)),
      needs_(policy_->needs()),
      budget_(budget),
      sched_(params.prefill_route, params.route_every),
      obs_q_(shape.n_layers, needs_.obs_window, shape.q_width()) {
  steady_tokens_ = std::min<int64_t>(budget_.head_capacity + std::max(p_.route_every, 1), n_ctx_);
  heads_.resize(size_t(shape_.n_layers) * shape_.n_kv_heads);
  for (HeadStore& s : heads_) s.cap = steady_tokens_;
  if (needs_.obs_window > 0) obs_q_.allocate();
}

Status HeadKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  n_new_ = n_new;
  // A decode step after a prompt that is routed (chunks) or has none: the decode window.
  if (n_new == 1 && !sched_.prompt_pending()) start_decode_window();
  // A prompt chunk after decode started: a new turn, whose last queries are the window.
  if (n_new > 1 && obs_decode_) reopen_prompt_window();
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
  if (needs_.obs_window > 0 && !obs_decode_) obs_q_.keep(layer, q, n_new_);
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
  obs_acc_ = 0;
  obs_q_.reset_count();
  if (obs_decode_) {
    obs_decode_ = false;
    obs_q_.allocate();
  }
  routed_below_ = 0;
  evictions_ = 0;
  sched_.reset();
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
        obs_st_.capacity() + obs_ml_.capacity() + probs_.capacity() + wo_f32_.capacity()) *
           sizeof(float) +
       (pool_in_.capacity() + pool_out_.capacity()) * sizeof(double) + obs_q_.bytes();
  return b + route_threads_.bytes();
}

std::string HeadKvCache::describe() const {
  return fmt::format(
      "{} (budget {:.1f} KiB/layer{}, per head: {} sink + {} recent + {} heavy tokens of {} B, "
      "Ω {}, {})",
      policy_->name(), budget_.total / 1024.0, budget_.floor_tag(), budget_.sink, budget_.local,
      budget_.head_heavy, budget_.head_token_bytes, p_.route_every,
      p_.dtype == HalfType::kF16 ? "f16" : "bf16");
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
  *out = routed_report(p_.policy, describe(), budget_, bytes_held(), sched_.peak_bytes(),
                       sched_.events(), sched_.clock().seconds, sched_.clock().seconds_decode);
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
