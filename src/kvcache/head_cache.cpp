// HeadKvCache (see head_cache.h): per-KV-head token storage, attention over one block per
// kept token (the masses accumulate H2O scores), and routing that compacts each head in place.
#include "kvcache/head_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/ops.h"

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

}  // namespace

HeadKvCache::HeadKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                         const KvBudget& budget, std::unique_ptr<RoutingPolicy> policy)
    : shape_(shape), n_ctx_(n_ctx), p_(params), policy_(std::move(policy)), budget_(budget) {
  steady_tokens_ = std::min<int64_t>(budget_.head_capacity + std::max(p_.route_every, 1), n_ctx_);
  heads_.resize(size_t(shape_.n_layers) * shape_.n_kv_heads);
}

Status HeadKvCache::begin(int64_t n_new) {
  QEVICT_RETURN_IF_ERROR(check_begin(n_past_, n_new, n_ctx_));
  n_new_ = n_new;
  return Status::ok();
}

void HeadKvCache::attend(int layer, const float* q, const float* k, const float* v, float* out,
                         ThreadPool& pool) {
  const int H = shape_.n_kv_heads, d = shape_.head_dim, g = shape_.group();
  const int qw = shape_.q_width(), kvw = shape_.kv_width();
  const size_t steady = size_t(steady_tokens_);
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const size_t n0 = size_t(s.n()), n1 = n0 + size_t(n_new_);
    reserve_capped(s.k, n1 * d, steady * d);
    reserve_capped(s.v, n1 * d, steady * d);
    reserve_capped(s.pos, n1, steady);
    reserve_capped(s.score, n1, steady);
    s.k.resize(n1 * d);
    s.v.resize(n1 * d);
    for (int64_t t = 0; t < n_new_; ++t) {
      f32_to_half(p_.dtype, k + t * kvw + h * d, s.k.data() + (n0 + t) * d, d);
      f32_to_half(p_.dtype, v + t * kvw + h * d, s.v.data() + (n0 + t) * d, d);
      s.pos.push_back(static_cast<int32_t>(n_past_ + t));
      s.score.push_back(0.0);
    }
  }

  // Blocks: runs of consecutive kept positions (rows are in position order and the new
  // tokens are the last rows), with masses per token: each token's probability mass is its
  // H2O score increment.
  head_off_.resize(size_t(H) + 1);
  blocks_.clear();
  for (int h = 0; h < H; ++h) {
    head_off_[h] = int64_t(blocks_.size());
    const HeadStore& s = head(layer, h);
    for (int64_t i = 0; i < s.n();) {
      int64_t e = i + 1;
      while (e < s.n() && s.pos[size_t(e)] == s.pos[size_t(e - 1)] + 1) ++e;
      KvBlockRef r;
      r.pos0 = s.pos[size_t(i)];
      r.n = int32_t(e - i);
      r.k = s.k.data() + i * d;
      r.v = s.v.data() + i * d;
      r.ld = d;
      blocks_.push_back(r);
      i = e;
    }
  }
  head_off_[H] = int64_t(blocks_.size());
  int64_t n_rows = 0;
  for (int h = 0; h < H; ++h) n_rows += head(layer, h).n();
  FusedAttnParams fp = FusedAttnParams::make(p_.dtype, g, d);
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
}

Status HeadKvCache::route_head(HeadStore& s) {
  // Candidates: kept tokens that are neither sink (pos < S) nor recent (pos >= n_past - L).
  const int64_t hi = n_past_ - budget_.local;
  const int64_t first = std::lower_bound(s.pos.begin(), s.pos.end(), budget_.sink) - s.pos.begin();
  const int64_t n = s.n();
  request_.n_past = n_past_;
  request_.budget = budget_.routing();
  request_.candidates.clear();
  for (int64_t i = first; i < n && s.pos[i] < hi; ++i)
    request_.candidates.push_back({s.pos[i], s.pos[i], s.score[i],
                                   s.pos[i] < routed_below_ ? Tier::kFull : Tier::kLocal, false});
  if (request_.candidates.empty()) return Status::ok();
  policy_->plan(request_, &plan_);
  QEVICT_RETURN_IF_ERROR(check_plan(request_, plan_));
  for (const PlanEntry& e : plan_.entries)
    if (e.to == Tier::kQuant)
      return Status::error(fmt::format("{} sends token {} to a low-bit tier this cache lacks",
                                       policy_->name(), e.id));
  // Compact in place, keeping position order. Only kEvicted removes a token (H2OPolicy never
  // returns kQuant; this cache has no low-bit tier).
  const int d = shape_.head_dim;
  const int64_t n_cand = int64_t(request_.candidates.size());
  int64_t w = first;
  for (int64_t r = first; r < n; ++r) {
    if (r - first < n_cand && plan_.entries[size_t(r - first)].to == Tier::kEvicted) {
      ++evictions_;
      continue;
    }
    if (w != r) {
      std::copy_n(s.k.data() + r * d, d, s.k.data() + w * d);
      std::copy_n(s.v.data() + r * d, d, s.v.data() + w * d);
      s.pos[w] = s.pos[r];
      s.score[w] = s.score[r];
    }
    ++w;
  }
  s.k.resize(size_t(w) * d);
  s.v.resize(size_t(w) * d);
  s.pos.resize(size_t(w));
  s.score.resize(size_t(w));
  return Status::ok();
}

Status HeadKvCache::route() {
  const size_t steady = size_t(steady_tokens_), d = size_t(shape_.head_dim);
  for (HeadStore& s : heads_) {
    QEVICT_RETURN_IF_ERROR(route_head(s));
    // After a prefill chunk the vectors hold its peak; give back what decode will not use.
    trim(s.k, steady * d);
    trim(s.v, steady * d);
    trim(s.pos, steady);
    trim(s.score, steady);
  }
  trim(mass_, size_t(shape_.n_kv_heads) * steady);
  trim(blocks_, size_t(shape_.n_kv_heads) * steady);
  ++routing_events_;
  steps_since_route_ = 0;
  prompt_pending_ = false;
  routed_below_ = std::max<int64_t>(n_past_ - budget_.local, 0);
  return Status::ok();
}

Status HeadKvCache::commit() {
  const bool chunk = n_new_ > 1;
  n_past_ += n_new_;
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
    if (prompt_pending_) return route();
  }
  if (chunk || steps_since_route_ >= p_.route_every) return route();
  return Status::ok();
}

Status HeadKvCache::end_prompt() { return prompt_pending_ ? route() : Status::ok(); }

void HeadKvCache::clear() {
  for (HeadStore& s : heads_) {
    s.k.clear();
    s.v.clear();
    s.pos.clear();
    s.score.clear();
  }
  n_past_ = n_new_ = 0;
  steps_since_route_ = 0;
  routed_below_ = 0;
  routing_events_ = evictions_ = 0;
  peak_bytes_ = 0;
  prompt_pending_ = false;
}

size_t HeadKvCache::bytes_held() const {
  size_t b = heads_.capacity() * sizeof(HeadStore);
  for (const HeadStore& s : heads_)
    b += (s.k.capacity() + s.v.capacity()) * sizeof(uint16_t) + s.pos.capacity() * sizeof(int32_t) +
         s.score.capacity() * sizeof(double);
  b += attn_.bytes() + blocks_.capacity() * sizeof(KvBlockRef) +
       head_off_.capacity() * sizeof(int64_t) + mass_.capacity() * sizeof(double) +
       request_.candidates.capacity() * sizeof(RoutingCandidate) +
       plan_.entries.capacity() * sizeof(PlanEntry);
  return b;
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
  *out = KvReport();
  out->policy = p_.policy;
  out->describe = describe();
  out->budget = budget_;
  out->bytes_held = bytes_held();
  out->peak_bytes_held = std::max(peak_bytes_, out->bytes_held);
  out->routing_events = routing_events_;
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
      r.bytes_allocated += (s.k.capacity() + s.v.capacity()) * sizeof(uint16_t) +
                           s.pos.capacity() * sizeof(int32_t) + s.score.capacity() * sizeof(double);
      if (detail == ReportDetail::kTiers) out->position_tiers.push_back(tiers);
    }
    r.bytes_budgeted = r.bytes_full;
    out->layers.push_back(r);
  }
  if (!out->layers.empty()) out->layers[0].evictions = evictions_;  // all layers and heads
}

}  // namespace qevict
