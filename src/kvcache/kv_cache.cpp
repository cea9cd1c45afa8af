// KvShape validation, the begin() check shared by the caches, KvReport totals.
#include "kvcache/kv_cache.h"

#include <fmt/format.h>

#include <algorithm>

namespace qevict {

Status KvShape::validate() const {
  if (n_layers <= 0 || n_q_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0)
    return Status::error(
        fmt::format("invalid KV shape: layers {} q_heads {} kv_heads {} head_dim {}", n_layers,
                    n_q_heads, n_kv_heads, head_dim));
  if (n_q_heads % n_kv_heads != 0)
    return Status::error(
        fmt::format("n_q_heads {} is not a multiple of n_kv_heads {}", n_q_heads, n_kv_heads));
  if (rope.n_rot < 0 || rope.n_rot > head_dim || rope.n_rot % 2 != 0)
    return Status::error(
        fmt::format("rope dimension {} must be even and <= head_dim {}", rope.n_rot, head_dim));
  return Status::ok();
}

Status check_begin(int64_t n_past, int64_t n_new, int64_t n_ctx) {
  if (n_new <= 0) return Status::error("a forward call needs at least one token");
  if (n_past + n_new > n_ctx)
    return Status::error(
        fmt::format("context full: {} cached + {} new tokens exceed the context size {} (-c)",
                    n_past, n_new, n_ctx));
  return Status::ok();
}

KvReport quantizer_report(const std::string& policy, const std::string& describe,
                          const KvShape& shape, size_t bytes_held, size_t peak) {
  KvReport r;
  r.policy = policy;
  r.describe = describe;
  r.budget.kind = CacheKind::kQuantized;
  r.budget.token_bytes = shape.token_bytes();
  r.bytes_held = bytes_held;
  r.peak_bytes_held = std::max(peak, bytes_held);
  return r;
}

KvReport routed_report(const std::string& policy, const std::string& describe,
                       const KvBudget& budget, size_t bytes_held, size_t peak,
                       int64_t routing_events, double route_seconds, double route_seconds_decode) {
  KvReport r;
  r.policy = policy;
  r.describe = describe;
  r.budget = budget;
  r.bytes_held = bytes_held;
  r.peak_bytes_held = std::max(peak, bytes_held);
  r.routing_events = routing_events;
  r.route_seconds = route_seconds;
  r.route_seconds_decode = route_seconds_decode;
  return r;
}

}  // namespace qevict

namespace qevict {

KvLayerReport KvReport::total() const {
  KvLayerReport t;
  for (const auto& x : layers) {
    t.windows_full += x.windows_full;
    t.windows_quant += x.windows_quant;
    t.windows_evicted += x.windows_evicted;
    t.windows_local += x.windows_local;
    t.promotions += x.promotions;
    t.demotions += x.demotions;
    t.evictions += x.evictions;
    t.quantizations += x.quantizations;
    t.quantized_units += x.quantized_units;
    t.outliers += x.outliers;
    t.evicted_at_first_routing += x.evicted_at_first_routing;
    t.aged += x.aged;
    t.bytes_sink += x.bytes_sink;
    t.bytes_full += x.bytes_full;
    t.bytes_quant += x.bytes_quant;
    t.bytes_ledger_of_full += x.bytes_ledger_of_full;
    t.bytes_budgeted = std::max(t.bytes_budgeted, x.bytes_budgeted);
    t.bytes_allocated += x.bytes_allocated;
  }
  return t;
}

}  // namespace qevict

namespace qevict {

Status SequenceKvCache::truncate(int64_t n) {
  if (n == n_past()) return Status::ok();
  return Status::error(fmt::format(
      "{} cannot drop tokens [{}, {}): they are no longer all in its full-precision local region",
      describe(), n, n_past()));
}

Status SequenceKvCache::save_state(ByteWriter& w) const {
  (void)w;
  return Status::error(fmt::format("{} cannot write its state", describe()));
}

Status SequenceKvCache::load_state(ByteReader& r) {
  (void)r;
  return Status::error(fmt::format("{} cannot read a saved state", describe()));
}

}  // namespace qevict
