// HeadKvCache (see head_cache.h): per-KV-head token storage, materialized-probability
// attention that accumulates H2O scores, and routing that compacts each head in place.
#include "kvcache/head_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/ops.h"

namespace qevict {

namespace {

// Query tokens per attention task at least, and the task count a call aims for at most (the
// split depends only on n_new and n_kv_heads, never on the thread count, so results do too).
constexpr int64_t kBlockQueries = 8;
constexpr int64_t kMaxTasks = 32;

struct HeadBudget {
  size_t total = 0;      // B_total per layer
  int64_t capacity = 0;  // C tokens per KV head
  int64_t heavy = 0;     // K = C - S - L (may be < 1: check_budget rejects it)
};

HeadBudget head_budget(const KvShape& shape, int64_t n_ctx, const KvCacheParams& p) {
  HeadBudget b;
  b.total = p.budget_per_layer(shape, n_ctx);  // the same B_total as TieredKvCache
  b.capacity = int64_t(b.total / size_t(shape.n_kv_heads) / HeadKvCache::token_head_bytes(shape));
  b.heavy = b.capacity - p.sink - p.local;
  return b;
}

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

size_t HeadKvCache::token_head_bytes(const KvShape& shape) {
  return size_t(2) * shape.head_dim * sizeof(uint16_t) + sizeof(int32_t);
}

Status HeadKvCache::check_budget(const KvShape& shape, int64_t n_ctx, const KvCacheParams& p) {
  QEVICT_RETURN_IF_ERROR(shape.validate());
  if (n_ctx <= 0) return Status::error("context size must be positive");
  if (n_ctx > std::numeric_limits<int32_t>::max())
    return Status::error(fmt::format("context size {} exceeds the int32 positions", n_ctx));
  if (p.budget_bytes <= 0 && !(p.budget_fraction > 0.0))
    return Status::error(
        "the h2o policy needs a budget: --kv-budget FRACTION or --kv-budget-bytes N");
  const HeadBudget b = head_budget(shape, n_ctx, p);
  if (b.heavy < 1)
    return Status::error(fmt::format(
        "budget too small for sink + recent: {} bytes per layer give each of the {} KV heads {} "
        "tokens of {} B, but {} sink + {} recent tokens leave no room for a heavy hitter; raise "
        "--kv-budget or lower --kv-sink/--kv-local",
        b.total, shape.n_kv_heads, b.capacity, token_head_bytes(shape), p.sink, p.local));
  return Status::ok();
}

HeadKvCache::HeadKvCache(const KvShape& shape, int64_t n_ctx, const KvCacheParams& params,
                         std::unique_ptr<RoutingPolicy> policy)
    : shape_(shape), n_ctx_(n_ctx), p_(params), policy_(std::move(policy)) {
  m_ = token_head_bytes(shape_);
  const HeadBudget b = head_budget(shape_, n_ctx_, p_);
  budget_total_ = b.total;
  capacity_ = b.capacity;
  heavy_capacity_ = std::max<int64_t>(b.heavy, 0);
  steady_tokens_ = std::min<int64_t>(capacity_ + std::max(p_.route_every, 1), n_ctx_);
  rbudget_.full_bytes = size_t(heavy_capacity_) * m_;
  rbudget_.quant_bytes = 0;
  rbudget_.window_full = m_;
  rbudget_.window_quant = 0;
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
  int64_t n_keys_max = 0;
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
    n_keys_max = std::max(n_keys_max, s.n());
  }

  // Tasks (KV head h, block b of query tokens). Rows are in position order and the new tokens
  // are the last n_new rows, so query t (position n_past + t) sees exactly the first
  // n_old + t + 1 rows of its head (causal).
  const int64_t nb = std::clamp<int64_t>((n_new_ + kBlockQueries - 1) / kBlockQueries, 1,
                                         std::max<int64_t>(kMaxTasks / H, 1));
  const int64_t n_tasks = int64_t(H) * nb;
  const size_t ld = size_t(n_keys_max);
  reserve_capped(probs_, size_t(n_tasks) * g * ld, size_t(H) * g * steady);
  reserve_capped(part_, size_t(n_tasks) * ld, size_t(H) * steady);
  probs_.resize(size_t(n_tasks) * g * ld);
  part_.resize(size_t(n_tasks) * ld);
  const float scale = 1.0f / std::sqrt(float(d));
  const HalfType dt = p_.dtype;
  pool.parallel_for(n_tasks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t task = b0; task < b1; ++task) {
      const int h = int(task / nb);
      const int64_t blk = task % nb;
      const HeadStore& s = head(layer, h);
      const int64_t n_old = s.n() - n_new_;
      const int64_t t0 = n_new_ * blk / nb, t1 = n_new_ * (blk + 1) / nb;
      float* p = probs_.data() + size_t(task) * g * ld;  // [g][ld]
      double* acc = part_.data() + size_t(task) * ld;
      std::fill_n(acc, n_old + t1, 0.0);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n_keys = n_old + t + 1;
        qk_scores(dt, q + t * qw + h * g * d, d, g, s.k.data(), d, n_keys, d, scale, p,
                  int64_t(ld));
        for (int j = 0; j < g; ++j) softmax_inplace(p + j * ld, n_keys);
        float* o = out + t * qw + h * g * d;
        std::fill_n(o, g * d, 0.0f);
        pv_accumulate(dt, p, int64_t(ld), g, s.v.data(), d, n_keys, d, o, d);
        for (int j = 0; j < g; ++j)
          for (int64_t i = 0; i < n_keys; ++i) acc[i] += p[j * ld + i];
      }
    }
  });
  // H2O score: each kept token gains the probability it received, summed over the call's
  // queries and the group's query heads, divided by g. Reduced in block order (deterministic).
  const double inv_g = 1.0 / g;
  for (int h = 0; h < H; ++h) {
    HeadStore& s = head(layer, h);
    const int64_t n_old = s.n() - n_new_;
    for (int64_t blk = 0; blk < nb; ++blk) {
      const double* acc = part_.data() + size_t(h * nb + blk) * ld;
      const int64_t n_acc = n_old + n_new_ * (blk + 1) / nb;
      for (int64_t i = 0; i < n_acc; ++i) s.score[i] += acc[i] * inv_g;
    }
  }
}

void HeadKvCache::route_head(HeadStore& s) {
  // Candidates: kept tokens that are neither sink (pos < S) nor recent (pos >= n_past - L).
  const int64_t hi = n_past_ - p_.local;
  const int64_t first = std::lower_bound(s.pos.begin(), s.pos.end(), p_.sink) - s.pos.begin();
  const int64_t n = s.n();
  cand_.clear();
  for (int64_t i = first; i < n && s.pos[i] < hi; ++i)
    cand_.push_back(
        {s.pos[i], s.score[i], s.pos[i] < routed_below_ ? Tier::kFull : Tier::kLocal, false});
  if (cand_.empty()) return;
  policy_->route(cand_, rbudget_, &plan_);
  // Compact in place, keeping position order. Only kEvicted removes a token (H2OPolicy never
  // returns kQuant; this cache has no low-bit tier).
  const int d = shape_.head_dim;
  const int64_t n_cand = int64_t(cand_.size());
  int64_t w = first;
  for (int64_t r = first; r < n; ++r) {
    if (r - first < n_cand && plan_[r - first] == Tier::kEvicted) {
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
}

void HeadKvCache::route_now() {
  const size_t steady = size_t(steady_tokens_), d = size_t(shape_.head_dim);
  for (HeadStore& s : heads_) {
    route_head(s);
    // After a prefill chunk the vectors hold its peak; give back what decode will not use.
    trim(s.k, steady * d);
    trim(s.v, steady * d);
    trim(s.pos, steady);
    trim(s.score, steady);
  }
  trim(probs_, size_t(shape_.n_kv_heads) * shape_.group() * steady);
  trim(part_, size_t(shape_.n_kv_heads) * steady);
  ++routing_events_;
  steps_since_route_ = 0;
  routed_below_ = std::max<int64_t>(n_past_ - p_.local, 0);
}

void HeadKvCache::commit() {
  const bool chunk = n_new_ > 1;
  n_past_ += n_new_;
  n_new_ = 0;
  ++steps_since_route_;
  // Routing events: after every prefill chunk and every Ω decode steps (as TieredKvCache).
  if (chunk || steps_since_route_ >= p_.route_every) route_now();
}

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
}

size_t HeadKvCache::bytes_in_use(int layer) const {
  size_t n = 0;
  for (int h = 0; h < shape_.n_kv_heads; ++h) n += size_t(head(layer, h).n());
  return n * m_;
}

size_t HeadKvCache::bytes_held() const {
  size_t b = heads_.capacity() * sizeof(HeadStore);
  for (const HeadStore& s : heads_)
    b += (s.k.capacity() + s.v.capacity()) * sizeof(uint16_t) + s.pos.capacity() * sizeof(int32_t) +
         s.score.capacity() * sizeof(double);
  b += probs_.capacity() * sizeof(float) + part_.capacity() * sizeof(double) +
       cand_.capacity() * sizeof(RoutingCandidate) + plan_.capacity() * sizeof(Tier);
  return b;
}

std::string HeadKvCache::describe() const {
  return fmt::format(
      "{} (budget {:.1f} KiB/layer, per head: {} sink + {} recent + {} heavy tokens of {} B, "
      "Ω {}, {})",
      policy_->name(), budget_total_ / 1024.0, p_.sink, p_.local, heavy_capacity_, m_,
      p_.route_every, p_.dtype == HalfType::kF16 ? "f16" : "bf16");
}

void HeadKvCache::position_tiers(int layer, int kv_head, std::vector<Tier>* out) const {
  out->assign(size_t(n_past_), Tier::kEvicted);
  for (int32_t p : head(layer, kv_head).pos)
    if (p < n_past_) (*out)[size_t(p)] = Tier::kFull;
  for (int64_t p = 0; p < std::min<int64_t>(p_.sink, n_past_); ++p)
    (*out)[size_t(p)] = Tier::kLocal;
  for (int64_t p = std::max<int64_t>(n_past_ - p_.local, 0); p < n_past_; ++p)
    (*out)[size_t(p)] = Tier::kLocal;
}

std::vector<int32_t> HeadKvCache::kept_positions(int layer, int kv_head) const {
  return head(layer, kv_head).pos;
}

double HeadKvCache::token_score(int layer, int kv_head, int32_t pos) const {
  const HeadStore& s = head(layer, kv_head);
  const auto it = std::lower_bound(s.pos.begin(), s.pos.end(), pos);
  if (it == s.pos.end() || *it != pos) return std::numeric_limits<double>::quiet_NaN();
  return s.score[size_t(it - s.pos.begin())];
}

}  // namespace qevict
