// KvShape validation and the begin() check shared by the caches.
#include "kvcache/kv_cache.h"

#include <fmt/format.h>

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

}  // namespace qevict
