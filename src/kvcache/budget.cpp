// compute_budget (see budget.h): the only place where budget bytes are derived.
#include "kvcache/budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvcache/policies/routing_policy.h"

namespace qevict {

RoutingBudget KvBudget::routing() const {
  RoutingBudget r;
  if (kind == CacheKind::kPerHead) {
    r.full_bytes = size_t(std::max<int64_t>(head_heavy, 0)) * head_token_bytes;
    r.window_full = head_token_bytes;
    return r;
  }
  r.full_bytes = size_t(capacity_full) * window_full;
  r.quant_bytes = size_t(capacity_quant) * window_quant;
  r.window_full = window_full;
  r.window_quant = window_quant;
  r.strict_ledger = strict_ledger;
  return r;
}

size_t KvBudget::staged_prompt_bytes(int64_t n_prompt, int64_t chunk) const {
  const int64_t windows = (std::max<int64_t>(n_prompt - sink, 0) + window - 1) / window;
  const size_t staged = std::max(hist_bytes, size_t(windows) * window_quant);
  return sink_bytes + local_bytes + staged +
         size_t((chunk + window - 1) / window + 1) * window_full;
}

std::string KvBudget::floor_note() const {
  if (!floored) return "";
  return fmt::format(
      "budget floored at {} B/layer: the fraction gave {}, below the {}", total, requested,
      kind == CacheKind::kPerHead ? "sink, recent and decode tokens and one heavy token per KV head"
                                  : "sink and local region and one window of history");
}

std::string KvBudget::floor_tag() const {
  return floored ? fmt::format(" (floored; the fraction gave {:.1f} KiB)", requested / 1024.0) : "";
}

std::string KvBudget::describe() const {
  const std::string note = floored ? "; " + floor_note() : "";
  switch (kind) {
    case CacheKind::kFull:
      return "no budget";
    case CacheKind::kWindowed:
      return fmt::format(
          "budget {} B/layer = sink {} + local {} ({} windows) + history {} (K_f {} x M_f {} B, "
          "K_q {} x M_q {} B){}",
          total, sink_bytes, local_bytes, local_windows, hist_bytes, capacity_full, window_full,
          capacity_quant, window_quant, note);
    case CacheKind::kQuantized:
      return "no budget (a quantizer's byte point)";
    case CacheKind::kPerHead:
      return fmt::format(
          "budget {} B/layer; per head {} tokens of {} B = {} sink + {} recent + {} heavy{}", total,
          head_capacity, head_token_bytes, sink, local, head_heavy, note);
  }
  return "";
}

namespace {

// The fewest tokens a KV head of a per-head cache can hold: sink + recent + one heavy token
// (H2O's default split gives the recent region half of what the sink leaves: none then).
int64_t min_head_capacity(const KvCacheParams& p) {
  return int64_t(p.sink) + (p.local_half_budget ? 0 : p.local) + 1;
}

// A per-head budget's capacity C from b->total, its split into S + L + K and their bytes.
void split_head_capacity(KvBudget* b, const KvShape& shape, const KvCacheParams& p) {
  const size_t H = size_t(shape.n_kv_heads);
  b->head_capacity = int64_t(b->total / H / b->head_token_bytes);
  // H2O's default: the budget split equally between heavy hitters and recent tokens.
  // (clamped to int: a budget far past the context must not wrap the count; found by review)
  b->local = p.local_half_budget
                 ? int(std::min<int64_t>(std::max<int64_t>(0, b->head_capacity - p.sink) / 2,
                                         std::numeric_limits<int>::max()))
                 : p.local;
  b->head_heavy = b->head_capacity - b->sink - b->local;
  b->sink_bytes = size_t(b->sink) * b->head_token_bytes * H;
  b->local_bytes = size_t(b->local) * b->head_token_bytes * H;
  b->hist_bytes = size_t(std::max<int64_t>(b->head_heavy, 0)) * b->head_token_bytes * H;
}

// Eq. 3: K_f = floor((1-q) B_hist / M_f), K_q = floor(q B_hist / M_q).
void split_history(KvBudget* b, double q) {
  b->capacity_full =
      int64_t(std::floor((1.0 - q) * double(b->hist_bytes) / double(b->window_full)));
  b->capacity_quant = int64_t(std::floor(q * double(b->hist_bytes) / double(b->window_quant)));
}

// The fewest history bytes for which Eq. 3 gives one window in F or Q.
size_t min_history_bytes(const KvBudget& b, double q) {
  double need = std::numeric_limits<double>::infinity();
  if (q < 1.0) need = std::min(need, double(b.window_full) / (1.0 - q));
  if (q > 0.0) need = std::min(need, double(b.window_quant) / q);
  KvBudget t = b;
  t.hist_bytes = size_t(std::ceil(need));
  for (split_history(&t, q); t.capacity_full + t.capacity_quant < 1; split_history(&t, q))
    ++t.hist_bytes;  // the floors of Eq. 3 round a byte or two away from the quotient
  return t.hist_bytes;
}

}  // namespace

QuantLayout quant_layout(const KvCacheParams& p, const KvShape& shape) {
  return QuantLayout{p.bits,        shape.n_kv_heads, shape.head_dim, p.window,
                     p.value_group, p.value_bits,     p.key_meta};
}

Expected<KvBudget> compute_budget(CacheKind kind, const KvShape& shape, int64_t n_ctx,
                                  const KvCacheParams& p) {
  QEVICT_RETURN_IF_ERROR(shape.validate());
  QEVICT_RETURN_IF_ERROR(p.validate());  // callers other than make_kv_cache (the scheduler)
  if (n_ctx <= 0) return Status::error("context size must be positive");
  KvBudget b;
  b.kind = kind;
  b.token_bytes = shape.token_bytes();
  if (kind == CacheKind::kFull) return b;
  if (kind == CacheKind::kQuantized) {
    // Issue 10: quantizers that cannot reach a budget run at the byte points their settings
    // give; a budget would be silently ignored, so it is refused.
    if (p.budget_fraction > 0.0 || p.budget_bytes > 0)
      return Status::error(fmt::format(
          "{} is a quantizer: it keeps every token and holds the bytes its settings give "
          "(--kv-bits, --kv-group, --kv-local); it cannot meet --kv-budget/--kv-budget-bytes, "
          "so run it without one",
          p.policy));
    return b;
  }
  if (p.budget_fraction > 0.0 && p.budget_bytes > 0)
    return Status::error(
        "give the KV budget either as a fraction (--kv-budget) or in bytes (--kv-budget-bytes), "
        "not both");
  const size_t head_token_bytes = size_t(2) * shape.head_dim * sizeof(uint16_t) + sizeof(int32_t);
  const bool by_tokens = kind == CacheKind::kPerHead && p.budget_tokens > 0 &&
                         !(p.budget_fraction > 0.0) && p.budget_bytes <= 0;
  if (!(p.budget_fraction > 0.0) && p.budget_bytes <= 0 && !by_tokens)
    return Status::error(fmt::format(
        "the {} policy needs a budget: --kv-budget FRACTION or --kv-budget-bytes N", p.policy));
  const bool by_fraction = !by_tokens && p.budget_bytes <= 0;
  b.total = by_tokens ? size_t(p.budget_tokens) * shape.n_kv_heads * head_token_bytes
            : p.budget_bytes > 0
                ? size_t(p.budget_bytes)
                : size_t(std::floor(p.budget_fraction * double(n_ctx) * double(b.token_bytes)));
  b.requested = b.total;
  b.sink = p.sink;
  b.window = p.window;
  b.strict_ledger = p.strict_ledger;

  if (kind == CacheKind::kPerHead) {
    if (n_ctx > std::numeric_limits<int32_t>::max())
      return Status::error(fmt::format("context size {} exceeds the int32 positions", n_ctx));
    b.window = 1;
    b.head_token_bytes = head_token_bytes;
    split_head_capacity(&b, shape, p);
    if (b.head_heavy < 1 && by_fraction) {  // floored: one heavy token per head
      b.total = size_t(min_head_capacity(p)) * size_t(shape.n_kv_heads) * b.head_token_bytes;
      b.floored = true;
      split_head_capacity(&b, shape, p);
    }
    if (b.head_heavy < 1)
      return Status::error(fmt::format(
          "budget too small for sink + recent: {} bytes per layer give each of the {} KV heads "
          "{} tokens of {} B, but {} sink + {} recent tokens leave no room for a heavy hitter; "
          "raise --kv-budget-bytes (or give the budget as a fraction with --kv-budget) or lower "
          "--kv-sink/--kv-local",
          b.total, shape.n_kv_heads, b.head_capacity, b.head_token_bytes, b.sink, b.local));
    return b;
  }

  // Windowed.
  if (p.bits == 0) {  // auto: INT4 when it holds the whole context, else INT2
    KvCacheParams p4 = p;
    p4.bits = 4;
    auto b4 = compute_budget(kind, shape, n_ctx, p4);
    if (!b4) return b4.status();
    const int64_t windows = (std::max<int64_t>(n_ctx - p.sink, 0) + p.window - 1) / p.window;
    if (b4->capacity_full + b4->capacity_quant + b4->local_windows >= windows) return b4;
    KvCacheParams p2 = p;
    p2.bits = 2;
    return compute_budget(kind, shape, n_ctx, p2);
  }
  b.bits = p.bits;
  const QuantLayout ql = quant_layout(p, shape);
  QEVICT_RETURN_IF_ERROR(ql.validate());
  if (shape.head_dim > 1024)
    return Status::error("head_dim above 1024 is not supported by the low-bit tier");
  b.local = p.local;
  // Windows that are not yet routed: after an event up to L + ω − 1 positions past the last
  // aged window, then Ω more tokens before the next event routes them (decode routes every Ω
  // steps; the peak is just before it). Reserving ceil((L + Ω − 1)/ω) + 1 windows keeps the
  // budget an invariant between events too, not only right after one.
  b.local_windows = (int64_t(p.local) + p.route_every - 1 + p.window - 1) / p.window + 1;
  b.window_entry = kWindowEntryBytes;
  b.window_full = size_t(p.window) * b.token_bytes + b.window_entry;
  b.window_quant = ql.window_bytes() + b.window_entry;
  b.sink_bytes = size_t(p.sink) * b.token_bytes;
  b.local_bytes = size_t(b.local_windows) * b.window_full;
  const size_t fixed = b.sink_bytes + b.local_bytes;
  if (by_fraction) {  // floored: the fixed regions and one window of history
    const size_t least = fixed + min_history_bytes(b, p.q);
    if (b.total < least) {
      b.total = least;
      b.floored = true;
    }
  }
  if (b.total <= fixed)
    return Status::error(fmt::format(
        "KV budget of {} bytes per layer does not cover the sink ({} tokens) and local region "
        "({} tokens, {} windows of {}): they need {} bytes; raise --kv-budget-bytes (or give "
        "the budget as a fraction with --kv-budget) or lower --kv-sink/--kv-local",
        b.total, p.sink, p.local, b.local_windows, p.window, fixed));
  b.hist_bytes = b.total - fixed;
  split_history(&b, p.q);
  return b;
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
  // A context shorter than the fixed regions still gets a valid split (one heavy token).
  const int64_t least = min_head_capacity(p);
  int64_t held = int64_t(b->total / H / token);
  if (held - slack < least && p.budget_bytes <= 0) {  // a fraction: floored
    held = least + slack;
    b->total = size_t(held) * size_t(H) * token;
    b->floored = true;
  }
  const int64_t cap = std::min<int64_t>(held - slack, std::max(n_ctx, least));
  const int64_t local = p.local_half_budget ? std::max<int64_t>(0, cap - p.sink) / 2 : p.local;
  if (cap - p.sink - local < 1)
    return Status::error(fmt::format(
        "budget too small for {}: {} bytes per layer hold {} tokens of {} B (K, V, position "
        "and the policy's per-token state) per KV head; it needs {} for the decode tokens "
        "between routings (--kv-route-every) + {} sink + {} recent + at least 1 heavy; raise "
        "--kv-budget-bytes (or give the budget as a fraction with --kv-budget)",
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

}  // namespace qevict
