// KIVI's rule (see kivi_policy.h).
#include "kvcache/quantizers/kivi_policy.h"

#include <fmt/format.h>

namespace qevict {

Status KiviConfig::validate(int head_dim) const {
  if (bits != 2 && bits != 4)
    return Status::error(fmt::format("kivi: --kv-bits must be 2 or 4, got {}", bits));
  if (group < 1 || group * bits % 8 != 0)
    return Status::error(fmt::format(
        "kivi: the group (--kv-group) must be a positive multiple of {}, got {}", 8 / bits, group));
  if (head_dim % group != 0)
    return Status::error(fmt::format(
        "kivi: the group (--kv-group {}) must divide head_dim {} (values are grouped by channel)",
        group, head_dim));
  if (residual < group || residual % group != 0)
    return Status::error(fmt::format(
        "kivi: the residual (--kv-local {}) must be a positive multiple of the group {} "
        "(llama_kivi.py:L132)",
        residual, group));
  return Status::ok();
}

size_t kivi_layer_bytes(const KiviConfig& c, int64_t n, int n_kv_heads, int head_dim) {
  const int64_t kq = c.keys_quantized(n), vq = c.values_quantized(n);
  const size_t per_head = size_t(kq / c.group) * c.key_group_bytes(head_dim) +
                          size_t(vq) * c.value_token_bytes(head_dim) +
                          size_t((n - kq) + (n - vq)) * head_dim * 2;
  return per_head * size_t(n_kv_heads);
}

}  // namespace qevict
